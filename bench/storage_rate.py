"""Steady-state tokens/s from an S3 server on loopback against the same corpus on local disk.

The S3 server is moto's standalone server (``python -m moto.server``, the one the tests use)
in its own process on 127.0.0.1; the corpus is the start-up section's reference workload
(8 JSONL shards of 38 MB, the BPE tokenizer), uploaded once. Each round measures the local
directory and the ``s3://`` prefix back to back (the order alternates) with
:func:`bench.startup.steady_rate`, and the ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_KEY, _SECRET, _REGION = "bench-key", "bench-secret", "us-east-1"
TARGET = 0.95


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def s3_server(log_path: Path) -> Iterator[str]:
    """moto's S3 server on a free loopback port; yields its endpoint URL."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"moto server did not start (log: {log_path})") from None
                    time.sleep(0.1)
            yield endpoint
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def aws_env(endpoint: str) -> dict[str, str]:
    """The standard AWS variables that reach ``endpoint`` (what a user would set)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": _KEY,
        "AWS_SECRET_ACCESS_KEY": _SECRET,
        "AWS_REGION": _REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def upload(endpoint: str, files: Sequence[Path], bucket: str, prefix: str) -> str:
    """Upload ``files`` to ``s3://bucket/prefix/``; returns that URL."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=_REGION,
        aws_access_key_id=_KEY,
        aws_secret_access_key=_SECRET,
    )
    client.create_bucket(Bucket=bucket)
    for path in files:
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    return f"s3://{bucket}/{prefix}/"


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ratio_rounds(local: Sequence[float], remote: Sequence[float]) -> list[float | None]:
    """Per-round S3 / local ratios (None where the local rate is missing)."""
    return [r / lo if lo > 0 else None for lo, r in zip(local, remote)]


def summary(section: dict[str, Any]) -> str:
    """The sentence the start-up section prints for this measurement."""
    ratios = [r for r in section["ratios"] if r is not None]
    if not ratios:
        return "Steady-state tokens/s from S3 on loopback vs local disk: no valid round."
    median = statistics.median(ratios)
    verdict = "met" if median >= TARGET else "missed"
    rounds = ", ".join(f"{r:.2f}" for r in ratios)
    return (
        f"Steady-state tokens/s from an S3 server on loopback (moto, `{section['corpus']}`) vs "
        f"the same corpus on local disk: **{median:.2f}x** (rounds {rounds}; target >= "
        f"{TARGET:.2f}x: {verdict}); local {statistics.median(section['local']):,.0f} tokens/s, "
        f"S3 {statistics.median(section['s3']):,.0f} tokens/s, {section['seconds']:.0f} s "
        "per measurement."
    )


def measure(
    files: Sequence[Path],
    tokenizer: str,
    work_dir: Path,
    rounds: int = 3,
    seconds: float = 20.0,
) -> dict[str, Any]:
    """Local and S3 steady-state rates of the reference corpus, ``rounds`` pairs."""
    from .startup import steady_rate

    work_dir.mkdir(parents=True, exist_ok=True)
    local_dir = str(Path(files[0]).parent)
    local: list[float] = []
    remote: list[float] = []
    with s3_server(work_dir / "moto.log") as endpoint:
        url = upload(endpoint, files, "bench-corpus", "reference")
        with _environment(aws_env(endpoint)):
            for rnd in range(rounds):
                order = [("local", local_dir), ("s3", url)][:: -1 if rnd % 2 else 1]
                for name, where in order:
                    log.info("storage round %d: %s", rnd + 1, name)
                    rate = steady_rate(where, tokenizer, work_dir / name, seconds)
                    (local if name == "local" else remote).append(rate)
    megabytes = sum(Path(f).stat().st_size for f in files) / 1e6
    return {
        "corpus": f"{len(files)} JSONL shards, {megabytes:.0f} MB",
        "seconds": seconds,
        "local": local,
        "s3": remote,
        "ratios": ratio_rounds(local, remote),
    }
