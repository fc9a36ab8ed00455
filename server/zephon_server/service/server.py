"""``zephon serve``: host a pipeline over gRPC with health, reflection and metrics.

Start-up: load the pipeline (``--config``, ``--pipeline`` or the embedded default), check the
TLS files and the address (:mod:`.listen`), open the state directory, restore ``--resume``
(``latest``, ``latest-or-fresh``, a checkpoint id or a file; signed ones only with a checkpoint
key), start the hub, then serve. A requested resume never becomes a silent fresh start. A
SIGTERM/SIGINT before the hub starts stops the start-up (exit 0, :mod:`..stop_signals`);
afterwards it drains: health turns NOT_SERVING at once, open streams end with UNAVAILABLE
(clients reconnect elsewhere or later), and the process exits 0 within ``--drain-grace``
seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from zephon_proto.v1 import data_service_pb2 as pb

from .. import gc_policy
from ..allocator import CHOICES as ALLOCATORS
from ..allocator import ENV as ALLOCATOR_ENV
from ..cli import CHECKPOINT_KEY_ENV, checkpoint_key_from_args
from ..engine import shm_owner
from ..engine.cache_budget import CacheBudget
from ..engine.checkpoint import (
    CHECKPOINT_ID,
    CheckpointStore,
    NoUsableCheckpoint,
    ResumeState,
    read_state_file,
)
from ..engine.checkpoint_key import CheckpointKey
from ..engine.errors import ZephonError
from ..engine.hub import LaneHub
from ..engine.lane_ends import check_served
from ..engine.replay_cache import ReplayCache
from ..stop_signals import StopSignals
from .auth import TokenAuthInterceptor
from .listen import check_tls_files, listen_problem
from .malformed import MalformedRequestInterceptor
from .metrics import ServiceMetrics
from .metrics_http import MetricsHTTPServer, add_metrics_arguments, config_from_args, describe
from .ring import DEFAULT_MAX_MIB, sweep_stale
from .servicer import LINGER, DataService, add_to_server

log = logging.getLogger("zephon.serve")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DataService"].full_name
DEFAULT_MAX_REPLAYS = 4


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``zephon serve`` (binding names)."""
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50051, help="gRPC port (0: pick a free one)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics on this port (default: off)",
    )
    add_metrics_arguments(p)
    p.add_argument("--state-dir", default=None, help="directory for checkpoints")
    p.add_argument(
        "--keep-checkpoints",
        type=int,
        default=0,
        metavar="N",
        help="after each checkpoint, delete all but the newest N in --state-dir (default 0: "
        "keep all)",
    )
    p.add_argument(
        "--replay-cache",
        default=None,
        help="directory caching tokenizer output so a resume need not tokenize again "
        "(default: <state-dir>/replay-cache with --state-dir; 'off' disables it)",
    )
    p.add_argument(
        "--replay-cache-epochs",
        type=int,
        default=2,
        help="epochs (flush_every_k_chunks chunks) per lane the replay cache keeps (default 2)",
    )
    p.add_argument(
        "--resume",
        default=None,
        help="'latest' (the newest usable checkpoint in --state-dir; fresh when it holds none, "
        "a start-up failure when every one is refused), 'latest-or-fresh' (also fresh when "
        "every one is refused), a checkpoint id from --state-dir, or a checkpoint file",
    )
    p.add_argument(
        "--lanes", default=None, help="serve only these lanes, e.g. 0-3 (lane-sharded servers)"
    )
    p.add_argument("--max-streams", type=int, default=256, help="open StreamBatches limit")
    p.add_argument(
        "--max-ahead",
        type=int,
        default=32,
        help="batches a lane may run ahead of its slowest consumer; its log then holds at most "
        "N + max(8, N/2) unacknowledged batches, whatever the documents",
    )
    p.add_argument(
        "--linger-ms",
        type=float,
        default=LINGER * 1000,
        help="after a stream's first message, how long it waits for more batches to send "
        "together in one message, for clients that take groups (default "
        f"{LINGER * 1000:g}; 0: send what is ready at once)",
    )
    p.add_argument(
        "--shm-ring-mib",
        type=int,
        default=DEFAULT_MAX_MIB,
        help="largest shared-memory ring (under /dev/shm) a stream gets for a client on this "
        "host, which then reads tensor bytes from it instead of the message; each is sized "
        "for the send window's batches (default %(default)s; 0: never offer one)",
    )
    p.add_argument(
        "--log-interval", type=float, default=10.0, help="seconds between progress lines (0: off)"
    )
    p.add_argument(
        "--drain-grace",
        type=float,
        default=10.0,
        help="seconds to finish open streams after SIGTERM",
    )
    p.add_argument("--tls-cert", help="server certificate (PEM); enables TLS")
    p.add_argument("--tls-key", help="server private key (PEM)")
    p.add_argument("--tls-client-ca", help="CA bundle for client certificates (mutual TLS)")
    p.add_argument(
        "--auth-token",
        default=None,
        help="require 'authorization: Bearer <token>' (or set ZEPHON_AUTH_TOKEN)",
    )
    p.add_argument("--port-file", default=None, help="write the bound gRPC port to this file")
    p.add_argument(
        "--allocator",
        default=os.environ.get(ALLOCATOR_ENV) or "auto",
        metavar="{" + ",".join(ALLOCATORS) + "} or PATH",
        help="memory allocator: 'auto' (default; or set ZEPHON_ALLOCATOR) preloads mimalloc "
        "when installed (tokenizing then takes about a quarter less CPU); 'system' keeps glibc "
        "malloc; or the path of a shared library",
    )
    p.add_argument(
        "--gc",
        default=gc_policy.from_env(),
        metavar="{" + ",".join(gc_policy.CHOICES) + "}",
        help="garbage-collector policy: 'tuned' (default; or set ZEPHON_GC) freezes start-up "
        "objects and collects every 10,000 allocations instead of 700 (the engine's records "
        "die young), here and in --runner processes workers; 'default' keeps CPython's",
    )
    p.add_argument(
        "--checkpoint-key-file",
        default=None,
        metavar="PATH",
        help="sign every checkpoint written with the key in this file (HMAC-SHA256; at least "
        "16 bytes, e.g. from openssl rand -hex 32) and refuse every one read that it did not "
        f"sign; or set {CHECKPOINT_KEY_ENV} to the key (default: unsigned, as before)",
    )
    p.add_argument(
        "--replay-cache-max-bytes",
        default="auto",
        metavar="BYTES",
        help="disk the replay cache may take, e.g. 2G or 500M ('auto', the default: a tenth "
        "of the size of its filesystem, at most 8G); it evicts its oldest entries to stay "
        "within it, and writes nothing while its filesystem has less than a twentieth of its "
        "size (at most 1G) free, which is left for checkpoints",
    )
    p.add_argument(
        "--max-replays",
        type=int,
        default=DEFAULT_MAX_REPLAYS,
        metavar="N",
        help="replays regenerating a lane's older batches at once (streams opened at a seq the "
        "server no longer keeps share one per lane and epoch); a stream that needs one more "
        "gets RESOURCE_EXHAUSTED (0: no replays, such seqs are OUT_OF_RANGE)",
    )


def max_replays_from_args(args: argparse.Namespace) -> int:
    """``--max-replays``, checked (0 to 1024)."""
    n = getattr(args, "max_replays", DEFAULT_MAX_REPLAYS)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 1024:
        raise ZephonError(
            f"--max-replays must be a whole number between 0 and 1024 (0: no replays), got {n!r}"
        )
    return n


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str, flag: str) -> int:
    """Bytes from ``123``, ``500M``, ``2G``, ``2GiB`` (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ZephonError(
            f"{flag} must be a number of bytes with an optional K, M, G or T suffix (powers "
            f"of 1024), e.g. 2G, or 'auto'; got {text!r}"
        )
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def replay_cache_from_args(args: argparse.Namespace) -> ReplayCache | None:
    """The replay cache ``--replay-cache`` / ``--state-dir`` ask for (None when off), with
    its ``--replay-cache-max-bytes`` budget."""
    where = getattr(args, "replay_cache", None)
    epochs = getattr(args, "replay_cache_epochs", 2)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ZephonError(f"--replay-cache-epochs must be an integer >= 1, got {epochs!r}")
    size = getattr(args, "replay_cache_max_bytes", "auto")
    max_bytes = None if size == "auto" else parse_size(size, "--replay-cache-max-bytes")
    if max_bytes == 0:
        raise ZephonError(
            "--replay-cache-max-bytes must be more than 0 (to turn the cache off use "
            "--replay-cache off)"
        )
    if where == "off":
        return None
    if where is None:
        if not args.state_dir:
            return None
        where = str(Path(args.state_dir) / "replay-cache")
    budget = CacheBudget.for_path(where, max_bytes)
    log.info(
        "replay cache %s: at most %d bytes; leaves %d bytes free on its filesystem",
        where,
        budget.max_bytes,
        budget.reserve_bytes,
    )
    return ReplayCache(where, keep_epochs=epochs, budget=budget)


def store_from_args(
    args: argparse.Namespace, key: CheckpointKey | None = None
) -> CheckpointStore | None:
    """The checkpoint store ``--state-dir`` / ``--keep-checkpoints`` ask for (None without)."""
    keep = getattr(args, "keep_checkpoints", 0)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ZephonError(f"--keep-checkpoints must be an integer >= 0 (0: keep all), got {keep!r}")
    if not args.state_dir:
        if keep:
            raise ZephonError("--keep-checkpoints needs --state-dir (where checkpoints are kept)")
        return None
    return CheckpointStore(args.state_dir, keep=keep, key=key)


def linger_from_args(args: argparse.Namespace) -> float:
    """``--linger-ms`` in seconds, checked (0 to 1000 ms)."""
    ms = getattr(args, "linger_ms", LINGER * 1000)
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= 1000:
        raise ZephonError(
            f"--linger-ms must be between 0 and 1000 (milliseconds; 0 sends what is ready at "
            f"once), got {ms!r}"
        )
    return float(ms) / 1000


def ring_mib_from_args(args: argparse.Namespace) -> int:
    """``--shm-ring-mib``, checked (0 to 4096)."""
    mib = getattr(args, "shm_ring_mib", DEFAULT_MAX_MIB)
    if isinstance(mib, bool) or not isinstance(mib, int) or not 0 <= mib <= 4096:
        raise ZephonError(
            f"--shm-ring-mib must be a whole number of MiB between 0 and 4096 (0: no "
            f"shared-memory rings), got {mib!r}"
        )
    return mib


RESUME_LATEST = "latest"
RESUME_LATEST_OR_FRESH = "latest-or-fresh"


def _start_hub(
    arg: str | None,
    store: CheckpointStore | None,
    start: Callable[[ResumeState | None], None],
    key: CheckpointKey | None,
) -> str:
    """Start the hub (``start``) as ``--resume`` asks; returns where it resumed from ('' for
    a fresh start). Refusals are errors naming the checkpoint and the fix."""
    if not arg:
        start(None)
        return ""
    if arg in (RESUME_LATEST, RESUME_LATEST_OR_FRESH):
        if store is None:
            raise ZephonError(f"--resume {arg} needs --state-dir")
        return _start_latest(arg, store, start)
    if Path(arg).exists() and not (store is not None and CHECKPOINT_ID.match(arg)):
        state = read_state_file(arg, key)  # a file; a directory or unreadable one is refused
    elif store is None:
        raise ZephonError(f"--resume {arg!r}: not a file, and there is no --state-dir for ids")
    else:
        state = store.load(arg)
    start(state)
    return arg


def _start_latest(
    arg: str, store: CheckpointStore, start: Callable[[ResumeState | None], None]
) -> str:
    """``--resume latest`` / ``latest-or-fresh``: the newest checkpoint the hub accepts.

    No checkpoint file at all is a first start (fresh, with a warning). Files that exist but
    are all refused stop the start-up for ``latest``, and start fresh with a warning listing
    them for ``latest-or-fresh``.
    """
    pick = store.pick_latest(accept=start)
    if pick.found is not None:
        return pick.found[0]
    if not pick.refused:
        log.warning("--resume %s: no checkpoint in %s yet; starting fresh", arg, store.dir)
        start(None)
        return ""
    refused = pick.describe()
    if arg == RESUME_LATEST:
        raise NoUsableCheckpoint(
            f"--resume latest: no usable checkpoint in {store.dir} ({len(pick.refused)} "
            f"refused: {refused}); fix or move the files, resume another one with --resume "
            "ID or FILE, or start fresh with --resume latest-or-fresh"
        )
    log.warning(
        "--resume latest-or-fresh: no usable checkpoint in %s, STARTING FRESH from seq 0 "
        "(%d refused: %s)",
        store.dir,
        len(pick.refused),
        refused,
    )
    start(None)
    return ""


def _credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    """The TLS credentials ``--tls-*`` ask for (None: plaintext), the files checked first."""
    if not args.tls_cert and not args.tls_key:
        if args.tls_client_ca:
            raise ZephonError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if not (args.tls_cert and args.tls_key):
        raise ZephonError("TLS needs both --tls-cert and --tls-key")
    key, cert, ca = check_tls_files(args.tls_cert, args.tls_key, args.tls_client_ca)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def _bind(server: grpc.Server, host: str, port: int, creds: grpc.ServerCredentials | None) -> int:
    """Bind ``host:port``; the bound port. Why it cannot be bound is checked first, so the
    error names the cause (a port in use, a host name that does not resolve...)."""
    address = f"{host}:{port}"
    problem = listen_problem(host, port)
    if problem is None:
        try:
            if creds is not None:
                bound = server.add_secure_port(address, creds)
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if bound:
            return int(bound)
        problem = "gRPC could not bind it (GRPC_VERBOSITY=debug in the environment shows why)"
    raise ZephonError(f"cannot listen on {address}: {problem}")


class Server:
    """The running service: gRPC server, hub, health, metrics, progress logging."""

    def __init__(self, args: argparse.Namespace, pipeline: Any, execution: Any) -> None:
        from ..cli import parse_lanes

        self.args = args
        creds = _credentials(args)  # before the slow part: bad TLS files fail at once
        self.checkpoint_key = checkpoint_key_from_args(args)
        self.store = store_from_args(args, self.checkpoint_key)
        lanes = parse_lanes(args.lanes)
        check_served(pipeline, lanes)  # end_of_data: a lane-sharded server lacks the end
        self.hub = LaneHub(
            pipeline,
            execution,
            lanes=lanes,
            store=self.store,
            max_ahead=args.max_ahead,
            replay_cache=replay_cache_from_args(args),
            checkpoint_key=self.checkpoint_key,
            max_replays=max_replays_from_args(args),
        )
        self.registry = CollectorRegistry()
        self.metrics = ServiceMetrics(self.registry, self.hub)
        metrics_config = config_from_args(args, os.environ)
        self.metrics_http = (
            MetricsHTTPServer(metrics_config, self.registry) if metrics_config else None
        )
        self.service = DataService(
            self.hub,
            metrics=self.metrics,
            max_streams=args.max_streams,
            linger=linger_from_args(args),
            ring_mib=ring_mib_from_args(args),
        )
        self.health = health.HealthServicer()
        token = args.auth_token or os.environ.get("ZEPHON_AUTH_TOKEN") or None
        interceptors: list[grpc.ServerInterceptor] = [TokenAuthInterceptor(token)] if token else []
        interceptors.append(MalformedRequestInterceptor())  # after auth: no one else gets here
        self.grpc = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=args.max_streams + 32, thread_name_prefix="zephon-rpc"
            ),
            interceptors=interceptors,
            options=[
                ("grpc.max_send_message_length", 256 << 20),
                # The largest legitimate request is a Resume with checkpoint bytes (limits.py)
                ("grpc.max_receive_message_length", self.service.limits.receive_max_bytes),
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.ping_timeout_ms", 10_000),  # what gRPC times pings out by
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # Without this a second server on a busy port binds it too, and the kernel
                # shares the connections between both.
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=args.max_streams + 64,
        )
        add_to_server(self.service, self.grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.grpc,
        )
        self.port = _bind(self.grpc, args.host, args.port, creds)
        self._stopped = threading.Event()
        self._drain_lock = threading.Lock()
        self._draining = False
        self._serving = False
        self.hub.on_failure = self._pipeline_state

    def _pipeline_state(self, error: BaseException | None) -> None:
        """A failed pipeline (e.g. a killed worker) turns health NOT_SERVING; the streams fail
        with INTERNAL naming the cause. The process stays up (GetInfo, health, metrics answer);
        a successful ``Resume`` RPC or a restart with ``--resume latest`` serves again."""
        with self._drain_lock:
            if self._draining or not self._serving:
                return
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if error is None
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in ("", SERVICE_NAME):
                self.health.set(name, status)
        if error is not None:
            log.error(
                "pipeline failed (%s); health is NOT_SERVING until a Resume RPC succeeds or "
                "the server is restarted with --resume latest",
                str(error).split("\n", 1)[0],
            )

    def start(self) -> None:
        """Start the hub (resuming as ``--resume`` asks), metrics and gRPC; health SERVING."""
        key = self.checkpoint_key
        source = _start_hub(self.args.resume, self.store, self.hub.start, key)
        if key is not None:
            log.info("checkpoints are signed and verified (key from %s)", key.source)
        if source:
            self.hub.resumed_from = source
            log.info("resumed from %s at %s", source, self.hub.positions())
        if self.metrics_http is not None:
            self.metrics_http.start()
            self._log_metrics(self.metrics_http)
        if self.service.ring_mib:
            sweep_stale()
        shm_owner.sweep_stale()  # payload blocks and semaphores of processes that died
        self.grpc.start()
        with self._drain_lock:
            self._serving = True
            failed = self.hub.error is not None
            for name in ("", SERVICE_NAME):
                self.health.set(
                    name,
                    health_pb2.HealthCheckResponse.NOT_SERVING
                    if failed
                    else health_pb2.HealthCheckResponse.SERVING,
                )
        if self.args.port_file:
            Path(self.args.port_file).write_text(f"{self.port}\n")
        log.info(
            "serving %d lanes %s of pipeline %s on %s:%d",
            len(self.hub.lanes),
            self.hub.lanes,
            self.hub.fingerprint[:16],
            self.args.host,
            self.port,
        )
        if self.args.log_interval > 0:
            threading.Thread(target=self._progress, name="zephon-progress", daemon=True).start()

    def _log_metrics(self, metrics: MetricsHTTPServer) -> None:
        config = metrics.config
        log.info("metrics on %s (%s)", metrics.url, describe(config))
        grpc_secured = bool(self.args.tls_cert or self.args.auth_token)
        grpc_secured = grpc_secured or bool(os.environ.get("ZEPHON_AUTH_TOKEN"))
        if grpc_secured and not (config.loopback or config.schemes or config.client_cafile):
            log.warning(
                "/metrics on %s needs no credentials while gRPC does: anyone who reaches port "
                "%d reads them; set ZEPHON_METRICS_TOKEN (or --metrics-auth-token) or "
                "--metrics-basic-auth-file",
                config.host,
                metrics.port,
            )

    def close(self) -> None:
        """Stop at once what :meth:`start` began (the start-up failed or was interrupted)."""
        self.grpc.stop(0)
        self.hub.stop()
        if self.metrics_http is not None:
            self.metrics_http.close()
        self._stopped.set()

    def drain(self) -> None:
        """Graceful stop: NOT_SERVING, refuse new streams, end open ones, stop."""
        with self._drain_lock:
            if self._draining:
                return
            self._draining = True
        log.info("draining: health NOT_SERVING, ending open streams")
        self.health.enter_graceful_shutdown()
        self.service.draining.set()
        grace = self.args.drain_grace
        deadline = time.monotonic() + grace
        done = self.grpc.stop(grace)
        # Data streams end at their next step; then stop at once rather than wait the whole
        # grace for long-lived calls that never end by themselves (health Watch).
        while self.service.active_streams and time.monotonic() < deadline:
            time.sleep(0.05)
        self.grpc.stop(min(0.5, max(0.0, deadline - time.monotonic())))
        self.hub.stop()
        done.wait(max(0.0, deadline - time.monotonic()))
        self._stopped.set()
        log.info("stopped")

    def wait(self) -> None:
        # Timed waits: Python runs signal handlers on the main thread only, and a SIGTERM the
        # kernel delivers to another thread (gRPC's, say) never wakes an untimed wait here.
        while not self._stopped.wait(0.2):
            pass

    def _progress(self) -> None:
        last_batches = last_tokens = 0.0
        last = time.monotonic()
        while not self._stopped.wait(self.args.log_interval):
            now = time.monotonic()
            batches = self.metrics.batches_sent._value.get()
            tokens = self.metrics.tokens_sent._value.get()
            stats = self.hub.stats()
            lag = max((s["produced"] - s["acked"] for s in stats["lanes"].values()), default=0)
            run = self.hub.run
            stalled = sum(d.stalled_lanes for d in run.drivers) if run else 0
            dt = max(now - last, 1e-9)
            log.info(
                "sent %.1f batches/s, %.0f tokens/s; streams %d; max lag %d batches; "
                "stalled lanes %d",
                (batches - last_batches) / dt,
                (tokens - last_tokens) / dt,
                self.service.active_streams,
                lag,
                stalled,
            )
            last_batches, last_tokens, last = batches, tokens, now


def serve(
    args: argparse.Namespace, pipeline: Any, execution: Any, signals: StopSignals | None = None
) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code.

    ``signals``: the stop-signal handling the command line installed at its start (a signal
    before the hand-over below interrupts the start-up); None installs it here.
    """
    if signals is None:
        signals = StopSignals.install()
    gc_mode = gc_policy.check(getattr(args, "gc", "tuned"))
    server = Server(args, pipeline, execution)
    gc_policy.export(gc_mode)  # before the runner starts its worker processes
    gc_policy.apply(gc_mode)
    log.info("garbage collector: %s", gc_mode)
    started = threading.Event()

    def on_signal(signum: int) -> None:
        log.info("received %s", signal.Signals(signum).name)

        def stop() -> None:
            started.wait()  # a signal during start() drains once the server is up
            server.drain()

        threading.Thread(target=stop, name="zephon-drain", daemon=True).start()

    # From here threads and worker processes start: a signal drains (after start()) rather
    # than interrupting, and one sent on seeing "serving ..." is a drain, never exit -15.
    signals.hand_over(on_signal)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    started.set()
    server.wait()
    return 0
