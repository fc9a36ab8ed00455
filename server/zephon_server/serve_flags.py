"""The flags of ``zephon serve`` and the frozen configs they build (the command line's edge).

:func:`add_serve_arguments` declares the flags (binding names); :func:`serve_config` turns
the parsed flags and the environment (``ZEPHON_AUTH_TOKEN``, ``ZEPHON_METRICS_TOKEN``,
``ZEPHON_CHECKPOINT_KEY``, ``ZEPHON_ALLOCATOR``, ``ZEPHON_GC``) into one
:class:`~.service.config.ServeConfig`, and :func:`runtime_config` into the process tuning
(:class:`~.runtime.RuntimeConfig`). This is the one place that reads them: the service and
the engine get the frozen objects. A flag wins over its environment variable.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .delivery.ring import DEFAULT_MAX_MIB
from .engine.errors import ZephonError
from .runtime import ALLOCATOR_CHOICES, RuntimeConfig, from_environ, gc_policy
from .service.config import (
    DEFAULT_MAX_REPLAYS,
    DeliveryConfig,
    ListenConfig,
    ServeConfig,
    StateConfig,
    TlsFiles,
    check_number,
)
from .service.metrics_http import MetricsHTTPConfig, read_users
from .service.servicer import LINGER

if TYPE_CHECKING:
    from .engine.checkpoint_key import CheckpointKey

CHECKPOINT_KEY_ENV = "ZEPHON_CHECKPOINT_KEY"
"""Environment variable holding the checkpoint key (``--checkpoint-key-file`` wins)."""
AUTH_TOKEN_ENV = "ZEPHON_AUTH_TOKEN"
"""Environment variable holding the gRPC bearer token (``--auth-token`` wins)."""
METRICS_TOKEN_ENV = "ZEPHON_METRICS_TOKEN"
"""Environment variable holding the metrics bearer token (``--metrics-auth-token`` wins)."""
DEFAULT_METRICS_HOST = "127.0.0.1"
METRICS_TLS_CHOICES = ("auto", "on", "off")


def parse_lanes(text: str | None) -> list[int] | None:
    """``"0,1,4-7"`` → ``[0, 1, 4, 5, 6, 7]``; None stays None (all lanes)."""
    if not text:
        return None
    lanes: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = (int(end) for end in part.split("-", 1))
                if lo > hi:
                    raise ZephonError(
                        f"--lanes: the range {part.strip()} runs backwards; write {hi}-{lo}"
                    )
                lanes.extend(range(lo, hi + 1))
            else:
                lanes.append(int(part))
    except ValueError:
        raise ZephonError(f"--lanes: expected a list like 0,1,4-7, got {text!r}") from None
    return lanes


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


def checkpoint_key_from_args(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> CheckpointKey | None:
    """The checkpoint key ``--checkpoint-key-file`` or ``ZEPHON_CHECKPOINT_KEY`` gives (the
    flag wins), or None: checkpoints are then written unsigned and read unverified."""
    from .engine.checkpoint_key import CheckpointKey

    path = getattr(args, "checkpoint_key_file", None)
    if path:
        return CheckpointKey.from_file(path)
    text = environ.get(CHECKPOINT_KEY_ENV, "")
    if text.strip():
        return CheckpointKey.from_text(text, CHECKPOINT_KEY_ENV)
    return None


def add_runtime_arguments(p: argparse.ArgumentParser) -> None:
    """``--gc`` for a command that runs a pipeline (``serve`` also has ``--allocator``)."""
    p.add_argument(
        "--gc",
        default=None,
        metavar="{" + ",".join(gc_policy.CHOICES) + "}",
        help="garbage-collector policy: 'tuned' (default; or set ZEPHON_GC) freezes start-up "
        "objects and collects every 10,000 allocations instead of 700 (the engine's records "
        "die young), here and in --runner processes workers; 'default' keeps CPython's",
    )


def runtime_config(args: argparse.Namespace, environ: Mapping[str, str]) -> RuntimeConfig:
    """The process tuning ``zephon serve``'s ``--allocator`` and ``--gc`` and the environment
    ask for (see :func:`zephon_server.runtime.from_environ`)."""
    return from_environ(environ, allocator=args.allocator, gc=args.gc)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``zephon serve`` (binding names), in the order ``--help`` lists them."""
    _add_listen_arguments(p)
    _add_state_arguments(p)
    _add_delivery_arguments(p)
    _add_access_arguments(p)
    _add_process_arguments(p)
    _add_signing_and_budget_arguments(p)


def _add_listen_arguments(p: argparse.ArgumentParser) -> None:
    """Where the server listens: gRPC and Prometheus."""
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50051, help="gRPC port (0: pick a free one)")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus /metrics on this port (default: off)",
    )
    add_metrics_arguments(p)


def _add_state_arguments(p: argparse.ArgumentParser) -> None:
    """Checkpoints, the replay cache and what a start resumes from."""
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


def _add_delivery_arguments(p: argparse.ArgumentParser) -> None:
    """Lanes served, streams, how far lanes run ahead, message grouping, draining."""
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


def _add_access_arguments(p: argparse.ArgumentParser) -> None:
    """TLS, the bearer token, and the port file for whoever starts the server."""
    p.add_argument("--tls-cert", help="server certificate (PEM); enables TLS")
    p.add_argument("--tls-key", help="server private key (PEM)")
    p.add_argument("--tls-client-ca", help="CA bundle for client certificates (mutual TLS)")
    p.add_argument(
        "--auth-token",
        default=None,
        help=f"require 'authorization: Bearer <token>' (or set {AUTH_TOKEN_ENV})",
    )
    p.add_argument("--port-file", default=None, help="write the bound gRPC port to this file")


def _add_process_arguments(p: argparse.ArgumentParser) -> None:
    """The memory allocator and the runtime's tuning."""
    p.add_argument(
        "--allocator",
        default=None,
        metavar="{" + ",".join(ALLOCATOR_CHOICES) + "} or PATH",
        help="memory allocator: 'auto' (default; or set ZEPHON_ALLOCATOR) preloads mimalloc "
        "when installed (tokenizing then takes about a quarter less CPU); 'system' keeps glibc "
        "malloc; or the path of a shared library",
    )
    add_runtime_arguments(p)


def _add_signing_and_budget_arguments(p: argparse.ArgumentParser) -> None:
    """Checkpoint signing, the replay cache's disk budget and the replays at once."""
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
        "server no longer keeps share one per lane and epoch; default: one per lane this "
        "server serves, at least 4); a stream that needs one more gets RESOURCE_EXHAUSTED "
        "(0: no replays, such seqs are OUT_OF_RANGE)",
    )


def add_metrics_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--metrics-*`` flags of ``zephon serve`` besides ``--metrics-port``."""
    p.add_argument(
        "--metrics-host",
        default=DEFAULT_METRICS_HOST,
        help="address /metrics listens on (default 127.0.0.1, whatever --host says; 0.0.0.0 "
        "for all interfaces)",
    )
    p.add_argument(
        "--metrics-tls",
        choices=METRICS_TLS_CHOICES,
        default="auto",
        help="serve /metrics over HTTPS with --tls-cert/--tls-key (and require client "
        "certificates signed by --tls-client-ca when given): 'auto' (default) when --tls-cert "
        "is given, 'on' (needs them), 'off' plain HTTP",
    )
    p.add_argument(
        "--metrics-auth-token",
        default=None,
        help="require 'Authorization: Bearer <token>' on /metrics (or set "
        f"{METRICS_TOKEN_ENV}; prefer the variable, command lines are visible in ps)",
    )
    p.add_argument(
        "--metrics-basic-auth-file",
        default=None,
        metavar="FILE",
        help="require HTTP basic auth on /metrics with one of the 'user:password' lines of "
        "this file (keep it private: chmod 600)",
    )


def metrics_config(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> MetricsHTTPConfig | None:
    """The metrics configuration ``zephon serve``'s flags ask for (None without
    ``--metrics-port``); raises :class:`ZephonError` naming the flag when they are wrong."""
    token = args.metrics_auth_token or environ.get(METRICS_TOKEN_ENV) or None
    users_file, mode, host, port = (
        args.metrics_basic_auth_file,
        args.metrics_tls,
        args.metrics_host,
        args.metrics_port,
    )
    if port is None:
        given = [
            flag
            for flag, value in (
                ("--metrics-auth-token", args.metrics_auth_token),
                ("--metrics-basic-auth-file", users_file),
                ("--metrics-tls on", "on" if mode == "on" else None),
                ("--metrics-host", None if host == DEFAULT_METRICS_HOST else host),
            )
            if value
        ]
        if given:
            raise ZephonError(f"{', '.join(given)} needs --metrics-port (metrics are off)")
        return None
    check_number("--metrics-port", port, 0, 65535)
    if mode not in METRICS_TLS_CHOICES:
        raise ZephonError(
            f"--metrics-tls must be one of {', '.join(METRICS_TLS_CHOICES)}, got {mode!r}"
        )
    cert, key = args.tls_cert, args.tls_key
    use_tls = mode == "on" or (mode == "auto" and bool(cert))
    if use_tls and not (cert and key):
        raise ZephonError(
            f"--metrics-tls {mode} needs --tls-cert and --tls-key (the certificate /metrics "
            "shares with gRPC)"
        )
    if not host:
        raise ZephonError("--metrics-host must not be empty (127.0.0.1, 0.0.0.0, ...)")
    return MetricsHTTPConfig(
        host=host,
        port=port,
        certfile=cert if use_tls else None,
        keyfile=key if use_tls else None,
        client_cafile=(args.tls_client_ca or None) if use_tls else None,
        token=token,
        users=read_users(users_file) if users_file else (),
    )


def listen_config(args: argparse.Namespace, environ: Mapping[str, str]) -> ListenConfig:
    """``--host``, ``--port``, ``--port-file``, ``--tls-*`` and ``--auth-token`` (or
    ``ZEPHON_AUTH_TOKEN``)."""
    if not args.tls_cert and not args.tls_key:
        if args.tls_client_ca:
            raise ZephonError("--tls-client-ca needs --tls-cert and --tls-key")
        tls = None
    else:
        tls = TlsFiles(args.tls_cert or "", args.tls_key or "", args.tls_client_ca or None)
    if args.port_file:
        _check_port_file(args.port_file)
    return ListenConfig(
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        tls=tls,
        auth_token=args.auth_token or environ.get(AUTH_TOKEN_ENV) or None,
    )


def _check_port_file(path: str) -> None:
    """:class:`ZephonError` now, before the pipeline loads, for a ``--port-file`` that could
    not be written once the server is up (a missing or read-only directory, a directory)."""
    where = os.path.dirname(os.path.abspath(path))
    problem = None
    if os.path.isdir(path):
        problem = "is a directory"
    elif not os.path.isdir(where):
        problem = f"its directory {where} does not exist"
    elif not os.access(where, os.W_OK):
        problem = f"its directory {where} is not writable (read-only, or not the server user's)"
    if problem:
        raise ZephonError(f"--port-file {path}: {problem}; give a path the server can write")


def state_config(args: argparse.Namespace, environ: Mapping[str, str]) -> StateConfig:
    """``--state-dir``, ``--keep-checkpoints``, ``--resume``, the checkpoint key and the
    ``--replay-cache*`` flags (the cache defaults to ``<state-dir>/replay-cache``)."""
    size = args.replay_cache_max_bytes
    max_bytes = None if size == "auto" else parse_size(size, "--replay-cache-max-bytes")
    where = args.replay_cache
    if where == "off":
        where = None
    elif where is None and args.state_dir:
        where = str(Path(args.state_dir) / "replay-cache")
    return StateConfig(
        state_dir=args.state_dir,
        keep_checkpoints=args.keep_checkpoints,
        resume=args.resume,
        checkpoint_key=checkpoint_key_from_args(args, environ),
        replay_cache=where,
        replay_cache_epochs=args.replay_cache_epochs,
        replay_cache_max_bytes=max_bytes,
    )


def delivery_config(args: argparse.Namespace) -> DeliveryConfig:
    """``--lanes``, ``--max-streams``, ``--max-ahead``, ``--linger-ms``, ``--shm-ring-mib``
    and ``--max-replays``."""
    lanes = parse_lanes(args.lanes)
    check_number("--linger-ms", args.linger_ms, 0, 1000, whole=False, hint="milliseconds")
    return DeliveryConfig(
        lanes=None if lanes is None else tuple(lanes),
        max_streams=args.max_streams,
        max_ahead=args.max_ahead,
        linger=float(args.linger_ms) / 1000,
        ring_mib=args.shm_ring_mib,
        max_replays=args.max_replays,
    )


def serve_config(args: argparse.Namespace, environ: Mapping[str, str]) -> ServeConfig:
    """The whole :class:`ServeConfig` of a parsed ``zephon serve`` command line and its
    environment; raises :class:`ZephonError` (a ``ConfigError``) naming the flag of a bad
    value. The TLS files are checked before the state (a typo fails before slow work)."""
    listen = listen_config(args, environ)
    return ServeConfig(
        listen=listen,
        state=state_config(args, environ),
        delivery=delivery_config(args),
        metrics=metrics_config(args, environ),
        runtime=runtime_config(args, environ),
        log_interval=args.log_interval,
        drain_grace=args.drain_grace,
    )
