"""The scenarios of ``tests/reliability/test_faults.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from zephon_client import DataClient
from zephon_client.channel import DEFAULT_CHANNEL_OPTIONS
from zephon_client.errors import ZephonClientError
from zephon_client.wire import ClosedDocument, decode_batch
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_testing.fault_proxy import FaultProxy
from zephon_testing.infra import free_port
from zephon_testing.servers import ServerProcess, write_config

# Short client keepalive so a black-holed connection is detected in about 2 s.
FAST_KEEPALIVE = (
    ("grpc.keepalive_time_ms", 1_000),
    ("grpc.keepalive_timeout_ms", 1_000),
    ("grpc.http2.ping_timeout_ms", 1_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.max_receive_message_length", 1 << 30),
)


def exact_config(path: Path, corpus_dir: Path, **kwargs: Any) -> Path:
    """``write_config`` with ``batch(drop_last=False)``: no document closes after the last
    batch of a lane, so the wire ledger alone must cover the whole finite corpus; every lane
    runs to its own end (``end_of_data: longest``: the shortest end would close the cut
    batches' documents in the lanes' ends)."""
    kwargs.setdefault("end_of_data", "longest")
    write_config(path, corpus_dir, **kwargs)
    cfg = yaml.safe_load(path.read_text())
    for op in cfg["pipeline"]:
        if "batch" in op:
            op["batch"]["drop_last"] = False
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Reference:
    """An uninterrupted in-process run: per lane the chain digests and closed documents."""

    chains: dict[int, list[str]]
    closed: dict[int, list[tuple[ClosedDocument, ...]]]
    tail: list[ClosedDocument]
    documents: set[tuple[int, int, int, int]]

    @property
    def batches(self) -> int:
        return sum(len(c) for c in self.chains.values())

    def check_covers_corpus(self) -> None:
        """Every document is closed exactly once by some batch (no tail after the last batch
        of a lane): then a ledger equal to this reference closed the whole corpus once."""
        assert not self.tail, self.tail[:5]
        closed = Counter(
            (c.dataset, c.shard, c.row, c.epoch)
            for lane in self.closed.values()
            for docs in lane
            for c in docs
        )
        assert set(closed) == self.documents and set(closed.values()) == {1}


def reference_run(config: Path) -> Reference:
    """Run ``config`` inline, as the wire would carry it (``batch_to_proto``)."""
    from zephon_server.engine.config import load_config
    from zephon_server.engine.execution import ExecutionConfig
    from zephon_testing.wire_oracle import batch_to_proto

    pipeline, _ = load_config(config)
    run = pipeline.run(ExecutionConfig(runner="inline"))
    chains: dict[int, list[str]] = {}
    closed: dict[int, list[tuple[ClosedDocument, ...]]] = {}
    for batch in run.batches():
        msg = decode_batch(batch_to_proto(batch))
        chains.setdefault(msg.lane, []).append(msg.chain_digest.hex())
        closed.setdefault(msg.lane, []).append(tuple(msg.closed))
    tail = [
        ClosedDocument(*doc, meta.tombstone)
        for log in run.logs.values()
        for meta in log.tail_tombstones
        for doc in meta.closes
    ]
    documents = {
        (d.index, s, row, 0)
        for d in run.plan.datasets
        for s, shard in enumerate(d.shards)
        for row in range(shard.num_rows)
    }
    return Reference(chains, closed, tail, documents)


@dataclass
class Ledger:
    """What a trainer saw: every (lane, seq), its chain digest and the documents it closed."""

    seqs: Counter = field(default_factory=Counter)
    chains: dict[tuple[int, int], str] = field(default_factory=dict)
    closed: Counter = field(default_factory=Counter)

    def add(self, batch: Any) -> None:
        key = (batch.lane, batch.seq)
        self.seqs[key] += 1
        self.chains[key] = batch.chain_digest.hex()
        self.closed.update(batch.closed)

    @property
    def batches(self) -> int:
        return sum(self.seqs.values())

    def check(self, ref: Reference, lanes: list[int] | None = None) -> dict[str, Any]:
        """Compare with the reference; returns counts (all zero when exact)."""
        lanes = sorted(ref.chains) if lanes is None else lanes
        expected = {(lane, s) for lane in lanes for s in range(len(ref.chains.get(lane, [])))}
        duplicated = sum(n - 1 for n in self.seqs.values() if n > 1)
        lost = len(expected - set(self.seqs))
        unexpected = len(set(self.seqs) - expected)
        chain_mismatches = [
            key
            for key in sorted(expected & set(self.chains))
            if self.chains[key] != ref.chains[key[0]][key[1]]
        ]
        want: Counter = Counter()
        for lane in lanes:
            for docs in ref.closed.get(lane, []):
                want.update(docs)
        docs_lost = sum((want - self.closed).values())
        docs_duplicated = sum((self.closed - want).values())
        return {
            "batches": self.batches,
            "lost": lost,
            "duplicated": duplicated,
            "unexpected": unexpected,
            "chain_mismatches": len(chain_mismatches),
            "docs_closed": sum(self.closed.values()),
            "docs_lost": docs_lost,
            "docs_duplicated": docs_duplicated,
        }


def delivering_stream(client: DataClient) -> Any:
    """The lane stream that delivered the batch yielded last (for recovery timing)."""
    pending = getattr(client, "_pending", None)
    return pending.stream if pending is not None else None


def proc_stats(pid: int) -> dict[str, int]:
    """RSS (bytes), threads and open file descriptors of a process, from /proc."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss": rss, "threads": threads, "fds": fds}


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the direct children of ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out.append((int(entry), cmd))
    return out


def health_status(address: str, timeout: float = 5.0) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_until(predicate, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


@dataclass(frozen=True)
class KillPoint:
    after_batches: int  # consumed batches (all lanes) before the kill
    delay_ms: int  # extra wait, while the lanes keep streaming into the client's queues
    during_checkpoint: bool  # kill while the trainer's Checkpoint RPC is in flight


def _state_server_args(config: Path, workdir: Path, *, resume: bool) -> tuple[list[str], Path]:
    """Creates ``workdir``; the arguments of a server on a free port with a fresh state
    directory (resuming its latest checkpoint when ``resume``), and that directory."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    state = workdir / f"state-{time.monotonic_ns()}"
    args = ["--config", str(config), "--state-dir", str(state)]
    args += ["--resume", "latest"] if resume else []
    return [*args, "--port", str(port)], state


def _client_of(srv: ServerProcess, **kwargs: Any) -> DataClient:
    """A DataClient of ``srv``; kills the server if it cannot be made."""
    try:
        return DataClient(srv.address, **kwargs)
    except BaseException:
        srv.kill()
        raise


def _checkpoint(client: DataClient, tag: str) -> None:
    """The trainer's periodic checkpoint: at what it consumed."""
    client.mark_consumed()
    client.checkpoint(tag=tag)


class _Recovery:
    """Times from a fault to the first batch a stream opened after it delivered."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.old_streams: set[int] = set()
        self.times: list[float] = []

    def fault(self, client: DataClient) -> float:
        """The fault happens now (returned): the client's current streams are the old ones."""
        run = getattr(client, "_run", None)
        self.old_streams = {id(s) for s in run.streams.values()} if run else set()
        self.since = time.monotonic()
        return self.since

    def delivered(self, client: DataClient) -> None:
        """After each batch: was it the first one from a new stream since the fault?"""
        if self.since is not None:
            stream = delivering_stream(client)
            if stream is not None and id(stream) not in self.old_streams:
                self.times.append(time.monotonic() - self.since)
                self.since = None


class _KilledServer:
    """The kill scenario's server: SIGKILLed and restarted with the same arguments (port,
    state directory, ``--resume latest``)."""

    def __init__(self, args: list[str], workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.srv = ServerProcess(args, workdir)
        self.restarts: list[float] = []

    def kill_and_restart(self, client: DataClient, recovery: _Recovery) -> None:
        killed_at = recovery.fault(client)
        self.srv.kill()
        self.srv = ServerProcess(self.args, self.workdir)
        self.restarts.append(time.monotonic() - killed_at)

    def kill_at(self, client: DataClient, recovery: _Recovery, point: KillPoint, n: int) -> None:
        """Kill ``point.delay_ms`` after the ``n``-th batch, during a Checkpoint RPC if asked."""
        time.sleep(point.delay_ms / 1000)
        if point.during_checkpoint:
            client.mark_consumed()
            killer = threading.Thread(target=self.kill_and_restart, args=(client, recovery))
            killer.start()
            client.checkpoint(tag=f"during{n}")  # retried on UNAVAILABLE
            killer.join(60)
        else:
            self.kill_and_restart(client, recovery)


def _read_through_kills(
    client: DataClient,
    server: _KilledServer,
    ref: Reference,
    plan: list[KillPoint],
    recovery: _Recovery,
    checkpoint_every: int,
    deadline: float,
) -> Ledger:
    """Read every lane to its end, killing the server at ``plan`` (popped as reached) and
    checkpointing every ``checkpoint_every`` batches in between."""
    ledger = Ledger()
    for consumed, batch in enumerate(client, 1):
        ledger.add(batch)
        recovery.delivered(client)
        assert time.monotonic() < deadline, "kill scenario took too long"
        assert consumed <= 2 * ref.batches, "more batches than the corpus holds"
        if plan and consumed >= plan[0].after_batches:
            server.kill_at(client, recovery, plan.pop(0), consumed)
        elif consumed % checkpoint_every == 0:
            _checkpoint(client, f"b{consumed}")
    return ledger


def run_kill_scenario(
    config: Path,
    ref: Reference,
    workdir: Path,
    kills: list[KillPoint],
    *,
    checkpoint_every: int = 6,
    runner: str = "threads",
    time_limit: float = 240.0,
) -> dict[str, Any]:
    """Stream every lane with one DataClient while SIGKILLing the server at ``kills``.

    After each kill the server restarts on the same port with ``--resume latest`` and the
    same state directory; the client (alive all along) reconnects on UNAVAILABLE and
    continues at its consumed positions. Returns the ledger check plus timings.
    """
    args, state = _state_server_args(config, workdir, resume=True)
    server = _KilledServer([*args, "--runner", runner], workdir)
    plan = sorted(kills, key=lambda k: k.after_batches)
    recovery = _Recovery()
    started = time.monotonic()
    client = _client_of(server.srv, reconnect_timeout=60, rpc_timeout=30)
    try:
        client.checkpoint(tag="start")
        figures = _read_through_kills(
            client, server, ref, plan, recovery, checkpoint_every, started + time_limit
        ).check(ref)
    finally:
        client.close()
        code = server.srv.terminate()
    assert code == 0, server.srv.output()[-3000:]
    # the restarts resumed with the replay cache the killed servers wrote (on by default)
    assert any((state / "replay-cache").rglob("*.tok")), "no replay cache under --state-dir"
    figures.update(
        kills=len(kills) - len(plan),
        restart_s=server.restarts,
        recovery_s=recovery.times,
        elapsed_s=time.monotonic() - started,
    )
    return figures


def assert_exact_counts(figures: dict[str, Any]) -> None:
    for key in ("lost", "duplicated", "unexpected", "chain_mismatches", "docs_lost"):
        assert figures[key] == 0, figures
    assert figures["docs_duplicated"] == 0, figures


_WRITER = r"""
import os, signal, sys, time
from zephon_server.engine.checkpoint import CheckpointStore, write_atomic
mode, directory, a_path, b_path, stage = sys.argv[1:6]
a, b = open(a_path, "rb").read(), open(b_path, "rb").read()
if stage != "-":
    # Deterministic kill points inside write_atomic: before the data fsync, before the
    # rename, before the directory fsync.
    calls = {"fsync": 0}
    real_fsync, real_replace = os.fsync, os.replace
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    def fsync(fd):
        calls["fsync"] += 1
        if (stage == "data-fsync" and calls["fsync"] == 1) or (
            stage == "dir-fsync" and calls["fsync"] == 2
        ):
            die()
        real_fsync(fd)
    def replace(src, dst):
        if stage == "rename":
            die()
        real_replace(src, dst)
    os.fsync, os.replace = fsync, replace
store = CheckpointStore(directory)
print("ready", flush=True)
deadline = time.monotonic() + 30
for i in range(100_000):
    if time.monotonic() > deadline:
        break
    data = b if i % 2 == 0 else a
    if mode == "overwrite":
        write_atomic(os.path.join(directory, "ckpt-00000001.zck"), data)
    else:
        from zephon_server.engine.checkpoint import ResumeState
        store.save(ResumeState.decode(data))
"""


def checkpoint_pair(lanes: int = 2000) -> tuple[bytes, bytes]:
    """Two valid checkpoints of different sizes and contents (many lanes: slow writes)."""
    from zephon_server.engine.checkpoint import LaneState, ResumeState

    def state(n: int, tag: str) -> bytes:
        lane_states = {
            i: LaneState(n + i, 0, {"pad": "x" * 200}, (i, n), bytes(32)) for i in range(lanes)
        }
        return ResumeState("f" * 64, {"seed": "1"}, lane_states, lanes, tag=tag).encode()

    return state(1, "old"), state(2, "new-and-longer")


def kill_writer(workdir: Path, mode: str, delay_s: float, stage: str = "-") -> dict[str, Any]:
    """Start the writer loop, SIGKILL it (after ``delay_s`` or at ``stage``), then check."""
    workdir.mkdir(parents=True, exist_ok=True)
    from zephon_server.engine.checkpoint import CheckpointStore, ResumeState

    a, b = checkpoint_pair()
    directory = workdir / f"ck-{time.monotonic_ns()}"
    CheckpointStore(directory).save(ResumeState.decode(a))  # the old checkpoint
    a_path, b_path = workdir / "a.bin", workdir / "b.bin"
    a_path.write_bytes(a)
    b_path.write_bytes(b)
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, mode, str(directory), str(a_path), str(b_path), stage],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready", proc.stderr.read()
        if stage == "-":
            time.sleep(delay_s)
            proc.send_signal(signal.SIGKILL)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert code == -signal.SIGKILL
    stray = [p.name for p in directory.glob(".ckpt-*.tmp")]
    store = CheckpointStore(directory)  # cleans temp files
    assert not list(directory.glob("*.tmp")), "stray temp files survived CheckpointStore()"
    loaded = []
    for cid in store.ids():
        data = (directory / f"{cid}.zck").read_bytes()
        assert data in (a, b), f"{cid} is neither the old nor the new checkpoint"
        loaded.append(store.load(cid).tag)
    latest = store.latest()
    assert latest is not None and latest[1].tag in ("old", "new-and-longer")
    return {"stray_temp_files": len(stray), "checkpoints": len(loaded), "latest": latest[1].tag}


def _apply_fault(proxy: FaultProxy, fault: str) -> None:
    """The faults that hold from the start (a black hole comes later, mid-read)."""
    if fault == "latency":
        proxy.set(latency_ms=25)
    elif fault == "bandwidth":
        proxy.set(bandwidth=400_000)
    elif fault == "reset":
        proxy.set(reset_after_bytes=150_000, resets=3)


def _read_through_fault(
    client: DataClient, proxy: FaultProxy, ref: Reference, fault: str, deadline: float
) -> tuple[Ledger, list[float]]:
    """Read every lane to its end through ``proxy``; a black hole is made after a third of
    the batches. Returns the ledger and the times until a new stream delivered."""
    ledger = Ledger()
    recovery = _Recovery()
    for consumed, batch in enumerate(client, 1):
        ledger.add(batch)
        assert time.monotonic() < deadline, f"{fault}: took too long"
        assert consumed <= 2 * ref.batches
        recovery.delivered(client)
        if fault.startswith("blackhole") and consumed == ref.batches // 3:
            recovery.fault(client)
            assert proxy.blackhole() >= 1
    return ledger, recovery.times


def run_network_scenario(
    config: Path, ref: Reference, workdir: Path, fault: str, *, time_limit: float = 90.0
) -> dict[str, Any]:
    """Read every lane through a FaultProxy while ``fault`` is applied; ledger + timings."""
    args, _ = _state_server_args(config, workdir, resume=False)
    # Tight flow control: a stale stream of the dead connection would hold its lane back.
    srv = ServerProcess([*args, "--max-ahead", "4"], workdir)
    try:
        started = time.monotonic()
        with FaultProxy(srv.port) as proxy:
            options = (
                DEFAULT_CHANNEL_OPTIONS if fault.endswith("default-keepalive") else FAST_KEEPALIVE
            )
            # Faults on bytes act on the TCP stream: tensors that travel through a shared-
            # memory ring would pass them by (a reset after N bytes might never come).
            client = DataClient(
                proxy.address,
                reconnect_timeout=30,
                rpc_timeout=30,
                channel_options=options,
                shared_memory=fault.startswith("blackhole"),
            )
            try:
                _apply_fault(proxy, fault)
                ledger, detect = _read_through_fault(
                    client, proxy, ref, fault, started + time_limit
                )
                figures = ledger.check(ref)
            finally:
                client.close()
            figures.update(
                fault=fault,
                connections=proxy.connections,
                resets=proxy.resets,
                detect_s=detect,
                elapsed_s=time.monotonic() - started,
                bytes_down=proxy.bytes_down,
            )
    finally:
        code = srv.terminate()
    assert code == 0, srv.output()[-3000:]
    return figures


def _spawn_workers(srv: ServerProcess) -> list[int]:
    """The pids of the server's spawn worker processes (at least one)."""
    workers = [pid for pid, cmd in children(srv.proc.pid) if "spawn_main" in cmd]
    assert workers, children(srv.proc.pid)
    return workers


def _read_until_a_worker_dies(
    client: DataClient, srv: ServerProcess, ref: Reference, ledger: Ledger
) -> dict[str, Any]:
    """Read (checkpointing every 6 batches) and SIGKILL a worker after the 10th batch; the
    iteration must fail. Returns how long it took, the error's status and message, the pid."""
    victim: int | None = None
    killed_at = 0.0
    error: ZephonClientError | None = None
    try:
        for consumed, batch in enumerate(client, 1):
            ledger.add(batch)
            assert consumed <= 2 * ref.batches
            if consumed % 6 == 0:
                _checkpoint(client, f"b{consumed}")
            if consumed == 10:  # early: the run must still need its workers
                victim = _spawn_workers(srv)[0]
                killed_at = time.monotonic()
                os.kill(victim, signal.SIGKILL)
            assert victim is None or time.monotonic() - killed_at < 30, "no failure seen"
    except ZephonClientError as exc:
        error = exc
    assert error is not None, "the iteration did not fail after the worker was killed"
    return {
        "fail_s": time.monotonic() - killed_at,
        "status": error.code.name if error.code else None,
        "message": error.message,
        "victim": victim,
    }


def _recover(
    recovery: str, client: DataClient, srv: ServerProcess, args: list[str], workdir: Path
) -> ServerProcess:
    """Recover from the dead worker as ``recovery`` says; returns the server now serving."""
    if recovery == "restart":
        code = srv.terminate()
        assert code == 0, srv.output()[-3000:]
        return ServerProcess(args, workdir)  # same port, --resume latest
    own = client.state_dict()  # what the trainer consumed
    latest = client.get_info().checkpoint_ids[-1]
    client.resume(checkpoint_id=latest)  # a new pipeline run, new worker processes
    client.load_state_dict(own)  # continue where the trainer is, not at the checkpoint
    return srv


def run_worker_kill_scenario(
    config: Path, ref: Reference, workdir: Path, recovery: str = "restart", workers: int = 2
) -> dict[str, Any]:
    """SIGKILL one spawn worker while lanes stream; the client's iteration fails with
    INTERNAL naming the worker and health turns NOT_SERVING. Recovery: ``restart`` the server
    with --resume latest, or ``resume`` the latest checkpoint with the Resume RPC (the server
    process stays up) and load the trainer's own state_dict. A new iteration of the same
    client then continues exactly."""
    args, _ = _state_server_args(config, workdir, resume=True)
    args += ["--runner", "processes", "--workers", str(workers)]
    args += ["--max-ahead", "4"]  # production follows consumption: workers are busy at the kill
    srv = ServerProcess(args, workdir)
    ledger = Ledger()
    client = _client_of(srv, reconnect_timeout=30, rpc_timeout=30)
    figures: dict[str, Any] = {}
    try:
        client.checkpoint(tag="start")
        figures.update(_read_until_a_worker_dies(client, srv, ref, ledger))
        figures["health_after"] = health_status(srv.address)
        assert srv.proc.poll() is None, "the server must stay up (NOT_SERVING) after a crash"
        recovered = time.monotonic()
        srv = _recover(recovery, client, srv, args, workdir)
        figures["recover_s"] = time.monotonic() - recovered
        figures["health_recovered"] = health_status(srv.address)
        for consumed, batch in enumerate(client, 1):  # a new iteration: consumed positions
            ledger.add(batch)
            assert consumed <= 2 * ref.batches
        figures.update(ledger.check(ref))
    finally:
        client.close()
        if srv.proc.poll() is None:
            srv.terminate()
    return figures


def _watch_health(channel: grpc.Channel, statuses: queue.Queue) -> None:
    """Puts (time, status) of every health Watch reply on ``statuses``."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    call = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=""), timeout=60
    )
    try:
        for reply in call:
            statuses.put((time.monotonic(), reply.status))
    except grpc.RpcError:
        pass


def _queued(requests: queue.Queue) -> Any:
    """The requests put on ``requests``, until a ``None``."""
    while True:
        item = requests.get()
        if item is None:
            return
        yield item


def _read_until_drained(
    stub: pb_grpc.DataServiceStub,
    lane: int,
    ends: dict[int, tuple[Any, str, float, int]],
    reading: threading.Barrier,
) -> None:
    """Read ``lane`` like a trainer (one step 0.05 s, acked) from the 2nd batch on past the
    ``reading`` barrier; record in ``ends`` how the stream ended: (code, details, time,
    batches received)."""
    requests: queue.Queue = queue.Queue()
    requests.put(pb.StreamBatchesRequest(open=pb.OpenLane(lane=lane, consumer=f"d{lane}")))
    got = 0
    call = stub.StreamBatches(_queued(requests), timeout=60)
    try:
        for resp in call:
            if resp.WhichOneof("kind") == "end":
                ends[lane] = (grpc.StatusCode.OK, "end of lane", time.monotonic(), got)
                return
            got += 1
            if got == 2:
                reading.wait()
            time.sleep(0.05)  # a trainer step: the stream stays busy mid-lane
            requests.put(pb.StreamBatchesRequest(ack=pb.Ack(next_seq=resp.batch.seq + 1)))
        ends[lane] = (grpc.StatusCode.OK, "closed without EndOfStream", time.monotonic(), got)
    except grpc.RpcError as exc:
        ends[lane] = (exc.code(), exc.details() or "", time.monotonic(), got)
    finally:
        requests.put(None)


def _sigterm_when_serving(
    srv: ServerProcess, statuses: queue.Queue, grace: float
) -> tuple[float, float | None]:
    """Once the Watch reported SERVING, SIGTERM the server; returns when the signal was sent
    and how long until the Watch reported NOT_SERVING (None: not within ``grace``)."""
    from grpc_health.v1 import health_pb2

    first = statuses.get(timeout=10)
    assert first[1] == health_pb2.HealthCheckResponse.SERVING
    sent = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    not_serving = None
    with contextlib.suppress(queue.Empty):
        while not_serving is None:
            at, status = statuses.get(timeout=grace)
            if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                not_serving = at - sent
    return sent, not_serving


def run_drain_scenario(config: Path, workdir: Path, grace: float = 5.0) -> dict[str, Any]:
    """Four lane streams and a health Watch; SIGTERM; figures of what each observed."""
    workdir.mkdir(parents=True, exist_ok=True)
    srv = ServerProcess(["--config", str(config), "--drain-grace", str(grace)], workdir)
    channel = grpc.insecure_channel(srv.address)
    stub = pb_grpc.DataServiceStub(channel)
    statuses: queue.Queue = queue.Queue()
    ends: dict[int, tuple[Any, str, float, int]] = {}
    reading = threading.Barrier(5, timeout=30)
    threads = [threading.Thread(target=_watch_health, args=(channel, statuses), daemon=True)]
    threads += [
        threading.Thread(target=_read_until_drained, args=(stub, lane, ends, reading), daemon=True)
        for lane in range(4)
    ]
    for t in threads:
        t.start()
    try:
        reading.wait()  # every lane is mid-stream
        sent, not_serving = _sigterm_when_serving(srv, statuses, grace)
        code = srv.proc.wait(grace + 10)
        exited = time.monotonic() - sent
        for t in threads[1:]:
            t.join(10)
    finally:
        channel.close()
        srv.kill()
    return {
        "exit_code": code,
        "exit_s": exited,
        "not_serving_s": not_serving,
        "streams": {lane: (c.name, d, at - sent, n) for lane, (c, d, at, n) in ends.items()},
        "log": srv.output(),
    }
