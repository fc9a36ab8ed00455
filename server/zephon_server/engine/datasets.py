"""Datasets: named sets of shard files with a mixture weight, resolved to counted shards.

A :class:`DatasetSpec` is what users configure; :func:`resolve_datasets` turns specs into
:class:`DatasetInfo` objects (the sorted list of shard files with their formats, sizes, row
counts and modification times). A path may also be an object-store URL (``s3://bucket/prefix/``,
one object, or a glob; see :mod:`.storage.location`). Resolution does no I/O beyond listing
files (HEADing objects for their ETags) and counting rows;
counting goes through the :class:`~zephon_server.engine.shards.ShardCache`, so the JSONL line
index built for counting is the one reading uses later (for the same file identity). With a
persisted shard index, a dataset whose listing (every shard's path, identity and format) is
unchanged is counted from one catalog file, reading no shard at all (:mod:`.index_catalog`).
Every Parquet shard's text column is checked right after counting (:mod:`.text_columns`).
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .identity import local_identity, object_identity
from .ignored_files import report_ignored
from .index_catalog import Counts, count_shards
from .local_listing import glob_files, unique_files, walk_files
from .shard_versions import unreadable
from .shards import EXTENSIONS, FORMATS, ShardCache, default_cache, infer_format
from .storage import StorageOptions, configure_bucket, is_url, unsupported_scheme
from .storage.location import glob_base
from .storage.shard_io import identity_of
from .text_columns import check_text_columns

if TYPE_CHECKING:
    from .storage.store import ObjectInfo

logger = logging.getLogger(__name__)

ON_ERROR_POLICIES: tuple[str, ...] = ("fail", "skip")
#: The default ``max_document_bytes``: 64 MiB.
DEFAULT_MAX_DOCUMENT_BYTES = 64 << 20
EXHAUSTION_POLICIES: tuple[str, ...] = ("stop", "repeat")
_GLOB_CHARS = frozenset("*?[")


def supported_extensions() -> str:
    """The supported shard file extensions, for error messages."""
    return ", ".join(EXTENSIONS)


@dataclass(frozen=True)
class DatasetSpec:
    """A configured dataset: shard location, mixture weight and per-dataset policies.

    ``path`` is a directory (every shard file with a supported extension below it, recursively,
    hidden files skipped), a single file, or a glob pattern (``**`` allowed); relative paths
    resolve against the ``base_dir`` given to :func:`resolve_datasets`. ``format`` overrides
    the format inferred from each file's extension (use a glob to select files whose names do
    not carry a supported extension). ``max_document_bytes`` bounds one document (a JSONL line,
    a Parquet value); a larger one is a data error under ``on_error``. ``path`` may also be an
    object-store URL (``s3://bucket/prefix/``, one object, or a glob); ``storage_options`` (a
    mapping, made a :class:`~.storage.StorageOptions`) say how to reach it. They are about
    access, not data: the fingerprint leaves them out and ``repr`` masks the secrets.
    """

    name: str
    path: str
    weight: float
    text_field: str = "text"
    on_error: str = "fail"
    exhaustion: str = "stop"
    format: str | None = None
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    storage_options: StorageOptions | None = None
    #: The Parquet columns that make one record for ``render_chat`` (``[prompt, completion]``,
    #: ``[messages, tools]``): each row is read as ``{column: value}``; None: ``text_field``.
    record_columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(
                f"dataset name must be a non-empty string, got {self.name!r} (name every dataset)"
            )
        who = f"dataset {self.name!r}"
        if not isinstance(self.path, str) or not self.path:
            raise ConfigError(
                f"{who}: path must be a non-empty string, got {self.path!r} "
                "(give a directory, a file or a glob pattern)"
            )
        refused = unsupported_scheme(self.path)
        if refused:
            raise ConfigError(f"{who}: path {self.path!r}: {refused}")
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise ConfigError(
                f"{who}: weight must be a number, got {weight!r} (set a positive mixture weight)"
            )
        if not math.isfinite(float(weight)) or float(weight) <= 0:
            raise ConfigError(
                f"{who}: weight must be > 0, got {weight!r} (set a positive mixture weight)"
            )
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ConfigError(
                f"{who}: text_field must be a non-empty string, got {self.text_field!r} "
                "(name the field or column holding the text)"
            )
        if self.record_columns is not None:
            object.__setattr__(self, "record_columns", _record_columns(who, self.record_columns))
        if self.on_error not in ON_ERROR_POLICIES:
            raise ConfigError(
                f"{who}: on_error must be one of {list(ON_ERROR_POLICIES)}, got {self.on_error!r}"
            )
        if self.exhaustion not in EXHAUSTION_POLICIES:
            raise ConfigError(
                f"{who}: exhaustion must be one of {list(EXHAUSTION_POLICIES)}, "
                f"got {self.exhaustion!r}"
            )
        if self.format is not None and self.format not in FORMATS:
            raise ConfigError(
                f"{who}: format must be one of {list(FORMATS)} or None (infer from the "
                f"extension), got {self.format!r}"
            )
        limit = self.max_document_bytes
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(
                f"{who}: max_document_bytes must be an integer >= 1, got {limit!r} (the largest "
                f"document in bytes; default {DEFAULT_MAX_DOCUMENT_BYTES})"
            )
        if self.storage_options is not None:
            try:
                options = StorageOptions.from_mapping(self.storage_options)
            except ConfigError as exc:
                raise ConfigError(f"{who}: {exc}") from None
            if not is_url(self.path):
                raise ConfigError(
                    f"{who}: storage_options apply to object-store paths (s3://...), but path "
                    f"is {self.path!r} (remove storage_options)"
                )
            object.__setattr__(self, "storage_options", options)

    def columns_read(self, records: bool) -> tuple[str, ...]:
        """The Parquet columns a read of this dataset's rows takes: ``record_columns`` in a
        pipeline reading whole records (``records``, ``render_chat``), else ``text_field``."""
        if records and self.record_columns:
            return self.record_columns
        return (self.text_field,)


def _record_columns(who: str, value: Any) -> tuple[str, ...]:
    """``record_columns`` as a tuple of distinct column names (:class:`ConfigError` else)."""
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(c, str) and c for c in value)
        or len(set(value)) != len(value)
    ):
        raise ConfigError(
            f"{who}: record_columns must be a list of distinct Parquet column names, got "
            f"{value!r} (e.g. record_columns: [prompt, completion])"
        )
    return tuple(value)


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: absolute path (or URL), format, size in bytes, rows and modification
    time (and an object's ETag and version).

    :attr:`identity` is what says the file is still the one whose rows were counted and
    indexed: the fingerprint covers it and every read compares it with the open file.
    """

    path: str
    format: str
    size_bytes: int
    num_rows: int
    mtime_ns: int
    etag: str | None = None
    version: str | None = None

    @property
    def identity(self) -> str:
        """Size and modification time (local), or size, ETag and version (object store), as
        one comparable string (see :mod:`.identity`)."""
        if self.etag is not None:
            return object_identity(self.size_bytes, self.etag, self.version)
        return local_identity(self.size_bytes, self.mtime_ns)


@dataclass(frozen=True)
class DatasetInfo:
    """A resolved dataset: its spec, its position in the dataset list and its shards."""

    spec: DatasetSpec
    index: int
    shards: tuple[ShardInfo, ...]

    @property
    def name(self) -> str:
        """The dataset's name."""
        return self.spec.name

    @property
    def num_rows(self) -> int:
        """Total rows over all shards."""
        return sum(s.num_rows for s in self.shards)

    @property
    def size_bytes(self) -> int:
        """Total size of the shard files on disk."""
        return sum(s.size_bytes for s in self.shards)


def resolve_datasets(
    specs: Sequence[DatasetSpec],
    base_dir: str | os.PathLike[str] = ".",
    cache: ShardCache | None = None,
    records: bool = False,
) -> list[DatasetInfo]:
    """List and count the shards of every dataset, in order. ``records``: the pipeline reads
    whole records (``render_chat``), so a Parquet ``text_field`` may be a list or struct column.

    Raises :class:`ConfigError` for an empty list, duplicate names, a missing path, a path with
    no supported files, or a dataset with zero rows in total. Unreadable shards, and under
    ``on_error: fail`` Parquet shards without the text column (:mod:`.text_columns`), raise
    :class:`~zephon_server.engine.errors.DataError`.
    """
    if not specs:
        raise ConfigError("datasets: at least one dataset is required (add a dataset spec)")
    cache = cache if cache is not None else default_cache()
    base = os.path.abspath(os.fspath(base_dir))
    seen: set[str] = set()
    infos: list[DatasetInfo] = []
    for index, spec in enumerate(specs):
        if not isinstance(spec, DatasetSpec):
            raise ConfigError(
                f"datasets[{index}]: expected a DatasetSpec, got {type(spec).__name__}"
            )
        if spec.name in seen:
            raise ConfigError(
                f"dataset {spec.name!r} is defined more than once (give every dataset a "
                "unique name)"
            )
        seen.add(spec.name)
        writes = cache.index.writes
        if is_url(spec.path):
            shards, counts = _object_shards(spec, cache)
        else:
            shards, counts = _counted_shards(_list_shards(spec, base), cache)
        info = DatasetInfo(spec=spec, index=index, shards=shards)
        if info.num_rows == 0:
            raise ConfigError(
                f"dataset {spec.name!r}: its {len(shards)} shard file(s) under {spec.path!r} "
                "hold no rows (add data or remove the dataset)"
            )
        check_text_columns(spec, [(s.path, s.num_rows) for s in shards], counts.columns, records)
        logger.info(
            "dataset %r: %d shards, %d rows, %d bytes (%s)",
            spec.name,
            len(shards),
            info.num_rows,
            info.size_bytes,
            "row counts from the index catalog"
            if counts.from_catalog
            else _indexed_now(cache.index.writes - writes),
        )
        infos.append(info)
    return infos


def stat_shard(path: str) -> os.stat_result:
    """``os.stat`` of a shard file (:class:`DataError` naming it when that fails)."""
    try:
        return os.stat(path)
    except OSError as exc:
        raise unreadable(path, exc) from exc


def shard_keys(
    listing: list[tuple[str, str]],
) -> tuple[list[os.stat_result], list[tuple[str, str, str]]]:
    """Stat every shard of a listing of (path, format): the stats, and the (location,
    identity, format) keys under which the shard index and its catalogs know them."""
    stats = [stat_shard(path) for path, _ in listing]
    keys = [
        (path, local_identity(st.st_size, st.st_mtime_ns), fmt)
        for (path, fmt), st in zip(listing, stats)
    ]
    return stats, keys


def _counted_shards(
    listing: list[tuple[str, str]], cache: ShardCache
) -> tuple[tuple[ShardInfo, ...], Counts]:
    """The shards with their identities now and the row counts of exactly those file
    versions, and the counts (rows, columns, whether from the index catalog).

    The cache counts under the identity (a changed file is counted again, a file changing
    while it is counted raises :class:`~.errors.ShardChanged`)."""
    stats, keys = shard_keys(listing)
    counts = count_shards(cache, keys)
    shards = tuple(
        ShardInfo(path, fmt, st.st_size, n, st.st_mtime_ns)
        for (path, fmt), st, n in zip(listing, stats, counts.rows)
    )
    return shards, counts


def _indexed_now(n: int) -> str:
    return f"{n} shard{'' if n == 1 else 's'} indexed now"


def list_shards(spec: DatasetSpec, base: str) -> list[tuple[str, str]]:
    """(absolute path, format) of every shard of ``spec``, sorted by path (``base``: the
    directory relative paths resolve against), as start-up lists them."""
    return _list_shards(spec, base)


def list_objects(spec: DatasetSpec) -> list[tuple[str, str, ObjectInfo]]:
    """(URL, format, object info) of every shard of an object-store dataset, sorted by key."""
    from .storage.listing import list_object_shards

    return list_object_shards(
        f"dataset {spec.name!r}",
        spec.path,
        spec.storage_options or StorageOptions(),
        spec.format,
        infer_format,
        supported_extensions(),
    )


def object_keys(listed: list[tuple[str, str, ObjectInfo]]) -> list[tuple[str, str, str]]:
    """The (location, identity, format) index keys of listed objects."""
    return [(url, identity_of(info), fmt) for url, fmt, info in listed]


def _object_shards(spec: DatasetSpec, cache: ShardCache) -> tuple[tuple[ShardInfo, ...], Counts]:
    """The shards of an object-store dataset, each counted as the version just listed
    (through the index catalog and entries, like local shards), and the counts."""
    listed = list_objects(spec)
    counts = count_shards(cache, object_keys(listed))
    shards = tuple(
        ShardInfo(url, fmt, info.size, n, info.mtime_ns, info.etag, info.version)
        for (url, fmt, info), n in zip(listed, counts.rows)
    )
    return shards, counts


def register_storage(datasets: Sequence[DatasetInfo]) -> None:
    """Make this process read every object-store dataset's bucket with its options (worker
    processes call it with the datasets they were handed)."""
    register_buckets([info.spec for info in datasets])


def register_buckets(specs: Sequence[DatasetSpec]) -> None:
    """Record each object-store dataset's ``storage_options`` for its bucket. Called before
    the index directory is opened too: an index in a dataset's bucket is reached as the
    dataset is (its endpoint and credentials), not with the defaults."""
    for spec in specs:
        if is_url(spec.path):
            configure_bucket(
                spec.path, spec.storage_options or StorageOptions(), f"dataset {spec.name!r}"
            )


def _list_shards(spec: DatasetSpec, base: str) -> list[tuple[str, str]]:
    """(absolute path, format) of every shard of ``spec``, sorted by path."""
    who = f"dataset {spec.name!r}"
    raw = os.path.expanduser(spec.path)
    full = os.path.abspath(raw if os.path.isabs(raw) else os.path.join(base, raw))
    if any(c in _GLOB_CHARS for c in raw):
        files = unique_files(who, glob_files(full))
        if not files:
            raise ConfigError(
                f"{who}: pattern {full!r} matches no files (check the path and the pattern; "
                f"relative paths resolve against {base!r})"
            )
        where = f"pattern {full!r}"
    elif os.path.isdir(full):
        files = unique_files(who, walk_files(full))
        where = f"directory {full!r}"
    elif os.path.isfile(full):
        fmt = spec.format or infer_format(full)
        if fmt is None:
            raise ConfigError(
                f"{who}: file {full!r} has an unsupported extension; supported: "
                f"{supported_extensions()} (rename it or set format)"
            )
        return [(full, fmt)]
    else:
        raise ConfigError(
            f"{who}: path {full!r} does not exist (configured as {spec.path!r}, relative paths "
            f"resolve against {base!r}; fix the path or the base directory)"
        )
    shards: list[tuple[str, str]] = []
    ignored: list[str] = []
    is_pattern = where.startswith("pattern")
    for path in files:
        fmt = infer_format(path)
        # The override applies to every file a pattern selects, but a directory still picks
        # its files by extension (so stray files such as READMEs are not read as data).
        if spec.format is not None and (fmt is not None or is_pattern):
            fmt = spec.format
        if fmt is not None:
            shards.append((path, fmt))
        else:
            ignored.append(path)
    root = glob_base(full) if is_pattern else full
    report_ignored(who, where, ignored, supported_extensions(), root)
    if not shards:
        raise ConfigError(
            f"{who}: {where} holds no shard files with a supported extension "
            f"({supported_extensions()}); add data files or point path at them"
        )
    return shards
