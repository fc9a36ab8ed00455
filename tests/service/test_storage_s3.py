"""Object-store shards against a real S3-protocol server (moto, on loopback): listing, every
format byte-identical to local disk, ranged reads, retries and their budget, rewritten
objects, and start-up errors. Faults come from an HTTP fault proxy in front of the server.

In-process tests reach the server through each dataset's ``storage_options`` (so this
process's environment stays untouched); ``test_storage_service.py`` uses the standard AWS
environment variables with real ``zephon`` subprocesses.
"""

from __future__ import annotations

import gzip
import json
import logging
import uuid
from pathlib import Path

import pytest

from tests.support.http_fault_proxy import HttpFaultProxy
from tests.support.s3_server import ACCESS_KEY, REGION, SECRET_KEY
from zephon_server.engine.corpus import sample_corpus_specs, write_jsonl, write_parquet
from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.errors import ConfigError, DataError, ShardChanged
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.pipeline import Pipeline, fingerprint, fingerprint_document
from zephon_server.engine.shards import ShardCache
from zephon_server.engine.storage import open_store, storage_stats
from zephon_server.engine.storage.retry import StorageRequestError
from zephon_server.engine.storage.shard_io import BLOCK

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]

INLINE = ExecutionConfig(runner="inline")
MIB = 1 << 20


def options(endpoint: str, **extra) -> dict:
    """storage_options that reach ``endpoint`` with the test credentials, quick retries."""
    return {
        "endpoint_url": endpoint,
        "region": REGION,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "retry_base_s": 0.001,
        "retry_cap_s": 0.01,
        **extra,
    }


def new_bucket(s3, **kw) -> str:
    return s3.bucket(f"t-{uuid.uuid4().hex[:16]}", **kw)


def digests(specs, lanes=2, execution=INLINE):
    pipe = Pipeline(specs, seed=11, lanes=lanes, chunk_size=16, flush_every_k_chunks=2)
    pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=4)
    out: dict[int, list[str]] = {}
    for batch in pipe.run(execution).batches():
        out.setdefault(batch.lane_id, []).append(batch.chain_digest.hex())
    return out, pipe


@pytest.fixture(scope="module")
def four_formats(tmp_path_factory, corpus_dir):
    """The session corpus (JSONL, JSONL.zst, Parquet) plus a gzip copy of ``web``."""
    root = tmp_path_factory.mktemp("four")
    gz = root / "webgz"
    gz.mkdir()
    for path in sorted((corpus_dir / "web").iterdir()):
        (gz / (path.name + ".gz")).write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    specs = [*sample_corpus_specs(corpus_dir), DatasetSpec("webgz", str(gz), 0.2)]
    return specs


def test_every_format_reads_byte_identical_to_local_disk(s3, four_formats):
    bucket = new_bucket(s3)
    remote = []
    for spec in four_formats:
        s3.upload_tree(Path(spec.path), bucket, f"corpus/{spec.name}")
        remote.append(
            DatasetSpec(
                spec.name,
                f"s3://{bucket}/corpus/{spec.name}/",
                spec.weight,
                text_field=spec.text_field,
                storage_options=options(s3.endpoint),
            )
        )
    local_digests, local_pipe = digests(four_formats)
    remote_digests, remote_pipe = digests(remote)
    assert remote_digests == local_digests and sum(map(len, local_digests.values())) > 20
    threads = ExecutionConfig(runner="threads", workers=4)  # concurrent reads of one store
    assert digests(remote, execution=threads)[0] == local_digests

    local_infos = resolve_datasets(four_formats, cache=ShardCache())
    remote_infos = resolve_datasets(remote, cache=ShardCache())
    assert {s.format for d in remote_infos for s in d.shards} == {
        "jsonl",
        "jsonl.gz",
        "jsonl.zst",
        "parquet",
    }
    assert fingerprint(remote_pipe, remote_infos) != fingerprint(local_pipe, local_infos)
    # the fingerprints differ in the shard identities only: size + ETag instead of size + time
    a = fingerprint_document(local_pipe, local_infos)
    b = fingerprint_document(remote_pipe, remote_infos)
    for doc in (a, b):
        for dataset in doc["datasets"]:
            dataset["shards"] = [
                [name, rows, ident.split()[0]] for name, rows, ident in dataset["shards"]
            ]
    assert a == b
    assert all(" etag=" in s.identity for d in remote_infos for s in d.shards)


def test_listing_prefix_single_object_and_glob(s3, tmp_path, caplog):
    bucket = new_bucket(s3)
    for key in [
        "cc/a/1.jsonl",
        "cc/a/2.parquet",
        "cc/b/c/3.parquet",
        "cc/.hidden/4.parquet",
        "cc/b/.5.parquet",
        "cc/README.md",
        "cc/a/7.ndjson",
        "ccx/6.parquet",
        "one.jsonl.zst",
    ]:
        s3.put(bucket, key, b"x")
    from zephon_server.engine.shards import infer_format
    from zephon_server.engine.storage.listing import list_object_shards
    from zephon_server.engine.storage.options import StorageOptions

    opts = StorageOptions.from_mapping(options(s3.endpoint))

    def listed(path, fmt=None):
        shards = list_object_shards("dataset 't'", path, opts, fmt, infer_format, "...")
        return [(url.split("/", 3)[3], f) for url, f, _ in shards]

    with caplog.at_level(logging.INFO, logger="zephon_server.engine.ignored_files"):
        assert listed(f"s3://{bucket}/cc/") == [
            ("cc/a/1.jsonl", "jsonl"),
            ("cc/a/2.parquet", "parquet"),
            ("cc/b/c/3.parquet", "parquet"),
        ]
    # an object that looks like data in a format not read is named, the others counted
    [warned, counted] = caplog.records
    assert warned.levelname == "WARNING" and "1 file(s) in prefix" in warned.getMessage()
    assert warned.getMessage().endswith(
        ": a/7.ndjson; rename or convert them, or select them with a glob and set format"
    )
    assert counted.levelname == "INFO" and "1 other file(s)" in counted.getMessage()
    assert listed(f"s3://{bucket}/cc") == listed(f"s3://{bucket}/cc/")  # a prefix without "/"
    assert listed(f"s3://{bucket}/one.jsonl.zst") == [("one.jsonl.zst", "jsonl.zst")]
    assert listed(f"s3://{bucket}/cc/**/*.parquet") == [
        ("cc/a/2.parquet", "parquet"),
        ("cc/b/c/3.parquet", "parquet"),
    ]
    assert listed(f"s3://{bucket}/**/*.parquet")[-1] == ("ccx/6.parquet", "parquet")
    assert listed(f"s3://{bucket}/cc/*.md", "jsonl") == [("cc/README.md", "jsonl")]
    _, _, info = list_object_shards(
        "d", f"s3://{bucket}/one.jsonl.zst", opts, None, infer_format, ""
    )[0]
    assert info.size == 1 and info.etag


def test_plain_jsonl_rows_are_read_in_coalesced_block_aligned_gets(s3, tmp_path):
    rows = [json.dumps({"text": f"row {i} " + "w" * 900}) for i in range(6000)]  # ~5.4 MiB
    write_jsonl(tmp_path / "big.jsonl", rows)
    bucket = new_bucket(s3)
    s3.put(bucket, "big.jsonl", (tmp_path / "big.jsonl").read_bytes())
    size = (tmp_path / "big.jsonl").stat().st_size
    with HttpFaultProxy(s3.port) as proxy:
        spec = DatasetSpec(
            "big", f"s3://{bucket}/big.jsonl", 1.0, storage_options=options(proxy.endpoint)
        )
        cache = ShardCache()
        (info,) = resolve_datasets([spec], cache=cache)
        shard = info.shards[0]
        index_gets = proxy.requests("GET", "big.jsonl")
        assert [g.range_length() for g in index_gets] == [size]  # one 8 MiB part covers it
        proxy.clear()
        starts = [0]
        for row in rows:
            starts.append(starts[-1] + len(row) + 1)

        def row_in_block(b):
            return next(i for i, a in enumerate(starts) if a >= b * BLOCK + 10)

        # rows in blocks 0, 1 and 2: one GET of the three adjacent blocks
        wanted = [0, row_in_block(1), row_in_block(2)]
        got = cache.read_rows(shard, wanted, "text")
        assert got == [rows[i].encode() for i in wanted]
        gets = proxy.requests("GET")
        assert [g.range for g in gets] == [f"bytes=0-{3 * BLOCK - 1}"]
        assert len(proxy.requests("HEAD")) == 2  # the identity before and after the load
        proxy.clear()
        assert cache.read_rows(shard, wanted[::-1], "text") == [
            rows[i].encode() for i in wanted[::-1]
        ]
        assert proxy.requests() == []  # cached blocks: no request at all
        # the last block (the object's tail) and block 3, apart: two GETs
        got = cache.read_rows(shard, [5999, row_in_block(3), 100], "text")
        assert got == [rows[5999].encode(), rows[row_in_block(3)].encode(), rows[100].encode()]
        ranges = sorted(g.range for g in proxy.requests("GET"))
        assert ranges == [f"bytes={3 * BLOCK}-{4 * BLOCK - 1}", f"bytes={5 * BLOCK}-{size - 1}"]
        assert all(g.range_length() >= MIB for g in proxy.requests("GET")[:-1])
    assert cache.stats()["bytes_cached"] >= 4 * BLOCK


def test_parquet_reads_are_coalesced_to_at_least_a_mebibyte(s3, tmp_path):
    import random

    rng = random.Random(5)
    texts = ["".join(rng.choice("abcdefghij ") for _ in range(2000)) for _ in range(3000)]
    write_parquet(
        tmp_path / "p.parquet", {"text": texts, "n": list(range(3000))}, row_group_size=500
    )
    size = (tmp_path / "p.parquet").stat().st_size
    assert size > 3 * MIB
    bucket = new_bucket(s3)
    s3.put(bucket, "p/p.parquet", (tmp_path / "p.parquet").read_bytes())
    with HttpFaultProxy(s3.port) as proxy:
        spec = DatasetSpec(
            "p", f"s3://{bucket}/p/p.parquet", 1.0, storage_options=options(proxy.endpoint)
        )
        cache = ShardCache()
        (info,) = resolve_datasets([spec], cache=cache)
        (footer,) = proxy.requests("GET", "p.parquet")  # the footer and the MiB before it
        assert footer.range == f"bytes={size - MIB}-{size - 1}"
        proxy.clear()
        wanted = [0, 700, 2999, 1600]
        assert cache.read_rows(info.shards[0], wanted, "text") == [texts[i] for i in wanted]
        gets = proxy.requests("GET", "p.parquet")
        assert 1 <= len(gets) <= 4  # at most one per row group read
        assert all(g.range_length() >= MIB or g.range.endswith(f"-{size - 1}") for g in gets)


@pytest.mark.parametrize(
    ("fault", "outcome"),
    [((503, "SlowDown"), "throttled"), ((429, "TooManyRequests"), "throttled"),
     ((500, "InternalError"), "server_error"), ("reset", "network"), ("stall", "network")],
)  # fmt: skip
def test_throttling_errors_and_resets_are_retried_and_counted(s3, tmp_path, fault, outcome):
    # "stall": a server that stops sending mid-body without closing the connection; the SDK
    # gives up after request_timeout_s without a byte (on Linux too), and the read is retried.
    bucket = new_bucket(s3)
    rows = [json.dumps({"text": f"doc {i} " * 40}) for i in range(200)]
    write_jsonl(tmp_path / "a.jsonl", rows)
    s3.put(bucket, "a.jsonl", (tmp_path / "a.jsonl").read_bytes())
    with HttpFaultProxy(s3.port) as proxy:
        opts = options(proxy.endpoint, request_timeout_s=1)
        spec = DatasetSpec("a", f"s3://{bucket}/a.jsonl", 1.0, storage_options=opts)
        cache = ShardCache()
        (info,) = resolve_datasets([spec], cache=cache)
        before = storage_stats().snapshot()
        if fault == "reset":
            proxy.reset(2, methods=["GET"])
        elif fault == "stall":
            proxy.stall(2, hold=60, methods=["GET"])
        else:
            proxy.fail(2, *fault, methods=["GET"])
        assert cache.read_rows(info.shards[0], [3, 150], "text") == [
            rows[3].encode(),
            rows[150].encode(),
        ]
        after = storage_stats().snapshot()
        faults = [r.fault for r in proxy.requests("GET", "a.jsonl") if r.fault]
        assert faults == [fault if isinstance(fault, str) else "fail"] * 2
    assert after.retries["get"] - before.retries["get"] == 2
    assert after.requests[("get", outcome)] - before.requests[("get", outcome)] == 2
    assert after.requests[("get", "ok")] - before.requests[("get", "ok")] == 1


def failed_read(proxy, url: str, opts: dict, status: int, code: str) -> StorageRequestError:
    """The error of reading row 1 of the one object ``url`` while the proxy answers every GET
    with ``status`` ``code`` (the start-up counting it before that goes through)."""
    cache = ShardCache()
    (info,) = resolve_datasets([DatasetSpec("a", url, 1.0, storage_options=opts)], cache=cache)
    proxy.clear()
    proxy.fail(100, status, code, methods=["GET"])
    with pytest.raises(StorageRequestError) as failed:
        cache.read_rows(info.shards[0], [1], "text")
    return failed.value


def test_retry_budget_exhaustion_fails_or_skips_by_on_error(s3, tmp_path):
    bucket = new_bucket(s3)
    rows = [json.dumps({"text": f"doc {i}"}) for i in range(40)]
    write_jsonl(tmp_path / "a.jsonl", rows)
    s3.put(bucket, "a.jsonl", (tmp_path / "a.jsonl").read_bytes())
    with HttpFaultProxy(s3.port) as proxy:
        opts = options(proxy.endpoint, retry_attempts=3)
        failed = failed_read(proxy, f"s3://{bucket}/a.jsonl", opts, 503, "SlowDown")
        text = str(failed)
        assert f"get s3://{bucket}/a.jsonl after 3 attempts (throttled)" in text
        assert "last answer: AWS Error S" in text  # SLOW_DOWN or SERVICE_UNAVAILABLE: the 503
        assert len(proxy.requests("GET")) == 3
        assert not isinstance(failed, ShardChanged)

        # through a pipeline: on_error decides (the start-up counting, before the faults,
        # keeps the line index in the process's cache; the fetch then meets the faults)
        def first_batches(on_error):
            spec = DatasetSpec(
                "a", f"s3://{bucket}/a.jsonl", 1.0, on_error=on_error, storage_options=opts
            )
            pipe = Pipeline([spec], seed=1, lanes=1, chunk_size=8, flush_every_k_chunks=2)
            pipe.decode_text().tokenize(tokenizer="byte").batch(microbatch_size=2, drop_last=False)
            proxy.clear()  # no faults while the start-up counts
            pipe.plan(INLINE)
            proxy.clear()
            proxy.fail(100, 503, "SlowDown", methods=["GET"])
            run = pipe.run(INLINE)
            try:
                return list(run.batches()), run
            finally:
                assert proxy.requests("GET") and all(r.fault for r in proxy.requests("GET"))

        with pytest.raises(DataError, match="after 3 attempts"):
            first_batches("fail")
        batches, run = first_batches("skip")
        assert batches == [] and dict(run.tombstones)[("a", "read_error")] == 40


def test_a_refused_get_of_a_small_range_names_the_hidden_status(s3, tmp_path):
    # The AccessDenied body is longer than the 31 bytes asked for: the SDK reports a stream
    # failure, not the 403, so the message says what that can hide instead of "throttling".
    bucket = new_bucket(s3)
    s3.put(bucket, "small.jsonl", b'{"text": "a"}\n{"text": "bc"}\n')
    with HttpFaultProxy(s3.port) as proxy:
        url, opts = f"s3://{bucket}/small.jsonl", options(proxy.endpoint)
        text = str(failed_read(proxy, url, opts, 403, "AccessDenied"))
    assert "more bytes than asked" in text and "GET refused while HEAD succeeds" in text
    assert "lower storage_options.max_concurrency" not in text


def test_a_rewritten_object_is_shard_changed_never_read(s3, tmp_path):
    bucket = new_bucket(s3)
    for name, fmt_rows in [("a.jsonl", 30), ("b.jsonl.gz", 30)]:
        data = "".join(json.dumps({"text": f"{name} {i}"}) + "\n" for i in range(fmt_rows)).encode()
        s3.put(bucket, f"d/{name}", gzip.compress(data) if name.endswith(".gz") else data)
    spec = DatasetSpec("d", f"s3://{bucket}/d/", 1.0, storage_options=options(s3.endpoint))
    cache = ShardCache()
    (info,) = resolve_datasets([spec], cache=ShardCache())  # counted by another cache
    plain, packed = info.shards
    s3.put(bucket, "d/a.jsonl", b'{"text": "other content of the same object"}\n')
    s3.put(bucket, "d/b.jsonl.gz", gzip.compress(b'{"text": "other"}\n'))
    for shard in (plain, packed):
        with pytest.raises(ShardChanged, match=r"changed after it was indexed \(ETag .* -> .*size"):
            cache.read_rows(shard, [0], "text")
    # a fresh resolution sees the new version (and the fingerprint notices it)
    (again,) = resolve_datasets([spec], cache=ShardCache())
    assert again.shards[0].identity != plain.identity and again.shards[0].num_rows == 1


def test_an_object_rewritten_during_a_failed_read_is_shard_changed(s3, tmp_path):
    bucket = new_bucket(s3)
    s3.put(bucket, "a.jsonl", b"".join(b'{"text": "doc %d"}\n' % i for i in range(30)))
    with HttpFaultProxy(s3.port) as proxy:
        opts = options(proxy.endpoint, retry_attempts=2)
        spec = DatasetSpec("a", f"s3://{bucket}/a.jsonl", 1.0, storage_options=opts)
        cache = ShardCache()
        (info,) = resolve_datasets([spec], cache=cache)

        def rewrite():
            s3.put(bucket, "a.jsonl", b'{"text": "new"}\n')

        proxy.fail(1, 500, "InternalError", methods=["GET"], before=rewrite)
        proxy.fail(1, 500, "InternalError", methods=["GET"])
        with pytest.raises(ShardChanged, match=r"changed after it was indexed \(ETag"):
            cache.read_rows(info.shards[0], [2], "text")


def test_a_versioned_bucket_adds_the_version_to_the_identity(s3):
    bucket = new_bucket(s3, versioned=True)
    s3.put(bucket, "v/a.jsonl", b'{"text": "x"}\n')
    spec = DatasetSpec("v", f"s3://{bucket}/v/", 1.0, storage_options=options(s3.endpoint))
    (info,) = resolve_datasets([spec], cache=ShardCache())
    assert " version=" in info.shards[0].identity and info.shards[0].version


def test_missing_bucket_and_missing_prefix_fail_at_start_up(s3):
    bucket = new_bucket(s3)
    s3.put(bucket, "data/a.jsonl", b'{"text": "x"}\n')
    opts = options(s3.endpoint)
    cases = [
        (f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/data/", "bucket .* does not exist"),
        (f"s3://{bucket}/nothing/", "matches no object"),
        (f"s3://{bucket}/data/*.parquet", "matches no objects"),
        (f"s3://{bucket}/data/a.json", "matches no object"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            resolve_datasets(
                [DatasetSpec("d", path, 1.0, storage_options=opts)], cache=ShardCache()
            )
        assert "\n" not in str(info.value) and "dataset 'd'" in str(info.value)


def test_an_object_gone_between_listing_and_head_is_named_not_the_bucket(s3, monkeypatch):
    # a corpus rewritten (delete, then put) while a server starts: the listing sees an
    # object that is gone by its HEAD; that is not a missing bucket
    from zephon_server.engine.storage import remote

    bucket = new_bucket(s3)
    for i in range(3):
        s3.put(bucket, f"web/part-{i}.jsonl", b'{"text": "x"}\n')
    listed = remote.ArrowStore.list

    def list_then_delete(self, prefix, *args, **kwargs):
        out = listed(self, prefix, *args, **kwargs)
        s3.client().delete_object(Bucket=bucket, Key="web/part-1.jsonl")
        return out

    monkeypatch.setattr(remote.ArrowStore, "list", list_then_delete)
    spec = DatasetSpec("web", f"s3://{bucket}/web/", 1.0, storage_options=options(s3.endpoint))
    with pytest.raises(ConfigError) as info:
        resolve_datasets([spec], cache=ShardCache())
    assert str(info.value) == (
        f"dataset 'web': object s3://{bucket}/web/part-1.jsonl was listed, then was gone when "
        f"its ETag was read: the objects under s3://{bucket}/web/ changed while the server "
        "listed them (a corpus being written, rewritten or removed); start again once the "
        "corpus is complete"
    )


def test_wrong_credentials_fail_at_start_up_naming_the_fix(tmp_path):
    from tests.support.s3_server import S3Server

    server = S3Server(tmp_path, auth=True)
    try:
        spec = DatasetSpec(
            "d", "s3://any-bucket/data/", 1.0, storage_options=options(server.endpoint)
        )
        with pytest.raises(ConfigError) as info:
            resolve_datasets([spec], cache=ShardCache())
    finally:
        server.stop()
    text = str(info.value)
    assert "\n" not in text and "access to s3://any-bucket/data/ denied" in text
    assert "INVALID_ACCESS_KEY_ID" in text and "AWS_ACCESS_KEY_ID" in text


def test_store_api_on_s3(s3):
    import pickle

    bucket = new_bucket(s3)
    store, key = open_store(f"s3://{bucket}/index/entry.bin", options(s3.endpoint))
    assert key == "index/entry.bin"
    store.write_atomic(key, b"0123456789" * 1000)
    info = store.stat(key)
    assert info.size == 10000 and info.etag
    assert store.read_range(key, 5, 4) == b"5678"
    assert bytes(store.read_all(key)) == b"0123456789" * 1000
    assert [i.key for i in store.list("index/")] == [key]
    assert pickle.loads(pickle.dumps(store)) is store  # the process's cached store
    store.delete(key)
    store.delete(key)
    assert store.list("index/") == []
    with pytest.raises(StorageRequestError, match="not_found"):
        store.stat(key)
