"""Listing a dataset's shards in an object store (the URL forms of :mod:`.location`).

A listing gives sizes and times but no ETags (pyarrow's ``FileInfo`` has none), so each
listed shard is then HEADed for its identity, up to ``max_concurrency`` at a time. Every
failure here happens at start-up and is a one-line :class:`~..errors.ConfigError` naming the
URL and the fix: a missing bucket, a path that matches nothing, denied access or bad
credentials, an endpoint that cannot be reached.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..errors import ConfigError
from ..ignored_files import report_ignored
from .location import ObjectUrl, glob_base, glob_regex, has_glob, hidden
from .options import StorageOptions
from .remote import ArrowStore
from .retry import GCS_CREDENTIALS_FIX, StorageRequestError, is_gcs
from .store import ObjectInfo, bucket_store, configure_bucket

CREDENTIALS_FIX = (
    "set credentials the standard AWS way (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
    "AWS_PROFILE or ~/.aws/credentials, an instance role) or the dataset's storage_options "
    "access_key and secret_key (anonymous: true for a public bucket)"
)
ENDPOINT_FIX = "check the endpoint (AWS_ENDPOINT_URL or storage_options.endpoint_url)"


def list_object_shards(
    who: str,
    url: str,
    options: StorageOptions,
    forced_format: str | None,
    infer_format: Callable[[str], str | None],
    supported: str,
) -> list[tuple[str, str, ObjectInfo]]:
    """(URL, format, info with ETag) of every shard ``url`` selects, sorted by key.

    ``forced_format`` is the dataset's ``format`` override (applied as for local paths:
    to every object a pattern or a single URL selects, to supported names in a prefix)."""
    try:
        parsed = ObjectUrl.parse(url)
    except ValueError as exc:
        raise ConfigError(f"{who}: {exc}") from None
    configure_bucket(url, options, who)
    store = bucket_store(parsed.scheme, parsed.bucket, options)
    assert isinstance(store, ArrowStore)
    try:
        return _list(who, parsed, store, forced_format, infer_format, supported)
    except StorageRequestError as exc:
        raise _startup_error(who, url, store, exc) from None
    except _ListedObjectGone as gone:
        raise ConfigError(
            f"{who}: object {gone.url} was listed, then was gone when its ETag was read: the "
            f"objects under {url} changed while the server listed them (a corpus being "
            "written, rewritten or removed); start again once the corpus is complete"
        ) from None


def _list(
    who: str,
    parsed: ObjectUrl,
    store: ArrowStore,
    forced_format: str | None,
    infer_format: Callable[[str], str | None],
    supported: str,
) -> list[tuple[str, str, ObjectInfo]]:
    key = parsed.key
    if has_glob(key):
        regex = glob_regex(key)
        listed = [i for i in store.list(glob_base(key)) if regex.match(i.key)]
        if not listed:
            _nothing(who, parsed, store, f"pattern {str(parsed)!r} matches no objects")
        shards = _formats(listed, forced_format, infer_format, True)
        _report(who, f"pattern {str(parsed)!r}", listed, shards, supported, glob_base(key))
        return _with_identities(store, shards)
    if key and not key.endswith("/"):
        try:
            single = store.stat(key)
        except StorageRequestError as exc:
            if exc.outcome != "not_found":
                raise
        else:
            fmt = forced_format or infer_format(key)
            if fmt is None:
                raise ConfigError(
                    f"{who}: object {str(parsed)!r} has an unsupported extension; supported: "
                    f"{supported} (rename it or set format)"
                )
            return [(parsed.with_key(key), fmt, single)]
    prefix = key if not key or key.endswith("/") else key + "/"
    listed = [i for i in store.list(prefix) if not hidden(i.key[len(prefix) :])]
    if not listed:
        _nothing(
            who,
            parsed,
            store,
            f"{str(parsed)!r} matches no object (none has that key or is below it as a prefix)",
        )
    shards = _formats(listed, forced_format, infer_format, False)
    where = f"prefix {parsed.with_key(prefix)!r}"
    _report(who, where, listed, shards, supported, prefix)
    if not shards:
        raise ConfigError(
            f"{who}: prefix {parsed.with_key(prefix)!r} holds no objects with a supported "
            f"extension ({supported}); add data files or point path at them"
        )
    return _with_identities(store, shards)


def _formats(
    listed: list[ObjectInfo],
    forced: str | None,
    infer: Callable[[str], str | None],
    is_pattern: bool,
) -> list[tuple[ObjectInfo, str]]:
    out: list[tuple[ObjectInfo, str]] = []
    for info in listed:
        fmt = infer(info.key)
        if forced is not None and (fmt is not None or is_pattern):
            fmt = forced
        if fmt is not None:
            out.append((info, fmt))
    return out


def _report(
    who: str,
    where: str,
    listed: list[ObjectInfo],
    shards: list[tuple[ObjectInfo, str]],
    supported: str,
    prefix: str,
) -> None:
    """Say which listed objects are not shards (:mod:`..ignored_files`)."""
    if len(shards) < len(listed):
        taken = {info.key for info, _ in shards}
        left = [i.key for i in listed if i.key not in taken]
        report_ignored(who, where, left, supported, prefix)


def _with_identities(
    store: ArrowStore, shards: list[tuple[ObjectInfo, str]]
) -> list[tuple[str, str, ObjectInfo]]:
    """HEAD every listed object for its ETag and version (concurrently)."""
    workers = max(1, min(store.options.max_concurrency, len(shards)))
    with ThreadPoolExecutor(workers, thread_name_prefix="zephon-head") as pool:
        infos = list(pool.map(lambda item: _stat_listed(store, item[0].key), shards))
    return [(store.url(info.key), fmt, info) for info, (_, fmt) in zip(infos, shards)]


class _ListedObjectGone(Exception):
    """An object listed a moment ago answers its HEAD with "not found"."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


def _stat_listed(store: ArrowStore, key: str) -> ObjectInfo:
    try:
        return store.stat(key)
    except StorageRequestError as exc:
        if exc.outcome == "not_found":  # not a missing bucket: the listing just saw it
            raise _ListedObjectGone(store.url(key)) from None
        raise


def _nothing(who: str, parsed: ObjectUrl, store: ArrowStore, what: str) -> None:
    if not store.bucket_exists():
        raise ConfigError(_no_bucket(who, parsed, store))
    raise ConfigError(f"{who}: {what}; check the path")


def _no_bucket(who: str, parsed: ObjectUrl, store: ArrowStore) -> str:
    return (
        f"{who}: bucket {parsed.root!r} does not exist (path {str(parsed)!r}); check the bucket "
        f"name, the region and {ENDPOINT_FIX}"
    )


def _startup_error(who: str, url: str, store: ArrowStore, exc: StorageRequestError) -> ConfigError:
    if exc.outcome == "denied":
        fix = GCS_CREDENTIALS_FIX if is_gcs(url) else CREDENTIALS_FIX
        return ConfigError(f"{who}: access to {url} denied ({exc.last}); {fix}")
    if exc.outcome == "not_found":
        return ConfigError(_no_bucket(who, ObjectUrl.parse(url), store))
    return ConfigError(
        f"{who}: cannot list {url}: {exc.operation} failed after {exc.attempts} attempt(s) "
        f"({exc.outcome}: {exc.last}); {ENDPOINT_FIX} and the network, or retry later"
    )
