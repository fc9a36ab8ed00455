"""The server's configuration: frozen, validated objects the command line builds.

``zephon serve`` turns its flags and environment into one :class:`ServeConfig`
(:mod:`zephon_server.serve_flags`); the service reads nothing else: no argparse namespace, no
environment variables. Each part is checked when it is built, and a bad value raises
:class:`~..engine.errors.ConfigError` naming the flag that set it (:func:`check_number`, the
one range check), so an embedding program that builds the objects itself gets the same
messages as the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..delivery.ring import DEFAULT_MAX_MIB
from ..engine.checkpoint_key import CheckpointKey
from ..engine.errors import ConfigError
from ..runtime import RuntimeConfig
from .metrics_http import MetricsHTTPConfig
from .servicer import LINGER

#: None: one replay per lane the server serves, at least 4 (``LaneHub``'s default).
DEFAULT_MAX_REPLAYS: int | None = None
"""Default replays of older batches running at once (``--max-replays``)."""
RESUME_LATEST = "latest"
RESUME_LATEST_OR_FRESH = "latest-or-fresh"


def check_number(
    flag: str,
    value: object,
    low: float,
    high: float | None = None,
    *,
    whole: bool = True,
    hint: str = "",
) -> None:
    """Raise :class:`ConfigError` naming ``flag`` unless ``value`` is a number (a whole one
    when ``whole``; never a bool) in ``[low, high]`` (``high`` None: no upper bound).
    ``hint`` (e.g. ``"0: off"``) is added in brackets."""
    kinds = (int,) if whole else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if ok and low <= value and (high is None or value <= high):  # type: ignore[operator]
        return
    note = f" ({hint})" if hint else ""
    if high is None:
        what = f"an integer >= {low:g}" if whole else f"a number >= {low:g}"
    else:
        what = f"{'a whole number ' if whole else ''}between {low:g} and {high:g}"
    raise ConfigError(f"{flag} must be {what}{note}, got {value!r}")


@dataclass(frozen=True)
class TlsFiles:
    """The gRPC port's TLS files (``--tls-cert``, ``--tls-key``, ``--tls-client-ca``): a
    certificate and key together, a client CA (mutual TLS) only with them."""

    cert: str
    key: str
    client_ca: str | None = None

    def __post_init__(self) -> None:
        if not self.cert or not self.key:
            raise ConfigError("TLS needs both --tls-cert and --tls-key")
        if self.client_ca is not None and not self.client_ca:
            raise ConfigError("--tls-client-ca must name a file (omit it: no client certificates)")


@dataclass(frozen=True)
class ListenConfig:
    """Where and how gRPC listens: ``--host``, ``--port`` (0: any free port), ``--port-file``
    (gets the bound port), TLS (None: plaintext) and the bearer token (``--auth-token`` or
    ``ZEPHON_AUTH_TOKEN``; None: no authentication; kept out of the ``repr``)."""

    host: str = "127.0.0.1"
    port: int = 50051
    port_file: str | None = None
    tls: TlsFiles | None = None
    auth_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"--host must be an address such as 127.0.0.1, got {self.host!r}")
        check_number("--port", self.port, 0, 65535, hint="0: pick a free one")
        if self.auth_token is not None and not self.auth_token:
            raise ConfigError("--auth-token must not be empty (omit it: no authentication)")


@dataclass(frozen=True)
class StateConfig:
    """Checkpoints and the replay cache.

    ``state_dir`` (``--state-dir``; None: no checkpoint store), ``keep_checkpoints``
    (``--keep-checkpoints``, 0: keep all), ``resume`` (``--resume``), ``checkpoint_key`` (signs
    and verifies checkpoints; None: unsigned), ``replay_cache`` (its directory, resolved: None
    when off), ``replay_cache_epochs`` and ``replay_cache_max_bytes`` (None: ``auto``).
    """

    state_dir: str | None = None
    keep_checkpoints: int = 0
    resume: str | None = None
    checkpoint_key: CheckpointKey | None = field(default=None, repr=False)
    replay_cache: str | None = None
    replay_cache_epochs: int = 2
    replay_cache_max_bytes: int | None = None

    def __post_init__(self) -> None:
        check_number("--keep-checkpoints", self.keep_checkpoints, 0, hint="0: keep all")
        if self.keep_checkpoints and not self.state_dir:
            raise ConfigError("--keep-checkpoints needs --state-dir (where checkpoints are kept)")
        if self.resume in (RESUME_LATEST, RESUME_LATEST_OR_FRESH) and not self.state_dir:
            raise ConfigError(f"--resume {self.resume} needs --state-dir")
        check_number("--replay-cache-epochs", self.replay_cache_epochs, 1)
        size = self.replay_cache_max_bytes
        if size is not None:
            check_number("--replay-cache-max-bytes", size, 0)
            if size == 0:
                raise ConfigError(
                    "--replay-cache-max-bytes must be more than 0 (to turn the cache off use "
                    "--replay-cache off)"
                )


@dataclass(frozen=True)
class DeliveryConfig:
    """How batches reach consumers: ``lanes`` served (None: all), ``max_streams`` open at
    once, ``max_ahead`` batches a lane may run ahead of its slowest consumer, ``linger``
    seconds a stream waits to group a burst, ``ring_mib`` (largest shared-memory ring; 0:
    none) and ``max_replays`` running at once (0: none)."""

    lanes: tuple[int, ...] | None = None
    max_streams: int = 256
    max_ahead: int = 32
    linger: float = LINGER
    ring_mib: int = DEFAULT_MAX_MIB
    max_replays: int | None = DEFAULT_MAX_REPLAYS

    def __post_init__(self) -> None:
        if self.lanes is not None:
            if not self.lanes:
                raise ConfigError("--lanes must name at least one lane, e.g. 0-3")
            for lane in self.lanes:
                check_number("--lanes", lane, 0, hint="lane ids")
        check_number("--max-streams", self.max_streams, 1, 100_000)
        check_number("--max-ahead", self.max_ahead, 1)
        check_number(
            "--linger-ms",
            self.linger * 1000 if isinstance(self.linger, (int, float)) else self.linger,
            0,
            1000,
            whole=False,
            hint="milliseconds; 0 sends what is ready at once",
        )
        check_number("--shm-ring-mib", self.ring_mib, 0, 4096, hint="MiB; 0: no rings")
        if self.max_replays is not None:
            check_number("--max-replays", self.max_replays, 0, 1024, hint="0: no replays")


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``zephon serve`` needs besides the pipeline: listen, state, delivery,
    metrics (None: no ``/metrics``), the process tuning (``runtime``), and the seconds
    between progress lines (``log_interval``, 0: off) and to drain on SIGTERM
    (``drain_grace``)."""

    listen: ListenConfig = field(default_factory=ListenConfig)
    state: StateConfig = field(default_factory=StateConfig)
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    metrics: MetricsHTTPConfig | None = None
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    log_interval: float = 10.0
    drain_grace: float = 10.0

    def __post_init__(self) -> None:
        parts = (
            ("listen", ListenConfig),
            ("state", StateConfig),
            ("delivery", DeliveryConfig),
            ("runtime", RuntimeConfig),
        )
        for name, kind in parts:
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"ServeConfig.{name}: expected a {kind.__name__}")
        if self.metrics is not None and not isinstance(self.metrics, MetricsHTTPConfig):
            raise ConfigError("ServeConfig.metrics: expected a MetricsHTTPConfig or None")
        check_number("--log-interval", self.log_interval, 0, whole=False, hint="0: off")
        check_number("--drain-grace", self.drain_grace, 0, whole=False)

    @property
    def secured(self) -> bool:
        """Whether gRPC asks for credentials (TLS or a bearer token)."""
        return self.listen.tls is not None or self.listen.auth_token is not None
