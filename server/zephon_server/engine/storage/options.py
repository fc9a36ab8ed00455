"""Per-dataset ``storage_options``: how to reach an object store, not what data it holds.

A dataset whose ``path`` is an object-store URL may carry a ``storage_options`` mapping in
YAML. Everything in it is optional: credentials, region and endpoint otherwise come the
standard AWS way (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``AWS_PROFILE`` and the shared ``~/.aws/credentials`` and ``~/.aws/config``
files, instance roles), and ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` name the endpoint.
The options are about access, so they are not in the pipeline fingerprint, and the secrets
(``secret_key``, ``session_token``) are never shown: ``repr`` and :meth:`public` mask them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError

#: Requests in flight per store (bucket + options) and process, unless configured.
DEFAULT_MAX_CONCURRENCY = 16
#: Attempts per request (the first one included) before a request fails.
DEFAULT_RETRY_ATTEMPTS = 6
#: Backoff before retry ``k`` (1-based): a uniform draw from [0, min(cap, base * 2**(k-1))].
DEFAULT_RETRY_BASE_S = 0.1
DEFAULT_RETRY_CAP_S = 5.0
SECRET_KEYS = frozenset({"secret_key", "session_token"})
_MASK = "***"


@dataclass(frozen=True)
class StorageOptions:
    """How to reach one dataset's object store (see the module docstring).

    ``endpoint_url``: e.g. ``http://127.0.0.1:9000`` for MinIO or a test server (default:
    ``$AWS_ENDPOINT_URL_S3``, ``$AWS_ENDPOINT_URL``, else AWS). ``anonymous``: unsigned
    requests, for public buckets. ``max_concurrency``: requests in flight per store and
    process. ``retry_attempts`` / ``retry_base_s`` / ``retry_cap_s``: exponential backoff with
    full jitter on throttling (429, 503 SlowDown), 5xx answers and connection resets or
    timeouts. ``request_timeout_s``: a request that receives no byte for this long fails as a
    network error and is retried (the SDK's default, 3 s; it holds on Linux, where the SDK
    applies it as a lowest transfer rate; for ``gs://``, the longest one request may take
    with Google's own retries, default 10 s); ``connect_timeout_s``: the same for opening a
    connection (the SDK's default, 1 s).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    anonymous: bool = False
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    retry_attempts: int = DEFAULT_RETRY_ATTEMPTS
    retry_base_s: float = DEFAULT_RETRY_BASE_S
    retry_cap_s: float = DEFAULT_RETRY_CAP_S
    request_timeout_s: float | None = None
    connect_timeout_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("endpoint_url", "region", "access_key", "secret_key", "session_token"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                shown = _MASK if name in SECRET_KEYS else repr(value)
                raise ConfigError(
                    f"storage_options.{name}: must be a non-empty string, got {shown}"
                )
        if self.endpoint_url is not None and "://" not in self.endpoint_url:
            raise ConfigError(
                f"storage_options.endpoint_url: must be a URL such as "
                f"'https://s3.example.com' or 'http://127.0.0.1:9000', got {self.endpoint_url!r}"
            )
        if (self.access_key is None) != (self.secret_key is None):
            raise ConfigError(
                "storage_options: access_key and secret_key go together (set both, or neither "
                "to use the standard AWS credential chain)"
            )
        if not isinstance(self.anonymous, bool):
            raise ConfigError(
                f"storage_options.anonymous: must be true or false, got {self.anonymous!r}"
            )
        for name in ("max_concurrency", "retry_attempts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"storage_options.{name}: must be an integer >= 1, got {value!r}")
        for name in ("retry_base_s", "retry_cap_s"):
            _seconds(name, getattr(self, name), allow_zero=True)
        for name in ("request_timeout_s", "connect_timeout_s"):
            if getattr(self, name) is not None:
                _seconds(name, getattr(self, name), allow_zero=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | StorageOptions | None) -> StorageOptions:
        """Build from a YAML mapping, rejecting unknown keys by name (``None``: defaults)."""
        if isinstance(data, StorageOptions):
            return data
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"storage_options: expected a mapping, got {type(data).__name__} "
                f"(allowed keys: {allowed_keys()})"
            )
        unknown = sorted(set(data) - set(allowed_keys()))
        if unknown:
            raise ConfigError(
                f"storage_options: unknown key {unknown[0]!r}; allowed keys: {allowed_keys()}"
            )
        return cls(**dict(data))

    def public(self) -> dict[str, Any]:
        """The non-default settings, secrets masked (for logs and ``explain``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = _MASK if f.name in SECRET_KEYS else value
        return out

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.public().items())
        return f"StorageOptions({inner})"


def allowed_keys() -> list[str]:
    """The keys a ``storage_options`` mapping may have."""
    return [f.name for f in fields(StorageOptions)]


def _seconds(name: str, value: Any, *, allow_zero: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and math.isfinite(float(value)) and (value > 0 or (allow_zero and value == 0)):
        return
    bound = ">= 0" if allow_zero else "> 0"
    raise ConfigError(f"storage_options.{name}: must be a number of seconds {bound}, got {value!r}")
