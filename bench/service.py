"""Service measurements: a ``zephon serve`` subprocess on loopback and trainer-client processes.

Throughput (:func:`service_throughput`): the client processes start first and wait for the
server's port file, then the server starts. It serves the fixed work: ``python -m bench.service
serve`` is ``zephon serve`` with one change, the hub's runs get the engine's
``max_chunks_per_lane`` (the same limit the in-process runs use), so every lane ends after the
fixed work and the server's lookahead and shuffle buffers drain into the measurement. The
clock starts when the hub constructs its run (written to a file by the wrapper; the in-process
runs start theirs at the same point) and stops at the last batch any client receives. Each
client is a ``zephon_client.DataClient`` (digests verified, as a trainer would) counting
non-padding tokens (``padding_mask``).

Checkpoint RPC (:func:`checkpoint_rpc`): the unmodified ``python -m zephon_server.cli serve``
with a state directory; a client reads a few batches of every lane, then times 10
``Checkpoint`` round trips (each persists a file atomically).

Every process started here is stopped in a ``finally`` (SIGTERM, then SIGKILL) and asks the
kernel to SIGTERM it should the benchmark die first. All traffic is on 127.0.0.1 and every
port is picked by the kernel (``--port 0`` with ``--port-file``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("bench")

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 300.0  # server start-up: imports, dataset indexing, tokenizer load


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the benchmark process dies (Linux; best effort)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(
    args: list[str],
    log_path: Path,
    env: dict[str, str | None] | None = None,
    program: str = sys.executable,
) -> subprocess.Popen[bytes]:
    """A child (``program args...``, default this Python) logging to ``log_path``; ``env``
    changes its environment (None removes a variable)."""
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath()}
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    out = open(log_path, "wb")  # noqa: SIM115 - the child keeps it; closed when we drop it
    try:
        return subprocess.Popen(
            [program, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            cwd=REPO,
            env=child_env,
        )
    finally:
        out.close()


def _pythonpath() -> str:
    """PYTHONPATH with the repository first, so children import this ``bench`` package."""
    parts = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(parts))


def stop(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int | None:
    """SIGTERM, wait, SIGKILL: the process is gone afterwards. Returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class ServerProcess:
    """A running server; ``address`` once the port file appeared. Samples its RSS and CPU."""

    def __init__(
        self, args: list[str], run_dir: Path, env: dict[str, str | None] | None = None
    ) -> None:
        self.run_dir = run_dir
        self.port_file = run_dir / "port"
        self.log_path = run_dir / "server.log"
        self.started = time.time()
        self.proc = spawn(args, self.log_path, env=env)
        self.rss_peak = 0
        self.cpu_seconds = 0.0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        import psutil

        try:
            proc = psutil.Process(self.proc.pid)
            while not self._done.wait(0.1):
                self.rss_peak = max(self.rss_peak, proc.memory_info().rss)
                t = proc.cpu_times()
                self.cpu_seconds = t.user + t.system
        except psutil.Error:
            pass

    def wait_ready(self, timeout: float = START_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while not (self.port_file.exists() and self.port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server did not start in {timeout}s:\n{tail(self.log_path)}")
            time.sleep(0.01)
        return self.address

    @property
    def address(self) -> str:
        return f"{HOST}:{int(self.port_file.read_text())}"

    def stop(self) -> int | None:
        self._done.set()
        self._sampler.join(2)
        return stop(self.proc)


@contextlib.contextmanager
def server(
    args: list[str], run_dir: Path, env: dict[str, str | None] | None = None
) -> Iterator[ServerProcess]:
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = ServerProcess(args, run_dir, env)
    try:
        yield proc
    finally:
        proc.stop()


def serve_args(
    work: Any,
    run_dir: Path,
    *,
    limited: bool,
    state_dir: Path | None = None,
    extra: Sequence[str] = (),
):
    """Command line of a benchmark server (the wrapper when ``limited``); ``extra``: more
    ``zephon serve`` flags."""
    base = [
        "--config",
        work.config,
        "--host",
        HOST,
        "--port",
        "0",
        "--port-file",
        str(run_dir / "port"),
        "--log-interval",
        "0",
    ]
    if state_dir is not None:
        base += ["--state-dir", str(state_dir)]
    base += list(extra)
    if not limited:
        return ["-m", "zephon_server.cli", "serve", *base]
    return [
        "-m",
        "bench.service",
        "serve",
        "--max-chunks-per-lane",
        str(work.chunks_per_lane),
        "--t0-file",
        str(run_dir / "t0"),
        "--",
        *base,
    ]


def service_throughput(
    work: Any,
    ranks: int,
    run_dir: Path,
    *,
    state_dir: bool = False,
    env: dict[str, str | None] | None = None,
    server_args: Sequence[str] = (),
) -> dict[str, Any]:
    """The fixed work over loopback gRPC to ``ranks`` client processes (see the docstring).

    ``state_dir``: serve with ``--state-dir`` (a fresh one), which turns on the replay cache,
    as ``make run`` and the container do. ``env``: environment changes for the server and
    the clients (see :func:`spawn`). ``server_args``: more ``zephon serve`` flags."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("port", "t0"):
        (run_dir / name).unlink(missing_ok=True)
    clients: list[subprocess.Popen[bytes]] = []
    outs = [run_dir / f"client{r}.json" for r in range(ranks)]
    for out in outs:
        out.unlink(missing_ok=True)
    try:
        for rank, out in enumerate(outs):
            args = ["-m", "bench.service", "client", "--port-file", str(run_dir / "port")]
            args += ["--rank", str(rank), "--world-size", str(ranks), "--out", str(out)]
            clients.append(spawn(args, run_dir / f"client{rank}.log", env=env))
        state = run_dir / "state"
        if state.exists():
            shutil.rmtree(state)
        args = serve_args(
            work, run_dir, limited=True, state_dir=state if state_dir else None, extra=server_args
        )
        with server(args, run_dir, env) as srv:
            deadline = time.monotonic() + START_TIMEOUT + 3600
            while any(c.poll() is None for c in clients):
                if srv.proc.poll() is not None:
                    raise RuntimeError(f"server exited during the run:\n{tail(srv.log_path)}")
                if time.monotonic() > deadline:
                    raise TimeoutError("service run did not finish in time")
                time.sleep(0.05)
            server_cpu, server_rss = srv.cpu_seconds, srv.rss_peak
            started = srv.started
        for rank, c in enumerate(clients):
            if c.returncode != 0:
                raise RuntimeError(
                    f"client {rank} failed ({c.returncode}):\n{tail(run_dir / f'client{rank}.log')}"
                )
    finally:
        for c in clients:
            stop(c, 5)
    results = [json.loads(out.read_text()) for out in outs]
    events = sorted(e for r in results for e in r.pop("progress"))
    progress, total = [], 0
    for t, n in events:
        total += n
        progress.append((t, total))
    start = json.loads((run_dir / "t0").read_text())
    t0 = start["time"]
    t_end = max(r["t_last"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    seconds = t_end - t0
    client_cpu = sum(r["cpu"] for r in results)
    return {
        "ranks": ranks,
        "tokens": tokens,
        "batches": sum(r["batches"] for r in results),
        "seconds": seconds,
        "rate": tokens / seconds,
        "steady_rate": steady_rate(progress),
        "ttfb": min(r["t_first"] for r in results) - started,
        "ttfb_from_run_start": min(r["t_first"] for r in results) - t0,
        "server_start": t0 - started,
        "server_start_cpu": start["cpu"],
        "server_rss_peak": server_rss,
        # CPU of the measured window: the server's total minus its start-up (before t0),
        # like the in-process rows, which start counting at run construction.
        "server_cpu": server_cpu - start["cpu"],
        "server_cpu_total": server_cpu,
        "client_cpu": client_cpu,
        "cores": (server_cpu - start["cpu"] + client_cpu) / seconds,
        "clients": results,
    }


def steady_rate(progress: list[tuple[float, int]]) -> float:
    from .measure import steady_rate as rate

    return rate(progress)


def checkpoint_rpc(work: Any, run_dir: Path, batches_per_lane: int = 8) -> dict[str, Any]:
    """Checkpoint RPC size and round-trip latency (median of 10) on a plain ``zephon serve``."""
    from zephon_client import DataClient

    state_dir = run_dir / "state"
    (run_dir / "port").unlink(missing_ok=True)
    args = serve_args(work, run_dir, limited=False, state_dir=state_dir)
    with server(args, run_dir) as srv:
        address = srv.wait_ready()
        with DataClient(address, rank=0, world_size=1) as client:
            lanes = len(client.lanes)
            it = iter(client)
            for _ in range(batches_per_lane * lanes):
                next(it)
            client.mark_consumed()
            latencies, sizes = [], []
            for i in range(10):
                t0 = time.perf_counter()
                info = client.checkpoint(tag=f"bench{i}")
                latencies.append(time.perf_counter() - t0)
                sizes.append(len(info.state))
            positions = info.positions
    return {
        "lanes": lanes,
        "positions": positions,
        "checkpoint_bytes": sizes[-1],
        "checkpoint_bytes_per_lane": sizes[-1] / lanes,
        "latency_median": statistics.median(latencies),
        "latency_max": max(latencies),
        "latencies": latencies,
    }


# -- child entry points --------------------------------------------------------------------


def serve_main(argv: list[str]) -> int:
    """``zephon serve`` whose hub runs stop every lane after ``--max-chunks-per-lane`` chunks."""
    parser = argparse.ArgumentParser(prog="python -m bench.service serve")
    parser.add_argument("--max-chunks-per-lane", type=int, default=None)
    parser.add_argument(
        "--t0-file",
        default=None,
        help="write {time: time.time(), cpu: process CPU seconds} at run start here",
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then zephon serve flags")
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest

    from zephon_server.cli import main
    from zephon_server.delivery import hub as hub_module
    from zephon_server.engine.run import PipelineRun

    if getattr(hub_module, "PipelineRun", None) is not PipelineRun:
        raise SystemExit("bench: LaneHub no longer builds runs with run.PipelineRun; fix bench")
    limit, t0_file = args.max_chunks_per_lane, args.t0_file

    class BenchRun(PipelineRun):
        def __init__(self, *a: Any, **kw: Any) -> None:
            if limit:
                kw.setdefault("max_chunks_per_lane", limit)
            if t0_file and not os.path.exists(t0_file):
                cpu = sum(os.times()[:2])  # start-up: imports, dataset indexing, plan
                Path(t0_file).write_text(json.dumps({"time": time.time(), "cpu": cpu}))
            super().__init__(*a, **kw)

    hub_module.PipelineRun = BenchRun  # type: ignore[misc]
    return main(["serve", *rest])


def client_main(argv: list[str]) -> int:
    """One trainer rank: wait for the port file, read every batch of its lanes, report."""
    parser = argparse.ArgumentParser(prog="python -m bench.service client")
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import numpy as np

    from zephon_client import DataClient

    port_file = Path(args.port_file)
    deadline = time.monotonic() + START_TIMEOUT
    while not (port_file.exists() and port_file.read_text().strip()):
        if time.monotonic() > deadline:
            raise SystemExit("client: no server port file")
        time.sleep(0.005)
    address = f"{HOST}:{int(port_file.read_text())}"
    cpu0 = sum(os.times()[:2])
    t_first = t_last = 0.0
    tokens = batches = 0
    progress: list[tuple[float, int]] = []  # (time, tokens of this batch)
    with DataClient(address, rank=args.rank, world_size=args.world_size) as client:
        for batch in client:
            now = time.time()
            if not batches:
                t_first = now
            t_last = now
            n = int(np.count_nonzero(batch.tensors["padding_mask"]))
            tokens += n
            batches += 1
            progress.append((now, n))
        lanes = client.lanes
    result = {
        "rank": args.rank,
        "lanes": lanes,
        "tokens": tokens,
        "batches": batches,
        "t_first": t_first,
        "t_last": t_last,
        "cpu": sum(os.times()[:2]) - cpu0,
        "progress": progress,
    }
    Path(args.out).write_text(json.dumps(result) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if argv[:1] == ["serve"]:
        return serve_main(argv[1:])
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    print("usage: python -m bench.service {serve|client} ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
