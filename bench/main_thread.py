"""Main thread against a worker thread: CPU per token of the same tokenizer calls, in one run.

``python -m bench.main_thread [--workload bench/results/run/workload.json] [--rounds 3]``
encodes the fixed work's first texts in calls of 64, alternately from the main thread and from
a worker thread, and prints each one's thread CPU seconds per million tokens and their ratio.
On the 2-core benchmark machine the main thread's calls took 1.07-1.34x the CPU (median of 3
rounds, several runs). The cause is not established: it is not glibc's arena (with
``MALLOC_ARENA_MAX=1`` both threads share the main arena and the gap stays), nor page faults
or malloc trimming.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from zephon_server.engine.tokenizer import load_tokenizer

from .common import RESULTS
from .workload import Workload, fixed_work_texts


def cpu_per_mtok(tok: object, groups: list[list[str]]) -> float:
    """Thread CPU seconds per million tokens of encoding ``groups`` on the calling thread."""
    started, tokens = time.thread_time(), 0
    for group in groups:
        tokens += sum(len(ids) for ids in tok.encode_batch(group))  # type: ignore[attr-defined]
    return (time.thread_time() - started) / tokens * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.main_thread", description=__doc__)
    parser.add_argument("--workload", default=str(RESULTS / "run" / "workload.json"))
    parser.add_argument("--texts", type=int, default=12_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    work = Workload(**json.loads(Path(args.workload).read_text()))
    texts = fixed_work_texts(work)[: args.texts]
    tok = load_tokenizer(work.tokenizer)
    tok.encode_batch(texts[:8])
    groups = [texts[i : i + 64] for i in range(0, len(texts), 64)]
    ratios = []
    for rnd in range(args.rounds):
        worker: list[float] = []
        thread = threading.Thread(
            target=lambda out: out.append(cpu_per_mtok(tok, groups)), args=(worker,)
        )
        thread.start()
        thread.join()
        main_cpu = cpu_per_mtok(tok, groups)
        ratios.append(main_cpu / worker[0])
        print(
            f"round {rnd + 1}: main thread {main_cpu:.3f}, worker thread {worker[0]:.3f} "
            f"CPU s per M tokens; main / worker {ratios[-1]:.2f}"
        )
    print(f"median main / worker: {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
