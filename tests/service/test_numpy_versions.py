"""The data order does not depend on numpy: one pipeline under numpy 1.x and 2.x, same output.

The system interpreter has numpy 2.x; ``make numpy-venvs`` (which ``make test`` runs) creates
``build/numpy1-venv``, a virtual environment over the system packages with numpy 1.26 (and a
pyarrow that runs on it). Both interpreters run ``zephon dump`` from this checkout's sources on
the same corpus: two datasets (JSONL and Parquet, shards above and below the permutation's
small size, one repeating past its first pass, one stopping), four lanes, a shuffle; every
batch (tensors, provenance rows, digests) must be identical, with numpy's random generators
unusable in both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zephon_server.engine.corpus import write_parquet

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
NUMPY1_PYTHON = ROOT / "build" / "numpy1-venv" / "bin" / "python"

# Runs the CLI after making numpy's random generators unusable: the order must not come from
# them (the versions agree today only by chance; numpy does not promise to keep its streams).
DRIVER = """
import json, sys
import numpy, zephon_server
from zephon_server import cli

def refuse(*args, **kwargs):
    raise RuntimeError("the pipeline used numpy.random")

for name in ("Generator", "PCG64", "SeedSequence", "default_rng", "permutation", "shuffle"):
    setattr(numpy.random, name, refuse)
print(json.dumps({"numpy": numpy.__version__, "zephon": zephon_server.__file__}), flush=True)
sys.exit(cli.main(sys.argv[1:]))
"""


def text(dataset: str, shard: int, row: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    return " ".join(words[(row * 7 + shard + i) % 8] for i in range(3 + row % 11)) + (
        f" {dataset} {shard} {row}"
    )


def write_corpus(root: Path) -> Path:
    """JSONL shards of 300, 40 and 7 rows (repeating) and Parquet of 260 and 90 (stopping)."""
    web, books = root / "web", root / "books"
    web.mkdir(parents=True)
    books.mkdir()
    for shard, rows in enumerate((300, 40, 7)):
        lines = [json.dumps({"text": text("web", shard, r)}) for r in range(rows)]
        (web / f"part-{shard}.jsonl").write_text("\n".join(lines) + "\n")
    for shard, rows in enumerate((260, 90)):
        records = [{"text": text("books", shard, r)} for r in range(rows)]
        write_parquet(books / f"part-{shard}.parquet", records, row_group_size=64)
    cfg = {
        "seed": 2026,
        "lanes": 4,
        "chunk_size": 16,
        "flush_every_k_chunks": 2,
        "datasets": [
            {"name": "web", "path": str(web), "weight": 0.6, "exhaustion": "repeat"},
            {"name": "books", "path": str(books), "weight": 0.4},
        ],
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": "byte"}},
            {"shuffle": {"buffer_size": 8}},
            {"batch": {"microbatch_size": 16}},
        ],
        "execution": {"runner": "inline"},
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def dump(python: Path | str, config: Path) -> tuple[dict[str, str], list[dict]]:
    """(numpy version and zephon_server path, the dumped batches) under ``python``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "server"), str(ROOT / "client")]),
    }
    args = ["dump", "--config", str(config), "--format", "json", "--batches", "16"]
    res = subprocess.run(
        [str(python), "-c", DRIVER, *args], capture_output=True, text=True, env=env, timeout=100
    )
    assert res.returncode == 0, f"{python}: {res.stderr[-3000:]}"
    first, *rest = res.stdout.splitlines()
    return json.loads(first), [json.loads(line) for line in rest]


def test_the_same_batches_under_numpy_1_and_numpy_2(tmp_path):
    if not NUMPY1_PYTHON.exists():
        pytest.fail(
            f"{NUMPY1_PYTHON} is missing: run `make numpy-venvs` (`make test` does) to create "
            "the numpy 1.x environment this test compares with"
        )
    config = write_corpus(tmp_path)
    info2, batches2 = dump(sys.executable, config)
    info1, batches1 = dump(NUMPY1_PYTHON, config)
    assert info1["numpy"].startswith("1."), info1
    assert info2["numpy"].startswith("2."), info2
    for info in (info1, info2):  # this checkout's engine, not an installed one
        assert Path(info["zephon"]).resolve().is_relative_to(ROOT / "server"), info
    assert len(batches2) == 4 * 16
    assert batches1 == batches2
    # The run covers a second pass of the repeating dataset and the end of the stopping one.
    docs = {tuple(span[:4]) for b in batches2 for row in b["rows"] for span in row}
    assert max(p for d, _, _, p in docs if d == 0) >= 1
    assert len({(s, r) for d, s, r, _ in docs if d == 1}) == 260 + 90
