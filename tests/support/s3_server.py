"""A real S3-protocol server for tests: moto's standalone server in a subprocess on loopback.

``S3Server()`` starts ``python -m moto.server -H 127.0.0.1 -p PORT`` on a free port and waits
until it answers. With ``auth=True`` the server checks credentials (moto's
``INITIAL_NO_AUTH_ACTION_COUNT``): a request with an unknown access key gets the real
``InvalidAccessKeyId`` answer, which is what the start-up credential tests need.

:meth:`S3Server.env` is the environment a ``zephon`` subprocess (or this process) needs to
reach the server the standard AWS way (``AWS_ENDPOINT_URL``, static credentials, no instance
metadata look-ups). :meth:`S3Server.client` is a boto3 client (moto's own dependency) used to
create buckets and upload test data: the code under test never uses it.

Tests use the session fixtures of ``tests/conftest.py`` (``s3``), which import this module.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ACCESS_KEY = "zephon-test-key"
SECRET_KEY = "zephon-test-secret"
REGION = "us-east-1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """moto's S3 server on ``127.0.0.1:port`` (a subprocess; :meth:`stop` ends it)."""

    def __init__(self, log_dir: Path, *, auth: bool = False, timeout: float = 30.0) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"moto-{self.port}.log"
        env = {**os.environ, "MOTO_PORT": str(self.port)}
        if auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited early:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"moto server did not start:\n{self.output()}") from None
                time.sleep(0.1)

    def output(self) -> str:
        """The server's log so far."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """Variables that point the AWS SDK at this server (or at ``endpoint``, a proxy)."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client of this server (test set-up only)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def bucket(self, name: str, *, versioned: bool = False) -> str:
        """Create bucket ``name`` (if needed); returns it."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        if versioned:
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    def upload_tree(self, root: Path, bucket: str, prefix: str) -> list[str]:
        """Upload every file below ``root`` to ``s3://bucket/prefix/<relative path>``."""
        client = self.client()
        keys = []
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            key = f"{prefix.rstrip('/')}/{path.relative_to(root).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
            keys.append(key)
        return keys

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Write one object."""
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
