"""The persisted shard index: a warm start reads no shard, a changed shard is re-indexed, a damaged
entry or catalog is rebuilt with a warning, concurrent writers never corrupt an entry, multi-
frame zstd shards are read frame by frame, and open line indexes are bounded: the tests that need
a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_shard_index.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zephon_server.engine.index_dir import IndexDir
from zephon_server.engine.shard_index import (
    ShardIndex,
)

pytestmark = pytest.mark.timeout(60)


WRITER = """
import sys
import numpy as np
from zephon_server.engine.index_dir import IndexDir
from zephon_server.engine.shard_index import ShardIndex

index = ShardIndex(IndexDir(sys.argv[1]))
starts = np.arange(0, 8 * 200_001, 8, dtype=np.int64)  # a 1.6 MB entry
print("ready", flush=True)
sys.stdin.readline()
for _ in range(int(sys.argv[2])):
    index.save("/data/shard.jsonl", "jsonl", "size=1 mtime_ns=1", 200_000, {"starts": starts})
"""


@pytest.mark.service
@pytest.mark.timeout(120)
def test_two_processes_writing_the_same_entry_never_corrupt_it(tmp_path: Path) -> None:
    """Two writer processes save the same 1.6 MB entry over and over while this process
    reads it: every read finds a complete, valid entry (atomic rename), never a torn one."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "index"), "60"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for w in writers:
        assert w.stdout is not None and w.stdout.readline().strip() == "ready"
    for w in writers:
        assert w.stdin is not None
        w.stdin.write("go\n")
        w.stdin.flush()
    index = ShardIndex(IndexDir(str(tmp_path / "index")))
    reads = 0
    while any(w.poll() is None for w in writers):
        entry = index.load("/data/shard.jsonl", "jsonl", "size=1 mtime_ns=1")
        if entry is not None:
            assert entry.rows == 200_000 and int(entry.arrays["starts"][-1]) == 1_600_000
            reads += 1
    assert [w.wait(30) for w in writers] == [0, 0]
    assert index.corrupt == 0 and reads > 0
    assert not list((tmp_path / "index").rglob("*.tmp"))  # every temporary file renamed


RSS = """
import json, sys
from zephon_server.engine.datasets import DatasetSpec
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline

pipe = Pipeline([DatasetSpec("web", sys.argv[1], 1.0)], lanes=2)
pipe.tokenize(tokenizer="byte").batch(microbatch_size=2)
plan = pipe.plan(ExecutionConfig(runner="inline", index_dir=sys.argv[2]))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"rows": plan.datasets[0].num_rows, "hwm_kb": int(status["VmHWM"].split()[0])}))
"""


def _resolve_rss(data: Path, index_dir: Path, script: Path) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(script), str(data), str(index_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.service
@pytest.mark.timeout(180)
def test_memory_after_a_warm_start_does_not_grow_with_the_rows(tmp_path: Path) -> None:
    """20 shards of 10,000 rows against 20 shards of 100,000 rows (16 MB of row offsets more):
    a process resolving them over a warm index peaks at the same memory."""
    script = tmp_path / "rss.py"
    script.write_text(textwrap.dedent(RSS))
    peaks = {}
    for rows in (10_000, 100_000):
        data = tmp_path / f"rows{rows}"
        data.mkdir()
        line = b'{"text":"x"}\n'
        for i in range(20):
            (data / f"part-{i:03d}.jsonl").write_bytes(line * rows)
        index_dir = tmp_path / f"index{rows}"
        assert _resolve_rss(data, index_dir, script)["rows"] == 20 * rows  # cold: builds
        warm = [_resolve_rss(data, index_dir, script) for _ in range(2)]
        peaks[rows] = min(w["hwm_kb"] for w in warm)
    growth_mb = (peaks[100_000] - peaks[10_000]) / 1024
    assert growth_mb < 6, peaks  # the offsets alone would be 14.4 MB more
