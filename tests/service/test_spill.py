"""Large compressed shards (issue 20 leftovers): the test that needs a socket (a large
compressed object streamed from the S3 server into a spill file).

The hermetic tests of the same topic are in ``tests/unit/test_spill.py``.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pytest

from tests.unit.test_spill import MIB, write_formats
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.shards import ShardCache
from zephon_server.engine.spill import SpillDir

pytestmark = pytest.mark.timeout(120)


@pytest.mark.service
def test_a_large_compressed_object_is_streamed_not_held_whole(s3, tmp_path: Path) -> None:
    import uuid

    from tests.service.test_storage_s3 import options

    noise = random.Random(5)
    lines = [  # hard to compress: the object is several 8 MiB parts
        json.dumps({"text": f"doc {i} {noise.getrandbits(2400):x}"}).encode() for i in range(60_000)
    ]
    paths = write_formats(tmp_path / "data", lines)
    bucket = s3.bucket(f"t-{uuid.uuid4().hex[:16]}")
    client = s3.client()
    client.put_object(Bucket=bucket, Key="big.jsonl.gz", Body=paths["jsonl.gz"].read_bytes())
    assert paths["jsonl.gz"].stat().st_size > 20 * MIB  # three 8 MiB parts
    spec = DatasetSpec(
        "d", f"s3://{bucket}/big.jsonl.gz", 1.0, storage_options=options(s3.endpoint)
    )
    cache = ShardCache(spill=SpillDir(str(tmp_path / "spill")), spill_threshold=MIB)
    tracemalloc.start()
    try:
        (ds,) = resolve_datasets([spec], cache=cache)
        got = cache.read_rows(ds.shards[0], [59_999, 0, 12_345], "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ds.num_rows == len(lines) and got == [lines[59_999], lines[0], lines[12_345]]
    content = paths["jsonl"].stat().st_size
    compressed = paths["jsonl.gz"].stat().st_size
    assert content > 32 * MIB
    # A part of the object at a time (two while one replaces the other) and a decoder
    # buffer: neither the content nor the whole object.
    assert peak < 20 * MIB < compressed < content, (peak, compressed, content)
    assert cache.stats()["spills"] == 1 and cache.stats()["decompressions"] == 1
