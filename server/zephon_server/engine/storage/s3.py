"""Building the pyarrow.fs file system of one bucket: S3 from :class:`StorageOptions`.

S3 goes through ``pyarrow.fs.S3FileSystem`` (the AWS C++ SDK: the whole standard credential
chain, profiles and instance roles). Three settings are ours rather than the SDK's:

* the SDK's retries are off (``AwsStandardS3RetryStrategy(max_attempts=1)``): every attempt
  goes through :mod:`.retry`, which counts it and backs off with jitter;
* the endpoint: the SDK bundled with pyarrow does not read ``AWS_ENDPOINT_URL`` (checked
  with pyarrow 26: it still goes to ``amazonaws.com``), so ``storage_options.endpoint_url``,
  else ``$AWS_ENDPOINT_URL_S3``, else ``$AWS_ENDPOINT_URL`` is passed as the endpoint;
* ``allow_delayed_open``: a small write is then one ``PutObject`` (atomic), not a multipart
  upload.

Other schemes are opened with their own default configuration: ``gs`` with Google's client
retrying one request for at most ``request_timeout_s`` (default 10 s), ``hdfs`` with
``FileSystem.from_uri``; only the retry and concurrency options apply to them. Untested but
for a gs:// dataset failing in bounded time without credentials.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .options import StorageOptions

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
#: Seconds one gs:// request may take with Google's own retries (``request_timeout_s`` if set).
GCS_ATTEMPT_S = 10.0
_S3_ONLY = ("endpoint_url", "region", "access_key", "secret_key", "session_token", "anonymous")


def endpoint(options: StorageOptions, environ: Mapping[str, str] | None = None) -> str | None:
    """The S3 endpoint to use: the option, else the standard variables, else AWS's own."""
    if options.endpoint_url:
        return options.endpoint_url
    env = os.environ if environ is None else environ
    for name in ENDPOINT_VARIABLES:
        if env.get(name):
            return env[name]
    return None


def make_filesystem(scheme: str, bucket: str, options: StorageOptions) -> Any:
    """The pyarrow file system for ``scheme://bucket`` with ``options``."""
    import pyarrow.fs as pafs

    if scheme == "s3":
        kwargs: dict[str, Any] = {
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),
            "allow_delayed_open": True,
            "anonymous": options.anonymous,
        }
        url = endpoint(options)
        if url:
            kwargs["endpoint_override"] = url
        if options.region:
            kwargs["region"] = options.region
        if options.access_key and options.secret_key:
            kwargs["access_key"] = options.access_key
            kwargs["secret_key"] = options.secret_key
            if options.session_token:
                kwargs["session_token"] = options.session_token
        if options.request_timeout_s is not None:
            kwargs["request_timeout"] = float(options.request_timeout_s)
        if options.connect_timeout_s is not None:
            kwargs["connect_timeout"] = float(options.connect_timeout_s)
        return pafs.S3FileSystem(**kwargs)
    set_s3_only = [name for name in _S3_ONLY if getattr(options, name) not in (None, False)]
    if set_s3_only:
        raise ConfigError(
            f"storage_options.{set_s3_only[0]} applies to s3:// URLs only; {scheme}:// "
            "stores use their own default configuration (remove it)"
        )
    if scheme in ("gs", "gcs"):
        # Without a bound, Google's client retries a request (its credentials lookup too) for
        # up to 15 minutes, saying nothing: a gs:// dataset without credentials or network
        # hung at start-up. Each attempt is bounded; the retries are :mod:`.retry`'s.
        limit = options.request_timeout_s or GCS_ATTEMPT_S
        return pafs.GcsFileSystem(retry_time_limit=datetime.timedelta(seconds=limit))
    try:
        fs, _ = pafs.FileSystem.from_uri(f"{scheme}://{bucket}/")
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot open {scheme}://{bucket}: {exc} (only s3:// is tested; check the URL)"
        ) from exc
    return fs
