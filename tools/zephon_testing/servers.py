"""Running real servers for tests: ``zephon serve`` subprocesses on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import yaml

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc


def write_config(
    path: Path,
    corpus_dir: Path,
    *,
    lanes=4,
    chunk_size=16,
    k=2,
    seed=1234,
    extra_ops=(),
    batch=4,
    exhaustion="stop",
    end_of_data: str | None = None,
) -> Path:
    """A YAML pipeline over the test corpus (pack + shuffle by default); ``end_of_data`` is
    written only when given (unset: the default, ``shortest``)."""
    ops = [{"decode_text": {}}, {"tokenize": {"tokenizer": "byte"}}]
    ops += list(extra_ops) or [{"pack_flat": {"max_length": 256}}, {"shuffle": {"buffer_size": 8}}]
    ops.append({"batch": {"microbatch_size": batch}})
    cfg = {
        "seed": seed,
        "lanes": lanes,
        "chunk_size": chunk_size,
        "flush_every_k_chunks": k,
        "datasets": [
            {
                "name": "web",
                "path": str(corpus_dir / "web"),
                "weight": 0.5,
                "exhaustion": exhaustion,
            },
            {
                "name": "books",
                "path": str(corpus_dir / "books"),
                "weight": 0.3,
                "exhaustion": exhaustion,
            },
            {
                "name": "code",
                "path": str(corpus_dir / "code"),
                "weight": 0.2,
                "text_field": "content",
                "exhaustion": exhaustion,
            },
        ],
        "pipeline": ops,
        "execution": {"runner": "threads", "workers": 2},
    }
    if end_of_data is not None:
        cfg["end_of_data"] = end_of_data
    path.write_text(yaml.safe_dump(cfg))
    return path


PYTHON_CLI = (sys.executable, "-m", "zephon_server.cli")
"""The ``zephon`` program as this Python runs it (the installed ``zephon`` launcher aside)."""


class ServerProcess:
    """A ``zephon serve`` subprocess; ``address`` is host:port once started. ``command`` runs
    the program (default :data:`PYTHON_CLI`; the installed ``zephon`` launcher, say)."""

    def __init__(
        self,
        args: list[str],
        workdir: Path,
        env: dict | None = None,
        command: Sequence[str] = PYTHON_CLI,
    ) -> None:
        self.port_file = workdir / f"port-{time.monotonic_ns()}"
        self.log_path = workdir / f"server-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [
            *command,
            "serve",
            "--port",
            "0",
            "--port-file",
            str(self.port_file),
            "--log-interval",
            "1",
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 120
        while not self.port_file.exists() or not self.port_file.read_text().strip():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server did not start:\n{self.output()}")
            time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        self.address = f"127.0.0.1:{self.port}"

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stub(self) -> pb_grpc.DataServiceStub:
        return pb_grpc.DataServiceStub(grpc.insecure_channel(self.address))

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self.log.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@contextlib.contextmanager
def server(
    args: list[str],
    workdir: Path,
    env: dict | None = None,
    command: Sequence[str] = PYTHON_CLI,
) -> Iterator[ServerProcess]:
    """A running server for the ``with`` block; checks it exits 0 on SIGTERM."""
    proc = ServerProcess(args, workdir, env, command)
    try:
        yield proc
    finally:
        if proc.proc.poll() is None:
            code = proc.terminate()
            assert code == 0, f"server exit code {code}:\n{proc.output()[-3000:]}"


def serve_once(
    args: list[str], workdir: Path, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``zephon serve`` expected to fail at start-up (bounded); ``env`` adds variables."""
    return subprocess.run(
        [sys.executable, "-m", "zephon_server.cli", "serve", "--port", "0", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


def open_request(lane: int, start_seq: int = 0, consumer: str = "test", per_message: int = 0):
    return pb.StreamBatchesRequest(
        open=pb.OpenLane(
            lane=lane,
            start_seq=start_seq,
            consumer=consumer,
            max_batches_per_message=per_message,
        )
    )


def response_batches(resp) -> list:
    """The ``SampleBatch`` messages of a response: one, or a ``BatchGroup``'s."""
    kind = resp.WhichOneof("kind")
    if kind == "batch":
        return [resp.batch]
    if kind == "batches":
        return list(resp.batches.batches)
    raise AssertionError(f"not a batch response: {kind}")


def read_lane(
    stub,
    lane: int,
    start_seq: int = 0,
    count: int | None = None,
    consumer: str = "reader",
    ack: bool = True,
    per_message: int = 0,
    sizes: list[int] | None = None,
) -> tuple[list, object]:
    """Read ``count`` batches (or to the end) of a lane with a raw stub, accepting up to
    ``per_message`` batches per message (``sizes`` collects each message's batch count).

    Returns ``(batches, end)`` where batches are ``pb.SampleBatch`` and ``end`` is the
    ``EndOfStream`` message or None when stopped by ``count``.
    """
    import queue

    requests: queue.Queue = queue.Queue()
    requests.put(open_request(lane, start_seq, consumer, per_message))

    def gen():
        while True:
            item = requests.get()
            if item is None:
                return
            yield item

    batches: list = []
    end = None
    call = stub.StreamBatches(gen(), timeout=120)
    try:
        for resp in call:
            if resp.WhichOneof("kind") == "end":
                end = resp.end
                break
            got = response_batches(resp)
            if sizes is not None:
                sizes.append(len(got))
            batches.extend(got)
            if ack:
                requests.put(pb.StreamBatchesRequest(ack=pb.Ack(next_seq=got[-1].seq + 1)))
            if count is not None and len(batches) >= count:
                break
    finally:
        requests.put(None)
        call.cancel()
    return batches, end


def lane_digests(srv, lanes: int) -> dict[int, list[bytes]]:
    """Every lane's chain digests, read to its end from a running server."""
    out = {}
    for lane in range(lanes):
        batches, end = read_lane(srv.stub(), lane)
        assert end is not None
        out[lane] = [b.chain_digest for b in batches]
    return out


def dump_digests(config: Path, batches: int, lanes: str | None = None) -> dict[int, list[str]]:
    """``zephon dump --format digest`` as {lane: [chain hex]}."""
    args = [
        sys.executable,
        "-m",
        "zephon_server.cli",
        "dump",
        "--config",
        str(config),
        "--format",
        "digest",
        "--batches",
        str(batches),
        "--runner",
        "inline",
    ]
    if lanes:
        args += ["--lanes", lanes]
    res = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    out: dict[int, list[str]] = {}
    for line in res.stdout.splitlines():
        lane, seq, digest = line.split()
        out.setdefault(int(lane), []).append(digest)
        assert len(out[int(lane)]) == int(seq) + 1
    return out
