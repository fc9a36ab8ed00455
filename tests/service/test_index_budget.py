"""The index directory's byte budget (issue 20 leftovers): the tests that need a subprocess
or a socket (a reader process while another prunes; an object-store index on the S3 server).

The hermetic tests of the same topic are in ``tests/unit/test_index_budget.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.unit.test_index_budget import READER, _identity_fmt, resolve, write_dataset
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.index_budget import prune
from zephon_server.engine.index_dir import IndexDir, open_index_dir
from zephon_server.engine.shard_index import EntryKey, ShardIndex, encode_entry
from zephon_server.engine.shards import ShardCache

pytestmark = pytest.mark.timeout(60)


@pytest.mark.service
def test_a_server_process_keeps_serving_while_another_prunes_everything(tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    path = write_dataset(tmp_path / "data", "web")
    resolve(index_dir, path)  # indexed beforehand: the reader starts warm
    script = tmp_path / "reader.py"
    script.write_text(READER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(index_dir), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    report = prune(IndexDir(str(index_dir)), {}, max_bytes=0)
    assert (report.catalogs_removed, report.entries_removed) == (1, 3)
    out, _ = proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0 and out.split() == ["same", "0"]  # its mapped entries


@pytest.mark.service
@pytest.mark.timeout(120)
def test_an_object_store_index_is_pruned_through_the_same_code(s3, tmp_path: Path) -> None:
    from tests.service.test_storage_s3 import options
    from zephon_server.engine.storage.options import StorageOptions
    from zephon_server.engine.storage.store import configure_bucket

    bucket = s3.bucket(f"t-{uuid.uuid4().hex[:16]}")
    root = f"s3://{bucket}/zephon-index"
    configure_bucket(root + "/", StorageOptions.from_mapping(options(s3.endpoint)), "test")
    store = open_index_dir(root)
    assert store is not None and store.persistent
    old, new = (write_dataset(tmp_path / "data", n) for n in ("old", "new"))
    for path in (old, new):
        cache = ShardCache(index=ShardIndex(store))
        resolve_datasets([DatasetSpec("d", str(path), 1.0)], cache=cache)
    gone = EntryKey("/gone/x.jsonl", "size=9 mtime_ns=1", "jsonl")
    store.put_atomic(gone.name, encode_entry(gone, 1, {}))
    blobs = {b.name for b in store.blobs()}
    assert gone.name in blobs and len(blobs) == 9
    current = ShardCache(index=ShardIndex(store))
    resolve_datasets([DatasetSpec("d", str(new), 1.0)], cache=current)  # a warm start: pins
    # Orphans first: under a budget that only needs the orphan gone, the catalogs stay.
    total = sum(b.size for b in store.blobs())
    report = prune(store, current.index.pinned(), max_bytes=total - 1, grace=0)
    assert (report.orphans_removed, report.catalogs_removed) == (1, 0)
    report = prune(store, current.index.pinned(), max_bytes=0, grace=0)
    assert (report.catalogs_removed, report.entries_removed) == (1, 3) and report.over_budget
    left = {b.name for b in store.blobs()}
    assert left == set(current.index.pinned()) | {
        EntryKey(str(new / f"part-{i}.jsonl"), *_identity_fmt(new / f"part-{i}.jsonl")).name
        for i in range(3)
    }
