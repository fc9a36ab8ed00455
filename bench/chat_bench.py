"""The chat pipeline against its tokenizer alone, as ratios taken in one run (issue 22).

For each corpus shape (short and long conversations, conversations whose assistant turns carry
a ``reasoning_content``, and conversations that call tools) and tokenizer (a byte-level BPE
trained on the spot with ChatML's special tokens, and Qwen3's real tokenizer with its real
template; the reasoning and tool shapes on Qwen3 alone, whose template writes the reasoning in a
trained ``<think>`` block and the calls in trained ``<tool_call>`` blocks):

* the tokenizer alone: ``encode_batch`` on 2 threads over the conversations *already rendered*
  with the same chat template (the same texts, the same tokens);
* the chat pipeline in-process: ``render_chat`` → ``pack_flat`` (2,048 tokens, ``emit_labels``,
  ``emit_cu_seqlens``) → ``shuffle`` → ``batch`` on the threads runner with 2 workers, tokens
  counted from the batches (padding excluded).

After one untimed run of each (imports, first compilations and caches are not what is
compared), rounds alternate the two. The figure is the median of the per-round ratios of the
pipeline's *steady-state* rate (tokens delivered between 25% and 75% of the run's tokens, as
every steady-state row of ``bench.run``) to the tokenizer's (target ≥ 0.8); the whole-run ratio
(start-up, the fill of 8 lanes' shuffle reservoirs and their drain included) is shown beside it.
The corpora are large enough for the window to be steady: a lane's reservoir holds at most 15%
of its rows (checked, as ``bench.cases.steady_valid`` checks the main workload).
Both run on the memory allocator ``zephon serve`` runs on by default (``--allocator auto``:
mimalloc when installed, with the server's tuning): the process re-executes itself with it
preloaded, as the server does; ``--allocator system`` measures glibc malloc instead. The
allocator changes the ratio: mimalloc makes the tokenizer's own allocations cheaper than the
pipeline's Python (docs/decisions.md,
"The chat figure on the shipped allocator; fewer GIL releases per batch").
Run with ``python -m bench.chat_bench`` (``--publish`` replaces the "Chat pipeline" section of
docs/benchmarks.md and nothing else).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from zephon_server.engine.chat_corpus import (
    CHATML_TEMPLATE,
    generate_conversations,
)
from zephon_server.engine.chat_layout import check_messages
from zephon_server.engine.chat_template import ChatTemplate, find_template
from zephon_server.engine.config import parse_config
from zephon_server.engine.corpus import write_jsonl
from zephon_server.runtime import ALLOCATOR_CHOICES, allocator

from .common import RESULTS, load_tok, machine, tokenizer_only_rate
from .measure import steady_rate
from .workload import runtime

log = logging.getLogger("bench")

SHAPES = {"short": 40, "long": 400, "reasoning": 120, "tools": 120}  # mean words per answer
#: What else a shape's conversations carry (``generate_conversations`` options): a reasoning
#: of about 300 words on every answer, or a tool call before every other answer.
SHAPE_OPTIONS: dict[str, dict[str, Any]] = {
    "reasoning": {"reasoning_words": 300},
    "tools": {"tool_calls": True},
}
#: Shapes measured on Qwen3 alone, whose template writes reasoning and tool calls (the trained
#: BPE's ChatML template writes neither).
QWEN3_SHAPES = ("reasoning", "tools")
#: About 40M, 10M, 10M and 10M tokens: each lane's reservoir holds 3-11% of its rows, and the
#: short corpus's steady window spans about 6 flush periods (:func:`flush_periods`); the others
#: end before a lane's first flush.
CONVERSATIONS = {"short": 192000, "long": 6400, "reasoning": 12800, "tools": 16000}
REAL = Path(__file__).resolve().parents[1] / "build" / "tokenizers"
QWEN3 = REAL / "qwen3" / "tokenizer.json"
#: Llama 3.2's real tokenizer and template, on the short and long shapes: another vocabulary
#: (128k), and a template that writes a dated system turn into every conversation.
LLAMA = REAL / "llama3_2" / "tokenizer.json"
TARGET = 0.8
RUNNER = "threads"
LANES, MAX_LENGTH, SHUFFLE_ROWS = 8, 2048, 64
CHUNK_SIZE, FLUSH_EVERY = 256, 8
#: The trained BPE learns from the first 3,000 of the 24,000 short conversations of seed 11
#: (the tokenizer of every published run since the benchmark began).
BPE_TRAINING = (24000, 3000)
#: Largest share of a lane's rows its shuffle reservoir may hold for a steady-state window.
STEADY_SHARE = 0.15
#: Fewest flush periods the steady window must span when flushes fall inside the run.
STEADY_PERIODS = 4
SECTION = "## Chat pipeline"


def write_corpus(shape: str, quick: bool) -> tuple[Path, list[dict[str, Any]]]:
    """JSONL shards of generated conversations under bench/results (made once per shape)."""
    n = CONVERSATIONS[shape] // (4 if quick else 1)
    options = SHAPE_OPTIONS.get(shape, {})
    convs = generate_conversations(n, seed=11, mean_words=SHAPES[shape], **options)
    root = RESULTS / f"chat-{shape}-{n}"
    if not (root / ".complete").exists():
        root.mkdir(parents=True, exist_ok=True)
        half = len(convs) // 2
        write_jsonl(root / "chat-00000.jsonl", convs[:half])
        write_jsonl(root / "chat-00001.jsonl", convs[half:])
        (root / ".complete").write_text("ok\n")
    return root, convs


def bpe_path() -> Path:
    """Where :func:`trained_bpe` keeps the trained BPE (its directory names what it learned
    from)."""
    corpus, first = BPE_TRAINING
    return RESULTS / f"chat-bpe-{corpus}x{first}" / "tokenizer.json"


def trained_bpe() -> Path:
    """A byte-level BPE (vocab 8,192) with ChatML's special tokens, its config and template,
    trained on the contents of :data:`BPE_TRAINING` (the same tokenizer whatever the corpus
    sizes: training is deterministic)."""
    corpus, first = BPE_TRAINING
    path = bpe_path()
    directory = path.parent
    if not path.exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        trainer = trainers.BpeTrainer(
            vocab_size=8192,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        convs = generate_conversations(corpus, seed=11, mean_words=SHAPES["short"])[:first]
        texts = [m["content"] for c in convs for m in c["messages"]]
        tok.train_from_iterator(texts, trainer)
        directory.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
        config = {"chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>"}
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def rendered_texts(tokenizer: Path, convs: list[dict[str, Any]]) -> list[str]:
    """The conversations rendered with the tokenizer's chat template (not timed)."""
    import datetime

    template = ChatTemplate(find_template(str(tokenizer), None), date=datetime.date(2025, 1, 1))
    # As render_chat reads them (a null content beside tool calls is the empty content).
    return [template.render(check_messages(c["messages"], "messages", 1024)) for c in convs]


def pipeline_config(root: Path, tokenizer: Path) -> dict[str, Any]:
    return {
        "seed": 7,
        "lanes": LANES,
        "chunk_size": CHUNK_SIZE,
        "flush_every_k_chunks": FLUSH_EVERY,
        # Every conversation once, every lane to its own end: the throughput of the whole
        # corpus (with the default, shortest, a corpus of fewer chunks than lanes would cut).
        "end_of_data": "longest",
        "datasets": [{"name": "chat", "path": str(root), "weight": 1.0, "exhaustion": "stop"}],
        "pipeline": [
            {"render_chat": {"tokenizer": str(tokenizer)}},
            {
                "pack_flat": {
                    "max_length": MAX_LENGTH,
                    "emit_labels": True,
                    "emit_cu_seqlens": True,
                    "max_docs_per_row": 64,
                }
            },
            {"shuffle": {"buffer_size": SHUFFLE_ROWS}},
            {"batch": {"microbatch_size": 8}},
        ],
        "execution": {"runner": RUNNER, "workers": 2},
    }


def chat_rate(config: dict[str, Any]) -> tuple[float, float]:
    """Tokens/s of the chat pipeline, every batch consumed in-process (padding excluded):
    over the whole run, and in the steady state (:func:`bench.measure.steady_rate`)."""
    pipe, execution = parse_config(config)
    start = time.perf_counter()
    tokens = 0
    progress: list[tuple[float, int]] = []
    for batch in pipe.run(execution).batches():
        tokens += batch.num_tokens()
        progress.append((time.perf_counter() - start, tokens))
    return tokens / progress[-1][0], steady_rate(progress)


def reservoir_share(tokens: int) -> float:
    """The share of a lane's rows its shuffle reservoir holds, for a corpus of ``tokens``."""
    rows_per_lane = tokens / MAX_LENGTH / LANES
    return SHUFFLE_ROWS / rows_per_lane


def flush_periods(conversations: int) -> float:
    """How many flush periods the steady window (the middle half of the run) spans; 0 when
    no lane reaches a flush before its end.

    Every ``flush_every_k_chunks`` chunks each lane's shuffle reservoir drains at once, and
    the lanes take their chunks in turn, so batches arrive in bursts, one per
    ``LANES * FLUSH_EVERY * CHUNK_SIZE`` conversations. A window spanning one or two bursts
    measures where they fall as much as the rate: on 48,000 short conversations (1.5 periods)
    single rounds ranged from 0.55 to 0.81 and the steady ratio came out below the whole
    run's."""
    period = LANES * FLUSH_EVERY * CHUNK_SIZE
    if conversations / LANES <= FLUSH_EVERY * CHUNK_SIZE:
        return 0.0
    return 0.5 * conversations / period


def steady_problem(share: float, periods: float) -> str:
    """Why a corpus is too small for a steady window ("" when it is not)."""
    if share > STEADY_SHARE:
        return f"reservoirs hold {share:.0%} of a lane's rows"
    if 0 < periods < STEADY_PERIODS:
        return f"the window spans {periods:.1f} flush periods"
    return ""


def tokenizers_of(shape: str) -> dict[str, Path]:
    """The tokenizers a shape is measured with (the real ones when ``make tokenizers`` fetched
    them; the BPE where :func:`trained_bpe` keeps it once trained)."""
    tokenizers = {} if shape in QWEN3_SHAPES else {"BPE 8k (trained)": bpe_path()}
    real = {"Qwen3 (real)": QWEN3}
    if shape not in QWEN3_SHAPES:
        real["Llama 3.2 (real)"] = LLAMA
    for name, path in real.items():
        if path.exists():
            tokenizers[name] = path
        else:
            log.warning("%s missing (make tokenizers): %s left out", path, name)
    return tokenizers


def run(rounds: int, quick: bool, only: str | None = None) -> dict[str, Any]:
    cases: list[dict[str, Any]] = []
    for shape in SHAPES:
        wanted = {
            name: path
            for name, path in tokenizers_of(shape).items()
            if only is None or only.lower() in f"{shape} {name}".lower()
        }
        if not wanted:
            continue
        root, convs = write_corpus(shape, quick)
        for name, tokenizer in wanted.items():
            if tokenizer == bpe_path():
                trained_bpe()  # trained on first use
            texts = rendered_texts(tokenizer, convs)
            tok = load_tok(str(tokenizer))
            share = reservoir_share(sum(map(len, tok.encode_batch(texts))))
            periods = flush_periods(len(convs))
            if steady_problem(share, periods):
                log.warning("%s: %s: not steady", shape, steady_problem(share, periods))
            config = pipeline_config(root, tokenizer)
            ratios, wholes, alone, chat = [], [], [], []
            chat_rate(config)  # warm-up, not counted: imports, first compiles, caches
            tokenizer_only_rate(tok, texts, 2)
            for r in range(rounds):
                got: dict[str, Any] = {}
                for what in ("alone", "chat") if r % 2 == 0 else ("chat", "alone"):
                    got[what] = (
                        tokenizer_only_rate(tok, texts, 2) if what == "alone" else chat_rate(config)
                    )
                whole, steady = got["chat"]
                alone.append(got["alone"])
                chat.append(steady)
                ratios.append(steady / got["alone"])
                wholes.append(whole / got["alone"])
                log.info(
                    "%s, %s: round %d ratio %.3f (whole run %.3f)",
                    shape,
                    name,
                    r,
                    ratios[-1],
                    wholes[-1],
                )
            cases.append(
                {
                    "shape": shape,
                    "conversations": len(convs),
                    "tokenizer": name,
                    "ratio": statistics.median(ratios),
                    "rounds": ratios,
                    "whole_run_ratio": statistics.median(wholes),
                    "reservoir_share": share,
                    "flush_periods": periods,
                    "alone_tokens_s": statistics.median(alone),
                    "chat_tokens_s": statistics.median(chat),
                }
            )
    return {
        "machine": machine(),
        "allocator": allocator.current_name(),
        "rounds": rounds,
        "quick": quick,
        "cases": cases,
    }


def markdown(result: dict[str, Any], provenance: str) -> str:
    rows = [
        SECTION,
        "",
        provenance,
        "",
        f"Memory allocator: {allocator_words(result.get('allocator', 'glibc'))}.",
        "",
        "Tokens/s of the chat pipeline (`render_chat` → `pack_flat` 2,048 with `emit_labels` and "
        "`emit_cu_seqlens` → `shuffle` → `batch` 8, threads x2, in-process) over tokens/s of its "
        "tokenizer alone (`encode_batch`, 2 threads) on the same conversations already rendered "
        "with the same template. The chat rate is the steady state (tokens delivered between "
        "25% and 75% of the run's tokens, as the other steady-state rows); the whole run "
        "(start-up, and the fill and drain of 8 lanes' shuffle reservoirs, each holding the "
        "share of its lane's rows shown) is beside it. Every "
        f"{FLUSH_EVERY} chunks of {CHUNK_SIZE} conversations a lane's reservoir drains, so "
        "batches arrive in bursts; the steady window spans the number of these flush periods "
        f"shown (at least {STEADY_PERIODS} when a lane flushes before its end; 0: none does). "
        "Medians of "
        f"{result['rounds']} alternating rounds after one untimed run of each. Target ≥ {TARGET}. "
        "Shapes: short and long answers (about 40 and 400 words); reasoning (120-word answers, "
        "each with a 300-word `reasoning_content`, trained where Qwen3's template writes it); "
        "tools (120-word answers, every other one after a tool call and the tool's answer). "
        "Tokenizers: a byte-level BPE of 8k tokens trained on the spot with ChatML's template, "
        "and the real Qwen3 and Llama 3.2 tokenizers with their own templates (Llama 3.2's "
        "writes a dated system turn into every conversation); reasoning and tools on Qwen3 "
        "alone, whose template writes both.",
        "",
        "| conversations | tokenizer | chat / tokenizer alone (steady state) | rounds "
        "| whole run | reservoir / lane | flush periods in window | tokenizer alone | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in result["cases"]:
        rounds = ", ".join(f"{x:.2f}" for x in c["rounds"])
        verdict = "meets" if c["ratio"] >= TARGET else "misses"
        problem = steady_problem(c["reservoir_share"], c.get("flush_periods", 0.0))
        if problem:
            verdict += f" (not steady: {problem})"
        rows.append(
            f"| {c['shape']} ({c['conversations']:,}) | {c['tokenizer']} | {c['ratio']:.3f} | "
            f"{rounds} | {c['whole_run_ratio']:.3f} | {c['reservoir_share']:.0%} | "
            f"{c.get('flush_periods', 0.0):.1f} | "
            f"{c['alone_tokens_s'] / 1e3:,.0f}k tokens/s | {verdict} |"
        )
    return "\n".join(rows) + "\n"


def allocator_words(name: str) -> str:
    """The markdown's words for the allocator a run measured."""
    if name == "glibc":
        return (
            "glibc malloc (`--allocator system`, or no mimalloc installed; `zephon serve` "
            "preloads mimalloc when it is installed)"
        )
    return f"{name}, preloaded with the server's tuning, as `zephon serve` runs by default"


def replace_section(page: str, section: str) -> str:
    """``page`` with its chat section replaced (added before ``## Other figures`` if absent)."""
    lines = page.split("\n")
    new = [*section.rstrip("\n").split("\n"), ""]
    start = next((i for i, line in enumerate(lines) if line == SECTION), None)
    if start is None:
        at = next((i for i, line in enumerate(lines) if line == "## Other figures"), len(lines))
        return "\n".join([*lines[:at], *new, *lines[at:]])
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join([*lines[:start], *new, *lines[end:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chat_bench", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a quarter of the conversations")
    parser.add_argument("--publish", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument(
        "--only",
        metavar="WORDS",
        help="measure only the cases whose shape and tokenizer name contain WORDS (e.g. "
        "'llama', 'short bpe'); cannot be published",
    )
    parser.add_argument(
        "--allocator",
        choices=ALLOCATOR_CHOICES,
        default="auto",
        help="the memory allocator to measure on, as zephon serve's flag (default: auto, the "
        "server's default; the process re-executes itself to preload it)",
    )
    args = parser.parse_args(argv)
    if args.only and args.publish:
        parser.error("--only measures part of the section: it cannot be published")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # Run on the allocator the server would (re-executing this command line to preload it);
    # called as a function (tests), the process is not re-executed.
    allocator.ensure_allocator(args.allocator, sys.orig_argv if argv is None else None)
    runtime().apply()  # the process tuning `zephon serve` runs with (the threads run here)
    result = run(args.rounds, args.quick, args.only)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "chat.json").write_text(json.dumps(result, indent=1) + "\n")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    provenance = (
        f"`python -m bench.chat_bench --rounds {args.rounds}"
        + (f" --allocator {args.allocator}" if args.allocator != "auto" else "")
        + f"` on {stamp}, {result['machine']}."
    )
    text = markdown(result, provenance)
    print(text)
    if args.publish:
        page = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
        page.write_text(replace_section(page.read_text(), text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
