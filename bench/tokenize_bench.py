"""Engine throughput against the tokenizer alone, as ratios taken in one run.

For the byte tokenizer and a BPE tokenizer trained on the spot: tokenizer-only tokens/s with
1 and 2 threads on the same texts, then decode → tokenize → batch(8) through the engine
in-process with the inline runner and the threads runner with 1 and 2 workers. Run with
``make bench`` (or ``python -m bench.tokenize_bench --docs N``).
"""

from __future__ import annotations

import argparse
import logging

from zephon_server.engine.corpus import sample_corpus_specs
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline

from .common import (
    best_of,
    bpe_tokenizer,
    corpus,
    corpus_texts,
    load_tok,
    machine,
    pipeline_rate,
    save,
    table,
    tokenizer_only_rate,
)

CONFIGS = [("inline", 1), ("threads", 1), ("threads", 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=4000, help="documents per dataset (x3)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure (best kept)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    root = corpus(args.docs)
    texts = corpus_texts(root)
    results: dict[str, dict[str, float]] = {}
    rows = []
    for name, spec in (("byte", "byte"), ("bpe", bpe_tokenizer(texts))):
        tok = load_tok(spec)
        base1 = best_of(args.repeat, lambda tok=tok: tokenizer_only_rate(tok, texts, 1))
        base2 = best_of(args.repeat, lambda tok=tok: tokenizer_only_rate(tok, texts, 2))
        figures = {"tokenizer_only_1": base1, "tokenizer_only_2": base2}
        for runner, workers in CONFIGS:
            pipe = (
                Pipeline(sample_corpus_specs(root), seed=1, lanes=8, chunk_size=256)
                .decode_text()
                .tokenize(tokenizer=spec, add_eos=False)
                .batch(microbatch_size=8)
            )
            ex = ExecutionConfig(runner=runner, workers=workers)
            rate, _ = best_of(args.repeat, lambda pipe=pipe, ex=ex: pipeline_rate(pipe, ex))
            figures[f"{runner}_{workers}"] = rate
        results[name] = figures
        for key, rate in figures.items():
            rows.append([name, key, f"{rate / 1e6:.2f}", f"{rate / base2:.2f}"])
    print(f"\nMachine: {machine()}; {len(texts)} documents\n")
    print(table(rows, ["tokenizer", "configuration", "Mtokens/s", "ratio to tokenizer-only x2"]))
    for name, figures in results.items():
        ratio = figures["threads_2"] / figures["tokenizer_only_2"]
        verdict = "meets" if ratio >= 0.85 else "MISSES"
        print(f"{name}: threads x2 / tokenizer-only x2 = {ratio:.2f} ({verdict} the 0.85 target)")
    save("tokenize", {"machine": machine(), "documents": len(texts), "results": results})


if __name__ == "__main__":
    main()
