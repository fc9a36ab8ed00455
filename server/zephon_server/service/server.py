"""``zephon serve``: host a pipeline over gRPC with health, reflection and metrics.

The server runs from a frozen :class:`~.config.ServeConfig` (the command line builds it from
its flags and environment, :mod:`zephon_server.serve_flags`). Start-up: check the TLS files
and the address (:mod:`.listen`), open the state directory, restore ``--resume`` (``latest``,
``latest-or-fresh``, a checkpoint id or a file; signed ones only with a checkpoint key),
start the hub, then serve. A requested resume never becomes a silent fresh start. A
SIGTERM/SIGINT before the hub starts stops the start-up (exit 0, :mod:`..stop_signals`);
afterwards it drains: health turns NOT_SERVING at once, open streams end with UNAVAILABLE
(clients reconnect elsewhere or later), and the process exits 0 within ``--drain-grace``
seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
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

from ..delivery.hub import LaneHub
from ..delivery.ring import sweep_stale
from ..engine import shm_owner
from ..engine.cache_budget import CacheBudget
from ..engine.checkpoint import (
    CHECKPOINT_ID,
    CheckpointStore,
    InaccessibleCheckpoint,
    NoUsableCheckpoint,
    ResumeState,
    read_state_file,
)
from ..engine.checkpoint_key import CheckpointKey
from ..engine.errors import ZephonError
from ..engine.lane_ends import check_served
from ..engine.replay_cache import ReplayCache
from ..stop_signals import StopSignals
from .auth import TokenAuthInterceptor
from .config import RESUME_LATEST, RESUME_LATEST_OR_FRESH, ServeConfig, StateConfig, TlsFiles
from .listen import check_tls_files, listen_problem
from .malformed import MalformedRequestInterceptor
from .metrics import ServiceMetrics
from .metrics_http import MetricsHTTPServer, describe
from .servicer import DataService, add_to_server

log = logging.getLogger("zephon.serve")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DataService"].full_name


def replay_cache_of(state: StateConfig) -> ReplayCache | None:
    """The replay cache ``state`` asks for (None when off), within its disk budget."""
    where = state.replay_cache
    if where is None:
        return None
    budget = CacheBudget.for_path(where, state.replay_cache_max_bytes)
    log.info(
        "replay cache %s: at most %d bytes; leaves %d bytes free on its filesystem",
        where,
        budget.max_bytes,
        budget.reserve_bytes,
    )
    return ReplayCache(where, keep_epochs=state.replay_cache_epochs, budget=budget)


def store_of(state: StateConfig) -> CheckpointStore | None:
    """The checkpoint store ``state`` asks for (None without a state directory)."""
    if not state.state_dir:
        return None
    return CheckpointStore(state.state_dir, keep=state.keep_checkpoints, key=state.checkpoint_key)


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
        if store.created:
            log.warning(
                "--resume %s: the state directory %s did not exist (made now), so there is no "
                "checkpoint: STARTING FRESH from seq 0. If checkpoints should be there (a typo, "
                "a volume not mounted, a relative --state-dir from another working directory), "
                "stop this server and fix --state-dir",
                arg,
                store.dir.resolve(),
            )
        else:
            log.warning("--resume %s: no checkpoint in %s yet; starting fresh", arg, store.dir)
        start(None)
        return ""
    refused = pick.describe()
    last = pick.refused[-1]
    if isinstance(last.error, InaccessibleCheckpoint):  # latest-or-fresh too: never roll back
        raise NoUsableCheckpoint(
            f"--resume {arg}: checkpoint {last.checkpoint_id} is in {store.dir} but cannot be "
            f"read: {last.error}; resuming an older one, or fresh, would roll the run back: make "
            "it readable by the server's user, or move it away"
        )
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


def _credentials(tls: TlsFiles | None) -> grpc.ServerCredentials | None:
    """The TLS credentials ``tls`` asks for (None: plaintext), the files checked first."""
    if tls is None:
        return None
    key, cert, ca = check_tls_files(tls.cert, tls.key, tls.client_ca)
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def _grpc_server(token: str | None, max_streams: int, receive_max_bytes: int) -> grpc.Server:
    """The gRPC server: auth (with a token) then malformed-request interceptors, threads and
    concurrent calls sized for ``max_streams``, keepalive, and no shared port."""
    interceptors: list[grpc.ServerInterceptor] = [TokenAuthInterceptor(token)] if token else []
    interceptors.append(MalformedRequestInterceptor())  # after auth: no one else gets here
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_streams + 32, thread_name_prefix="zephon-rpc"),
        interceptors=interceptors,
        options=[
            ("grpc.max_send_message_length", 256 << 20),
            # The largest legitimate request is a Resume with checkpoint bytes (limits.py)
            ("grpc.max_receive_message_length", receive_max_bytes),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.ping_timeout_ms", 10_000),  # what gRPC times pings out by
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # Without this a second server on a busy port binds it too, and the kernel
            # shares the connections between both.
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=max_streams + 64,
    )


def _add_services(
    server: grpc.Server, service: DataService, health_servicer: health.HealthServicer
) -> None:
    """DataService, health and reflection (of those two and itself) on ``server``."""
    add_to_server(service, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
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

    def __init__(self, config: ServeConfig, pipeline: Any, execution: Any) -> None:
        self.config = config
        listen, state, delivery = config.listen, config.state, config.delivery
        creds = _credentials(listen.tls)  # before the slow part: bad TLS files fail at once
        self.checkpoint_key = state.checkpoint_key
        self.store = store_of(state)
        lanes = None if delivery.lanes is None else list(delivery.lanes)
        check_served(pipeline, lanes)  # end_of_data: a lane-sharded server lacks the end
        self.hub = LaneHub(
            pipeline,
            execution,
            lanes=lanes,
            store=self.store,
            max_ahead=delivery.max_ahead,
            replay_cache=replay_cache_of(state),
            checkpoint_key=self.checkpoint_key,
            max_replays=delivery.max_replays,
        )
        self.registry = CollectorRegistry()
        self.metrics = ServiceMetrics(self.registry, self.hub)
        self.metrics_http = (
            MetricsHTTPServer(config.metrics, self.registry) if config.metrics else None
        )
        self.service = DataService(
            self.hub,
            metrics=self.metrics,
            max_streams=delivery.max_streams,
            linger=delivery.linger,
            ring_mib=delivery.ring_mib,
        )
        self.health = health.HealthServicer()
        self.grpc = _grpc_server(
            listen.auth_token, delivery.max_streams, self.service.limits.receive_max_bytes
        )
        _add_services(self.grpc, self.service, self.health)
        self.port = _bind(self.grpc, listen.host, listen.port, creds)
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
        source = _start_hub(self.config.state.resume, self.store, self.hub.start, key)
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
        if self.config.listen.port_file:
            _write_port_file(self.config.listen.port_file, self.port)
        log.info(
            "serving %d lanes %s of pipeline %s on %s:%d",
            len(self.hub.lanes),
            self.hub.lanes,
            self.hub.fingerprint[:16],
            self.config.listen.host,
            self.port,
        )
        if self.config.log_interval > 0:
            threading.Thread(target=self._progress, name="zephon-progress", daemon=True).start()

    def _log_metrics(self, metrics: MetricsHTTPServer) -> None:
        config = metrics.config
        log.info("metrics on %s (%s)", metrics.url, describe(config))
        if self.config.secured and not (config.loopback or config.schemes or config.client_cafile):
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
        grace = self.config.drain_grace
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
        while not self._stopped.wait(self.config.log_interval):
            now = time.monotonic()
            batches = self.metrics.batches_sent._value.get()
            tokens = self.metrics.tokens_sent._value.get()
            stats = self.hub.stats()
            lag = max((s["unconsumed"] for s in stats["lanes"].values()), default=0)
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


def _write_port_file(path: str, port: int) -> None:
    """Write the bound port to ``path`` whole or not at all (a temp file renamed: a launcher
    polling the file never reads a partial one); :class:`ZephonError` when it cannot."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        Path(tmp).write_text(f"{port}\n")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ZephonError(
            f"--port-file {path}: cannot write it: {exc.strerror or exc}; give a path the "
            "server can write (the server stops: a launcher waiting for the file would wait "
            "forever)"
        ) from None


def serve(
    config: ServeConfig, pipeline: Any, execution: Any, signals: StopSignals | None = None
) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code.

    ``config.runtime`` is handed to the runners' workers and its garbage-collector policy
    applied here once the pipeline is compiled; its process settings (malloc arenas, tokenizer
    threading) are the caller's to apply first thing (:meth:`RuntimeConfig.apply_process`).
    ``signals``: the stop-signal handling the command line installed at its start (a signal
    before the hand-over below interrupts the start-up); None installs it here.
    """
    if signals is None:
        signals = StopSignals.install()
    runtime = config.runtime
    # Worker processes and Ray actors get the same tuning as this process.
    server = Server(config, pipeline, execution.with_overrides(worker_tuning=runtime))
    runtime.apply_gc()  # the imports and the compiled pipeline exist now: freeze them
    log.info("garbage collector: %s", runtime.gc)
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
