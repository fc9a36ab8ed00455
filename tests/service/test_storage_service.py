"""A real ``zephon serve`` over ``s3://`` datasets (moto on loopback), configured the standard
AWS way (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``...): it streams the same batches as the
same corpus on local disk, its worker processes' storage requests reach ``/metrics``, and
bad credentials or a missing bucket stop ``explain`` / ``dump`` with one line and exit 2.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.s3_server import S3Server, free_port
from zephon_testing.servers import read_lane, serve_once, server

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]


def s3_config(stream_config, bucket: str, out: Path, runner: dict | None = None) -> Path:
    """The service tests' pipeline with every dataset path on ``s3://bucket/corpus/``."""
    cfg = yaml.safe_load(stream_config[0].read_text())
    for dataset in cfg["datasets"]:
        dataset["path"] = f"s3://{bucket}/corpus/{Path(dataset['path']).name}/"
    if runner is not None:
        cfg["execution"] = runner
    out.write_text(yaml.safe_dump(cfg))
    return out


def zephon(
    args: list[str], env: dict[str, str], cwd: Path, inherit: bool = True
) -> subprocess.CompletedProcess:
    """``zephon ARGS`` in ``cwd`` with ``env`` over this process's environment (or, without
    ``inherit``, with ``env`` alone)."""
    return subprocess.run(
        [sys.executable, "-m", "zephon_server.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**__import__("os").environ, **env} if inherit else env,
    )


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.mark.processes
def test_serve_streams_an_s3_corpus_like_the_local_one(
    s3, corpus_dir, stream_config, stream_expected, tmp_path
):
    bucket = s3.bucket(f"svc-{uuid.uuid4().hex[:12]}")
    s3.upload_tree(corpus_dir, bucket, "corpus")
    cfg = s3_config(
        stream_config, bucket, tmp_path / "s3.yaml", {"runner": "processes", "workers": 2}
    )
    metrics_port = free_port()
    args = ["--config", str(cfg), "--metrics-port", str(metrics_port)]
    with server(args, tmp_path, env=s3.env()) as srv:
        for lane, expected in stream_expected.items():
            batches, end = read_lane(srv.stub(), lane)
            assert end is not None
            assert [b.chain_digest.hex() for b in batches] == expected
        metrics = scrape(metrics_port)
    gets_ok = metrics[("zephon_storage_requests_total", (("operation", "get"), ("outcome", "ok")))]
    assert gets_ok > 0
    assert (
        metrics[("zephon_storage_requests_total", (("operation", "list"), ("outcome", "ok")))] == 3
    )
    # start-up reads every object once in the server process; the worker processes read them
    # again for the rows, and what they read is counted in the server's figures too
    corpus_bytes = sum(p.stat().st_size for p in corpus_dir.rglob("*") if p.is_file())
    assert metrics[("zephon_storage_read_bytes_total", ())] >= 1.8 * corpus_bytes
    assert metrics[("zephon_storage_request_seconds_count", (("operation", "get"),))] == gets_ok


def test_bad_credentials_and_a_missing_bucket_stop_explain_and_dump_with_one_line(
    tmp_path, s3, stream_config
):
    auth = S3Server(tmp_path, auth=True)
    try:
        cfg = s3_config(stream_config, "corpus-bucket", tmp_path / "auth.yaml")
        res = zephon(["explain", "--config", str(cfg)], auth.env(), tmp_path)
    finally:
        auth.stop()
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]  # after the log lines (index directory)
    assert line.startswith("zephon: error: dataset 'web': access to s3://corpus-bucket/corpus/web/")
    assert "AWS_ACCESS_KEY_ID" in line

    missing = s3_config(stream_config, f"missing-{uuid.uuid4().hex[:8]}", tmp_path / "nb.yaml")
    res = zephon(["dump", "--config", str(missing), "--batches", "1"], s3.env(), tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert res.stderr.count("zephon: error:") == 1
    assert "does not exist" in line and "AWS_ENDPOINT_URL" in line
    res = serve_once(["--config", str(missing)], tmp_path, env=s3.env())
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == line  # the same one line, after the log


def test_a_gs_dataset_without_credentials_stops_with_one_line_naming_googles_fix(
    tmp_path, stream_config
):
    # gs:// is untested, but it must not hang (Google's client retried for up to 15 minutes,
    # saying nothing) nor end in a traceback (a credentials file it cannot read).
    cfg = yaml.safe_load(stream_config[0].read_text())
    cfg["datasets"] = [{"name": "web", "path": "gs://zephon-no-such-bucket/web/", "weight": 1}]
    path = tmp_path / "gs.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-such-creds.json")}
    res = zephon(["explain", "--config", str(path), "--index-dir", "none"], env, tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("zephon: error: dataset 'web': access to gs://zephon-no-such-bucket/")
    assert f"Cannot open credentials file {tmp_path / 'no-such-creds.json'}" in line
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line and "AWS_ACCESS_KEY_ID" not in line


def test_explain_never_shows_storage_secrets(tmp_path, s3, stream_config, corpus_dir):
    bucket = s3.bucket(f"sec-{uuid.uuid4().hex[:12]}")
    s3.upload_tree(corpus_dir, bucket, "corpus")
    cfg = yaml.safe_load(s3_config(stream_config, bucket, tmp_path / "c.yaml").read_text())
    env = s3.env()
    secret = env.pop("AWS_SECRET_ACCESS_KEY")
    for dataset in cfg["datasets"]:
        dataset["storage_options"] = {
            "access_key": env.pop("AWS_ACCESS_KEY_ID", "zephon-test-key"),
            "secret_key": secret,
            "max_concurrency": 4,
        }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    res = zephon(["--verbose", "explain", "--config", str(tmp_path / "c.yaml")], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "shards=4" in res.stdout
    assert "storage_options: {'access_key': 'zephon-test-key', 'secret_key': '***'" in res.stdout
    assert secret not in res.stdout + res.stderr


def test_an_s3_index_directory_is_shared_by_zephon_index_and_later_starts(
    s3, corpus_dir, stream_config, stream_expected, tmp_path
):
    bucket = s3.bucket(f"idx-{uuid.uuid4().hex[:12]}")
    s3.upload_tree(corpus_dir, bucket, "corpus")
    cfg = s3_config(stream_config, bucket, tmp_path / "s3.yaml")
    index = f"s3://{bucket}/zephon-index"
    built = zephon(["index", "--config", str(cfg), "--index-dir", index], s3.env(), tmp_path)
    assert built.returncode == 0, built.stderr
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    entries = [k for k in keys if k.startswith("zephon-index/entries/")]
    catalogs = [k for k in keys if k.startswith("zephon-index/catalogs/")]
    shards = [k for k in keys if k.startswith("corpus/")]
    assert len(entries) == len(shards) and len(catalogs) == len(stream_config_datasets(cfg))
    assert not any(".probe." in k for k in keys)  # the writability probe is cleaned up
    # A later start (another server of the job) counts from the shared catalog, and serves
    # the same batches as a cold local start.
    warm = zephon(["explain", "--config", str(cfg), "--index-dir", index], s3.env(), tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert warm.stderr.count("row counts from the index catalog") == len(catalogs), warm.stderr
    assert f"shard index: {index}" in warm.stdout
    with server(["--config", str(cfg), "--index-dir", index], tmp_path, env=s3.env()) as srv:
        for lane, expected in stream_expected.items():
            batches, end = read_lane(srv.stub(), lane)
            assert end is not None
            assert [b.chain_digest.hex() for b in batches] == expected


def stream_config_datasets(cfg: Path) -> list:
    return yaml.safe_load(cfg.read_text())["datasets"]


def only_storage_options(s3, stream_config, bucket: str, tmp_path: Path) -> tuple[Path, dict]:
    """A config whose datasets reach the store through storage_options alone, and an
    environment without any AWS_ variable."""
    cfg_path = s3_config(stream_config, bucket, tmp_path / "opts.yaml")
    cfg = yaml.safe_load(cfg_path.read_text())
    env = s3.env()
    for dataset in cfg["datasets"]:
        dataset["storage_options"] = {
            "endpoint_url": env["AWS_ENDPOINT_URL"],
            "access_key": env["AWS_ACCESS_KEY_ID"],
            "secret_key": env["AWS_SECRET_ACCESS_KEY"],
            "region": env["AWS_REGION"],
        }
    cfg_path.write_text(yaml.safe_dump(cfg))
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return cfg_path, {**clean, "AWS_EC2_METADATA_DISABLED": "true"}


def test_an_index_in_a_datasets_bucket_is_reached_with_its_storage_options(
    s3, corpus_dir, stream_config, tmp_path
):
    bucket = s3.bucket(f"opt-{uuid.uuid4().hex[:12]}")
    s3.upload_tree(corpus_dir, bucket, "corpus")
    cfg, env = only_storage_options(s3, stream_config, bucket, tmp_path)
    index = f"s3://{bucket}/zephon-index"
    cold = zephon(["explain", "--config", str(cfg), "--index-dir", index], env, tmp_path, False)
    assert cold.returncode == 0, cold.stderr
    assert "WARNING" not in cold.stderr, cold.stderr  # it was the default endpoint before
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.startswith("zephon-index/catalogs/") for k in keys)
    warm = zephon(["explain", "--config", str(cfg), "--index-dir", index], env, tmp_path, False)
    assert warm.returncode == 0 and "row counts from the index catalog" in warm.stderr


def test_an_index_store_that_does_not_answer_is_not_used_at_all(
    s3, corpus_dir, stream_config, tmp_path
):
    # the index in another bucket, reached with the environment's endpoint, which refuses
    # connections: one probe's retry budget, then no request per catalog and entry
    bucket = s3.bucket(f"opt-{uuid.uuid4().hex[:12]}")
    s3.upload_tree(corpus_dir, bucket, "corpus")
    cfg, env = only_storage_options(s3, stream_config, bucket, tmp_path)
    env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
    index = "s3://another-bucket/zephon-index"
    res = zephon(["explain", "--config", str(cfg), "--index-dir", index], env, tmp_path, False)
    assert res.returncode == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, res.stderr
    assert f"index directory {index} does not answer (" in warnings[0]
    assert "the storage_options of a dataset in the same bucket" in warnings[0]
