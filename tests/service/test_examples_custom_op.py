"""The custom operator example of docs/custom-operators.md runs and is runner-independent."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

from zephon_server.engine.execution import ExecutionConfig

ROOT = Path(__file__).resolve().parents[2]


def load_example():
    spec = importlib.util.spec_from_file_location(
        "custom_operator", ROOT / "examples" / "custom_operator.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_operator"] = module
    spec.loader.exec_module(module)
    return module


def test_custom_operator_is_deterministic_and_drops_duplicates(tmp_path):
    from zephon_server.engine.corpus import write_jsonl
    from zephon_server.engine.datasets import DatasetSpec
    from zephon_server.engine.pipeline import Pipeline

    example = load_example()
    texts = [f"document {i % 7}" for i in range(60)]  # many repeats
    write_jsonl(tmp_path / "d" / "a.jsonl", [{"text": t} for t in texts])

    def run(ex):
        pipe = Pipeline(
            [DatasetSpec("d", str(tmp_path / "d"), 1)],
            lanes=2,
            chunk_size=10,
            flush_every_k_chunks=2,
        )
        pipe.decode_text().apply(example.DedupeWithinEpoch()).tokenize().batch(
            microbatch_size=2, drop_last=False
        )
        r = pipe.run(ex)
        batches = [(b.lane_id, b.seq, b.chain_digest) for b in r.batches()]
        return batches, r.stats()["tombstones"]

    want, tombstones = run(ExecutionConfig(runner="inline"))
    assert tombstones["duplicate"] > 0
    assert run(ExecutionConfig(runner="threads", workers=3)) == (want, tombstones)


def test_custom_operator_runs_from_the_cli(tmp_path):
    env_dir = tmp_path / "data"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "zephon_server.cli",
            "dump",
            "--pipeline",
            str(ROOT / "examples" / "custom_operator.py") + ":build",
            "--batches",
            "2",
            "--format",
            "digest",
            "--runner",
            "threads",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**__import__("os").environ, "ZEPHON_DATA_DIR": str(env_dir)},
    )
    assert res.returncode == 0, res.stderr
    assert Counter(line.split()[0] for line in res.stdout.splitlines()) == {
        str(lane): 2 for lane in range(4)
    }
