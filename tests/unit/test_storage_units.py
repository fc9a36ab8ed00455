"""Unit tests of the storage layer's pure parts: URL globs (against the local glob), error
classification, backoff, options, identities and in-memory decompression. No sockets."""

from __future__ import annotations

import glob
import gzip
import os
import pickle

import pytest
import zstandard

from zephon_server.engine.datasets import DatasetSpec
from zephon_server.engine.decompression import (
    IncompleteShardError,
    decompress_bytes,
    decompress_shard,
)
from zephon_server.engine.errors import ConfigError
from zephon_server.engine.identity import describe_change, object_identity
from zephon_server.engine.storage.location import ObjectUrl, glob_base, glob_regex, is_url
from zephon_server.engine.storage.metrics import StorageStats
from zephon_server.engine.storage.options import StorageOptions
from zephon_server.engine.storage.retry import (
    Requests,
    RetryPolicy,
    StorageRequestError,
    classify,
)
from zephon_server.engine.storage.store import LocalStore, open_store

pytestmark = pytest.mark.timeout(30)

KEYS = [
    "a/x.parquet",
    "a/b/y.parquet",
    "z.parquet",
    "a/.h/q.parquet",
    "a/.x.parquet",
    "cc/1/2/3.parquet",
    "cc/t.jsonl",
    "a[1].jsonl",
    "b1.jsonl",
    ".top/k.parquet",
]


@pytest.mark.parametrize(
    "pattern",
    [
        "**/*.parquet",
        "a/**/*.parquet",
        "cc/**",
        "**",
        "*.parquet",
        "a/*.parquet",
        "a/.*.parquet",
        "[ab]1.jsonl",
        "[!a]1.jsonl",
        "a[[]1].jsonl",
        "cc/*/*/*.parquet",
        "?.parquet",
    ],
)
def test_url_globs_select_what_the_local_glob_selects(tmp_path, pattern):
    for key in KEYS:
        path = tmp_path / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    expected = sorted(
        os.path.relpath(p, tmp_path)
        for p in glob.glob(os.path.join(tmp_path, pattern), recursive=True)
        if os.path.isfile(p)
    )
    regex = glob_regex(pattern)
    assert sorted(k for k in KEYS if regex.match(k)) == expected
    assert all(k.startswith(glob_base(pattern)) for k in expected)


def test_urls_parse_and_local_paths_are_not_urls():
    assert is_url("s3://bucket/a/b.jsonl") and is_url("S3://bucket")
    assert not is_url("/data/web") and not is_url("data/s3:/x") and not is_url("ftp://x/y")
    url = ObjectUrl.parse("s3://bucket/cc/part.jsonl")
    assert (url.scheme, url.bucket, url.key, url.root) == (
        "s3",
        "bucket",
        "cc/part.jsonl",
        "s3://bucket",
    )
    with pytest.raises(ValueError, match="no bucket"):
        ObjectUrl.parse("s3:///key")


SDK_ERRORS = [
    ("AWS Error SLOW_DOWN during GetObject operation: Please reduce", "throttled"),
    ("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation", "throttled"),
    ("AWS Error UNKNOWN (HTTP status 429) during GetObject: TooManyRequests", "throttled"),
    ("AWS Error INTERNAL_FAILURE during GetObject operation: internal error", "server_error"),
    ("AWS Error UNKNOWN (HTTP status 502) during GetObject operation", "server_error"),
    ("AWS Error NETWORK_CONNECTION during GetObject: curlCode: 56, reset", "network"),
    ("AWS Error ACCESS_DENIED during HeadObject operation: No response body.", "denied"),
    ("AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2 operation", "denied"),
    ("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: no bucket", "not_found"),
    ("something else entirely", "error"),
    ("Status(UNAVAILABLE: ... Could not create a OAuth2 access token to authenticate", "denied"),
]


@pytest.mark.parametrize(("message", "outcome"), SDK_ERRORS)
def test_sdk_errors_are_classified(message, outcome):
    assert classify(OSError(message)) == outcome
    assert classify(FileNotFoundError("x")) == "not_found"


def test_backoff_is_full_jitter_capped_exponential():
    policy = RetryPolicy(attempts=6, base_s=0.1, cap_s=1.0)
    assert [policy.delay(k, draw=lambda: 1.0) for k in range(1, 7)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    )
    assert policy.delay(3, draw=lambda: 0.0) == 0.0


def test_requests_retry_retryable_failures_and_count_them():
    stats, slept = StorageStats(), []
    requests = Requests(RetryPolicy(4, 0.1, 1.0), 2, stats, sleep=slept.append)
    answers = iter(
        [OSError("AWS Error SLOW_DOWN during GetObject"), OSError("curlCode: 56"), b"ok"]
    )

    def attempt():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert requests.call("get", "s3://b/k", attempt, len) == b"ok"
    counts = stats.snapshot()
    assert counts.requests == {("get", "throttled"): 1, ("get", "network"): 1, ("get", "ok"): 1}
    assert counts.retries == {"get": 2} and counts.read_bytes == 2 and len(slept) == 2


def test_retry_budget_exhaustion_names_the_object_and_the_last_answer():
    stats = StorageStats()
    requests = Requests(RetryPolicy(3, 0.0, 0.0), 1, stats, sleep=lambda s: None)

    def attempt():
        raise OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce")

    with pytest.raises(StorageRequestError) as info:
        requests.call("get", "s3://bucket/a.jsonl", attempt)
    text = str(info.value)
    assert "get s3://bucket/a.jsonl after 3 attempts (throttled)" in text
    assert "SLOW_DOWN" in text and "max_concurrency" in text
    assert stats.snapshot().retries == {"get": 2}
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == text


def test_requests_do_not_retry_denied_or_missing():
    requests = Requests(RetryPolicy(5, 0.0, 0.0), 1, StorageStats(), sleep=lambda s: None)
    calls = []

    def attempt():
        calls.append(1)
        raise OSError("AWS Error ACCESS_DENIED during HeadObject operation")

    with pytest.raises(StorageRequestError, match="on the first attempt"):
        requests.call("head", "s3://b/k", attempt)
    assert len(calls) == 1


def test_a_gcs_credentials_failure_raised_bare_is_a_denied_request_naming_the_fix():
    # Google's client reports a credentials file it cannot read as a bare ArrowException (not
    # an OSError): it escaped the request gate as a traceback.
    from pyarrow.lib import ArrowException

    requests = Requests(RetryPolicy(5, 0.0, 0.0), 1, StorageStats(), sleep=lambda s: None)
    preamble = "Permanent error, with a last message of Could not create a OAuth2 access token"
    cause = "The underlying error message was: Cannot open credentials file /no/creds.json"

    def attempt():
        raise ArrowException(f"{preamble} to authenticate. {cause} error_info={{...}}")

    with pytest.raises(StorageRequestError) as caught:
        requests.call("list", "gs://b/k", attempt)
    message = str(caught.value)
    assert (
        "list gs://b/k on the first attempt (denied); last answer: Cannot open credentials "
        "file /no/creds.json (" in message
    )
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message and "AWS_ACCESS_KEY_ID" not in message


@pytest.mark.parametrize(
    ("path", "hint"),
    [
        ("s3a://bucket/data/", "write s3:// instead"),
        ("az://container/data/", "copy the data to S3-compatible storage"),
        ("https://example.com/a.jsonl", "download the files first"),
        ("file:///data/web", "without file://"),
    ],
)
def test_a_url_of_a_scheme_not_read_is_a_config_error_not_a_missing_local_path(path, hint):
    with pytest.raises(ConfigError) as caught:
        DatasetSpec("web", path, 1.0)
    scheme = path.split("://")[0]
    assert f"the URL scheme {scheme}:// is not supported" in str(caught.value)
    assert hint in str(caught.value)


def test_storage_options_validate_and_mask_secrets():
    opts = StorageOptions.from_mapping(
        {"endpoint_url": "http://127.0.0.1:9000", "access_key": "AK", "secret_key": "SUPERSECRET"}
    )
    assert "SUPERSECRET" not in repr(opts) and "***" in repr(opts)
    assert opts.public()["secret_key"] == "***"
    with pytest.raises(ConfigError, match=r"unknown key 'secret'; allowed keys: \['endpoint_url'"):
        StorageOptions.from_mapping({"secret": "x"})
    with pytest.raises(ConfigError, match="access_key and secret_key go together"):
        StorageOptions(access_key="AK")
    with pytest.raises(ConfigError, match="max_concurrency: must be an integer >= 1, got 0"):
        StorageOptions(max_concurrency=0)
    with pytest.raises(ConfigError, match="endpoint_url: must be a URL"):
        StorageOptions(endpoint_url="localhost:9000")
    with pytest.raises(ConfigError, match=r"secret_key: must be a non-empty string, got \*\*\*"):
        StorageOptions(access_key="AK", secret_key=123)  # type: ignore[arg-type]


def test_dataset_storage_options_are_checked_and_stay_out_of_the_spec_repr():
    spec = DatasetSpec(
        "web", "s3://bucket/web/", 1.0, storage_options={"access_key": "A", "secret_key": "S3CR3T"}
    )
    assert isinstance(spec.storage_options, StorageOptions)
    assert "S3CR3T" not in repr(spec)
    with pytest.raises(ConfigError, match="dataset 'web': storage_options: unknown key 'bogus'"):
        DatasetSpec("web", "s3://bucket/web/", 1.0, storage_options={"bogus": 1})
    with pytest.raises(ConfigError, match="storage_options apply to object-store paths"):
        DatasetSpec("web", "/data/web", 1.0, storage_options={"region": "eu-west-1"})


def test_object_identities_and_their_changes_read_well():
    old = object_identity(100, '"9b2cf535f27731c974343645a3985328"')
    assert old == "size=100 etag=9b2cf535f27731c974343645a3985328"
    new = object_identity(120, "77f1aa", "v2")
    assert describe_change(old, new) == (
        "ETag 9b2cf535f27731c974343645a3985328 -> 77f1aa, version - -> v2, size 100 -> 120 bytes"
    )
    same_size = object_identity(100, "77f1aa")
    assert describe_change(old, same_size).endswith("size 100 bytes unchanged")


@pytest.mark.parametrize("fmt", ["jsonl.gz", "jsonl.zst"])
def test_decompressing_from_memory_matches_the_file_and_names_the_url(tmp_path, fmt):
    content = b"".join(b'{"text": "row %d"}\n' % i for i in range(2000))
    packed = gzip.compress(content) if fmt == "jsonl.gz" else zstandard.compress(content)
    path = tmp_path / f"x.{fmt}"
    path.write_bytes(packed)
    assert bytes(decompress_bytes(packed, "s3://b/x", fmt)) == bytes(
        decompress_shard(str(path), fmt)
    )
    with pytest.raises(IncompleteShardError, match=r"cannot decompress shard s3://b/x .*truncated"):
        decompress_bytes(packed[:-7], "s3://b/x", fmt)
    with pytest.raises(IncompleteShardError, match="empty"):
        decompress_bytes(b"", "s3://b/x", fmt)


def test_local_store_api(tmp_path):
    store, key = open_store(str(tmp_path / "d" / "entry.bin"))
    assert isinstance(store, LocalStore) and key == str(tmp_path / "d" / "entry.bin")
    store.write_atomic(key, b"0123456789")
    assert store.stat(key).size == 10
    assert store.read_range(key, 2, 3) == b"234" and store.read_all(key) == b"0123456789"
    assert [i.key for i in store.list(str(tmp_path / "d"))] == [key]
    assert not [p for p in os.listdir(tmp_path / "d") if p.startswith(".tmp")]
    store.delete(key)
    store.delete(key)  # absent is fine
    assert store.list(str(tmp_path / "d")) == []
    assert pickle.loads(pickle.dumps(store)).__class__ is LocalStore


def test_storage_options_stay_out_of_the_fingerprint():
    from zephon_server.engine.datasets import DatasetInfo, ShardInfo
    from zephon_server.engine.pipeline import Pipeline, fingerprint

    def fp(storage_options):
        spec = DatasetSpec("web", "s3://b/web/", 1.0, storage_options=storage_options)
        shard = ShardInfo("s3://b/web/a.jsonl", "jsonl", 10, 2, 0, etag="e1")
        pipe = Pipeline([spec]).decode_text().tokenize(tokenizer="byte").batch(microbatch_size=2)
        return fingerprint(pipe, [DatasetInfo(spec, 0, (shard,))])

    assert fp(None) == fp({"endpoint_url": "http://x:9000", "max_concurrency": 3})


def test_manifests_of_object_shards_keep_their_urls():
    from zephon_server.engine.manifest import DatasetShards

    shards = DatasetShards.of(
        [
            ("s3://b/c/web/a.jsonl", "size=1 etag=x", 1),
            ("s3://b/c/web/d/b.jsonl", "size=2 etag=y", 2),
        ]
    )
    assert shards.root == "s3://b/c/web"
    assert [e.key for e in shards.shards] == ["a.jsonl", "d/b.jsonl"]
    assert [shards.path(e) for e in shards.shards] == [
        "s3://b/c/web/a.jsonl",
        "s3://b/c/web/d/b.jsonl",
    ]
