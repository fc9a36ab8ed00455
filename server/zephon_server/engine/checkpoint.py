"""Resume state: small, plain, versioned, checksummed, written atomically.

A checkpoint holds the pipeline fingerprint (with a per-component breakdown, so a mismatch
can say *what* differs) and, per lane, only what regenerates that lane from its last epoch
boundary: the boundary's lane chunk id and the work-source state there, the replay cursor
(the last record delivered), the next seq and the chain digest. Chunk contents are not
stored: the work source regenerates them.

File format: ``MAGIC`` (8 bytes), format version (u16 little-endian), sha256 of the payload
(32 bytes), payload (UTF-8 JSON). No pickles. A signed checkpoint (written with a
:class:`~.checkpoint_key.CheckpointKey`) has version :data:`SIGNED_VERSION` and the
HMAC-SHA256 of magic, version and payload (32 bytes) between the checksum and the payload; the
payload is the same. So an unsigned file is recognisable as such, and an older server refuses a
signed one as "newer" instead of misreading it.

Format versions 1 (unsigned) and 2 (signed) were written by Zephon 0.1, whose data order came
from numpy's random streams; the work source now orders data with its own permutation, so the
positions in such a file point at other data. They are refused (:data:`RETIRED_VERSIONS`), never
reinterpreted: 3 and 4 are the same layouts for the new order.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint_key import MAC_BYTES, CheckpointKey
from .errors import ConfigError, ZephonError
from .manifest import COPY_HINT, ShardManifest, describe_data_change, manifest_dir
from .pipeline import FINGERPRINT_CHANGES

log = logging.getLogger(__name__)

MAGIC = b"ZEPHONCK"
FORMAT_VERSION = 3
"""The header version of an unsigned checkpoint (3: the data order of :mod:`.permutation`)."""
SIGNED_VERSION = 4
"""The header version of a signed checkpoint (its payload is a :data:`FORMAT_VERSION` one)."""
RETIRED_VERSIONS = {1: (False, "0.1"), 2: (True, "0.1")}
"""Older header versions: whether they are signed, and the Zephon release that reads them."""
_HEADER = struct.Struct("<8sH32s")
_VERSION = struct.Struct("<H")


class CheckpointError(ZephonError):
    """Base of checkpoint problems."""


class CorruptCheckpoint(CheckpointError):
    """The bytes are not a complete, intact checkpoint (DATA_LOSS on the wire)."""


class IncompatibleCheckpoint(CheckpointError):
    """The checkpoint belongs to another pipeline or a newer format (FAILED_PRECONDITION)."""


class UnreadableCheckpoint(CorruptCheckpoint):
    """The checkpoint's file cannot be read: a directory, no permission, an I/O error."""


class InaccessibleCheckpoint(UnreadableCheckpoint):
    """The checkpoint's file is there but the server may not read it (permissions, an I/O
    error): ``--resume latest`` stops there rather than roll the run back to an older one."""


class UntrustedCheckpoint(CheckpointError):
    """Unsigned, or signed with another key, on a server that has a checkpoint key
    (PERMISSION_DENIED on the wire)."""


class UnsignedCheckpoint(UntrustedCheckpoint):
    """The checkpoint carries no signature, and this server requires one."""


class BadSignature(UntrustedCheckpoint):
    """The checkpoint's signature is not this key's: forged, or signed with another key."""


class NoUsableCheckpoint(CheckpointError):
    """``--resume latest``: checkpoint files exist but every one tried was refused."""


class CheckpointNotSaved(CheckpointError):
    """The state directory refused the checkpoint file (an ``OSError`` writing it); nothing
    was saved and the server goes on serving (UNAVAILABLE on the wire)."""


class NoSpaceForCheckpoint(CheckpointNotSaved):
    """The state directory's filesystem is full (``ENOSPC``/``EDQUOT``; RESOURCE_EXHAUSTED)."""


class StateDirNotWritable(CheckpointNotSaved):
    """The state directory is read-only or not ours to write (FAILED_PRECONDITION)."""


class UnknownCheckpoint(CheckpointError, KeyError):
    """No checkpoint with that id in the state directory (NOT_FOUND)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown checkpoint"


@dataclass
class LaneState:
    """What regenerates one lane: boundary, work-source state, replay cursor, seq, chain."""

    next_seq: int
    boundary_chunk: int
    work_source: dict[str, Any] | None
    replay_cursor: tuple[int, ...] | None
    chain: bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "next_seq": self.next_seq,
            "boundary_chunk": self.boundary_chunk,
            "work_source": self.work_source,
            "replay_cursor": list(self.replay_cursor) if self.replay_cursor is not None else None,
            "chain": self.chain.hex(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaneState:
        """Parse one lane's state; ``ValueError`` naming the field, expected and found."""
        if not isinstance(data, dict):
            raise ValueError(f"lane state: expected an object, found {_kind(data)}")
        cursor = data["replay_cursor"]
        if cursor is not None and not (
            isinstance(cursor, list) and all(_is_count(c) for c in cursor)
        ):
            raise ValueError(
                f"replay_cursor: expected null or a list of integers >= 0, found {cursor!r:.80}"
            )
        work_source = data["work_source"]
        if work_source is not None and not isinstance(work_source, dict):
            raise ValueError(f"work_source: expected null or an object, found {_kind(work_source)}")
        chain = data["chain"]
        if not isinstance(chain, str) or len(chain) != 64:
            raise ValueError(f"chain: expected 64 hex digits, found {chain!r:.80}")
        return cls(
            next_seq=_count(data, "next_seq"),
            boundary_chunk=_count(data, "boundary_chunk"),
            work_source=work_source,
            replay_cursor=tuple(cursor) if cursor is not None else None,
            chain=bytes.fromhex(chain),
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _count(data: dict[str, Any], key: str) -> int:
    value = data[key]
    if not _is_count(value):
        raise ValueError(f"{key}: expected an integer >= 0, found {value!r:.80}")
    return int(value)


@dataclass
class ResumeState:
    """A checkpoint: fingerprint plus per-lane states (only the lanes it covers)."""

    fingerprint: str
    components: dict[str, str]
    lanes: dict[int, LaneState]
    num_lanes: int
    created: float = field(default_factory=time.time)
    tag: str = ""
    #: The file the bytes were read from ("" for bytes from elsewhere): not part of the
    #: checkpoint; a refused resume looks for the shard manifest next to it.
    origin: str = field(default="", compare=False)

    def positions(self) -> dict[int, int]:
        return {lane: st.next_seq for lane, st in sorted(self.lanes.items())}

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "components": self.components,
            "num_lanes": self.num_lanes,
            "created": self.created,
            "tag": self.tag,
            "lanes": {str(lane): st.to_json() for lane, st in sorted(self.lanes.items())},
        }

    def encode(self, key: CheckpointKey | None = None) -> bytes:
        """The checkpoint's bytes (header + checksummed JSON; signed with ``key``)."""
        payload = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        checksum = hashlib.sha256(payload).digest()
        if key is None:
            return _HEADER.pack(MAGIC, FORMAT_VERSION, checksum) + payload
        mac = key.sign(MAGIC + _VERSION.pack(SIGNED_VERSION) + payload)
        return _HEADER.pack(MAGIC, SIGNED_VERSION, checksum) + mac + payload

    @classmethod
    def decode(cls, data: bytes, key: CheckpointKey | None = None) -> ResumeState:
        """Parse and verify checkpoint bytes; nothing is applied on any error.

        With ``key``, the checkpoint must be signed with it (:class:`UntrustedCheckpoint`
        otherwise); without, a signed one is accepted on its checksum.
        """
        payload, version = _verified_payload(data)
        _check_signature(data, payload, version, key)
        return cls._parse(payload)

    @classmethod
    def _parse(cls, payload: bytes) -> ResumeState:
        try:
            doc = json.loads(payload)
            if not isinstance(doc, dict):
                raise ValueError(f"expected a JSON object, found {_kind(doc)}")
            num_lanes = _count(doc, "num_lanes")
            lanes = {}
            for key, value in dict(doc["lanes"]).items():
                lane = int(key)
                if not 0 <= lane < num_lanes:
                    raise ValueError(f"lane {lane}: expected a lane in 0..{num_lanes - 1}")
                lanes[lane] = LaneState.from_json(value)
            fingerprint = doc["fingerprint"]
            if not isinstance(fingerprint, str):
                raise ValueError(f"fingerprint: expected a string, found {_kind(fingerprint)}")
            return cls(
                fingerprint=fingerprint,
                components={str(k): str(v) for k, v in dict(doc["components"]).items()},
                lanes=lanes,
                num_lanes=num_lanes,
                created=float(doc.get("created", 0.0)),
                tag=str(doc.get("tag", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpoint(f"checkpoint payload is malformed: {exc!r}") from exc

    @classmethod
    def merge(cls, states: list[ResumeState]) -> ResumeState:
        """Combine checkpoints of disjoint lane sets (ranks or shards) into one."""
        if not states:
            raise CheckpointError("nothing to merge")
        first = states[0]
        lanes: dict[int, LaneState] = {}
        for st in states:
            if st.fingerprint != first.fingerprint:
                raise IncompatibleCheckpoint(
                    f"cannot merge checkpoints of different pipelines "
                    f"({first.fingerprint[:16]} and {st.fingerprint[:16]})"
                )
            overlap = set(lanes) & set(st.lanes)
            if overlap:
                raise CheckpointError(f"checkpoints overlap on lanes {sorted(overlap)}")
            lanes.update(st.lanes)
        return cls(first.fingerprint, dict(first.components), lanes, first.num_lanes, tag=first.tag)

    def check_compatible(
        self,
        fingerprint: str,
        components: dict[str, str],
        *,
        datasets: Sequence[Any] = (),
        manifest_dirs: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        """Raise :class:`IncompatibleCheckpoint` naming what differs from this pipeline.

        ``datasets`` (the pipeline's resolved :class:`~.datasets.DatasetInfo`) lets a data
        change be explained shard by shard from the checkpoint's shard manifest, looked for
        next to :attr:`origin` and in ``manifest_dirs`` (see :mod:`.manifest`).
        """
        if self.fingerprint == fingerprint:
            return
        self._check_fingerprint_version(fingerprint, components)
        differing = [
            k
            for k in sorted(set(self.components) | set(components))
            if self.components.get(k) != components.get(k)
        ]
        # Shards of a dataset on both sides; a dataset on one side only is a config change.
        changed = [
            k.split(":", 1)[1]
            for k in differing
            if k.startswith("shards:") and k in self.components and k in components
        ]
        config = [
            f"{k} (checkpoint {self.components.get(k, '-')}, pipeline {components.get(k, '-')})"
            for k in differing
            if not k.startswith("shards:")
        ]
        data, hint = self._describe_data_change(changed, datasets, manifest_dirs)
        which = (
            f"checkpoint fingerprint {self.fingerprint[:16]}, this pipeline's {fingerprint[:16]}"
        )
        if config or not data:
            also = f"; and the data changed: {data}" if data else ""
            raise IncompatibleCheckpoint(
                f"checkpoint is from another pipeline: {which}; differs in: "
                f"{', '.join(config) or 'unknown'}{also}. "
                "Resume with the pipeline config it was taken with"
            )
        raise IncompatibleCheckpoint(
            f"checkpoint does not match the data: the shards changed since it was taken "
            f"({which}): {data}. Its positions point at rows of the files it was taken on, so "
            "resuming on these would serve other data. Restore the original files"
            + (f"; {COPY_HINT}" if hint else "")
            + ". To train on the changed data, start a new run (without a resume)"
        )

    def _check_fingerprint_version(self, fingerprint: str, components: dict[str, str]) -> None:
        """A checkpoint of another fingerprint scheme cannot be compared part by part."""
        ours = components.get("fingerprint_version", "-")
        theirs = self.components.get("fingerprint_version", "1")  # version 1 had no such part
        if theirs != ours:
            raise IncompatibleCheckpoint(
                f"checkpoint was taken with fingerprint version {theirs} and this server "
                f"computes version {ours}{_fingerprint_changes(theirs, ours)}, so it cannot be "
                f"checked against the current data (checkpoint fingerprint "
                f"{self.fingerprint[:16]}, this pipeline's {fingerprint[:16]}). Resume it with "
                "the Zephon version that took it, or start a new run"
            )

    def _describe_data_change(
        self,
        names: list[str],
        datasets: Sequence[Any],
        manifest_dirs: Sequence[str | os.PathLike[str]],
    ) -> tuple[str, bool]:
        """What changed in the shards of datasets ``names`` ("" for none), and whether the
        copy hint applies; shard by shard when a manifest of this checkpoint is found."""
        if not names:
            return "", False
        if not datasets:
            return (
                f"the shard list, or a shard's size, modification time or row count, of "
                f"dataset(s) {', '.join(repr(n) for n in names)}",
                True,
            )
        dirs = [manifest_dir(Path(self.origin).parent)] if self.origin else []
        dirs += [Path(d) for d in manifest_dirs if Path(d) not in dirs]
        current = ShardManifest.of("", datasets)
        return describe_data_change(self.fingerprint, names, current, dirs)


def _fingerprint_changes(theirs: str, ours: str) -> str:
    """`` (which ...)``: what the fingerprint versions after ``theirs`` up to ``ours`` changed."""
    if not (theirs.isdigit() and ours.isdigit()):
        return ""
    changes = [FINGERPRINT_CHANGES.get(v, "") for v in range(int(theirs) + 1, int(ours) + 1)]
    return f" (which {'; and '.join(c for c in changes if c)})" if any(changes) else ""


def _verified_payload(data: bytes) -> tuple[bytes, int]:
    """The payload of checkpoint bytes whose header and checksum are intact, and the header
    version; :class:`CorruptCheckpoint` / :class:`IncompatibleCheckpoint` otherwise."""
    if len(data) < _HEADER.size:
        raise CorruptCheckpoint(
            f"checkpoint is truncated: {len(data)} bytes, shorter than its "
            f"{_HEADER.size}-byte header"
        )
    magic, version, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptCheckpoint(
            f"not a Zephon checkpoint (starts with {magic!r}, expected {MAGIC!r})"
        )
    if version > SIGNED_VERSION:
        raise IncompatibleCheckpoint(
            f"checkpoint format version {version} is newer than this server's "
            f"{SIGNED_VERSION}; resume it with a newer Zephon"
        )
    signed = version == SIGNED_VERSION or RETIRED_VERSIONS.get(version, (False, ""))[0]
    start = _HEADER.size + (MAC_BYTES if signed else 0)
    if len(data) < start:
        raise CorruptCheckpoint(
            f"checkpoint is truncated: {len(data)} bytes, shorter than its {start}-byte "
            "signed header"
        )
    payload = data[start:]
    found = hashlib.sha256(payload).digest()
    if found != checksum:
        raise CorruptCheckpoint(
            "checkpoint checksum mismatch: the file is truncated or corrupted "
            f"(expected sha256 {checksum.hex()[:16]}..., found {found.hex()[:16]}... over "
            f"{len(payload)} payload bytes); use another checkpoint"
        )
    if version in RETIRED_VERSIONS:
        raise _retired(version)
    if version not in (FORMAT_VERSION, SIGNED_VERSION):
        raise CorruptCheckpoint(
            f"checkpoint header is corrupt: format version {version}, expected "
            f"{FORMAT_VERSION} (unsigned) or {SIGNED_VERSION} (signed)"
        )
    return payload, version


def _retired(version: int) -> IncompatibleCheckpoint:
    """The refusal of an intact checkpoint of an older format (:data:`RETIRED_VERSIONS`)."""
    signed, release = RETIRED_VERSIONS[version]
    kind, ours = ("signed", SIGNED_VERSION) if signed else ("unsigned", FORMAT_VERSION)
    return IncompatibleCheckpoint(
        f"checkpoint format version {version} ({kind}) is older than this server's {ours}: it "
        f"was written by Zephon {release}, whose data order came from numpy's random streams; "
        "this server orders shards, rows and lanes with its own permutation, so its positions "
        f"would point at other data. Resume it with Zephon {release}, or start a new run "
        "(without a resume)"
    )


def _check_signature(data: bytes, payload: bytes, version: int, key: CheckpointKey | None) -> None:
    """Refuse (:class:`UntrustedCheckpoint`) what ``key`` does not vouch for."""
    if key is None:
        if version == SIGNED_VERSION:
            log.debug("checkpoint is signed; no --checkpoint-key to verify it, its checksum holds")
        return
    if version != SIGNED_VERSION:
        raise UnsignedCheckpoint(
            "checkpoint is not signed; this server requires signed checkpoints (its key is "
            f"from {key.source}): resume it on a server without a key, or sign it with "
            "'zephon sign-checkpoint' if you trust it"
        )
    mac = data[_HEADER.size : _HEADER.size + MAC_BYTES]
    if not key.verify(MAGIC + _VERSION.pack(version) + payload, mac):
        raise BadSignature(
            "checkpoint signature does not match (forged, or signed with another key); the key "
            f"given is from {key.source}: use a checkpoint this key signed, or the key that "
            "signed it"
        )


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync the directory."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_state_file(path: str | os.PathLike[str], key: CheckpointKey | None = None) -> ResumeState:
    """Load and verify a checkpoint file (signed with ``key`` when one is given); its
    :attr:`~ResumeState.origin` is ``path``.

    A path that is not a readable file is :class:`UnreadableCheckpoint` (a kind of corrupt
    checkpoint) naming the path and the fix; a missing one :class:`UnknownCheckpoint`.
    """
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UnknownCheckpoint(f"checkpoint file {name!r} does not exist") from None
    except IsADirectoryError:
        raise UnreadableCheckpoint(
            f"checkpoint file {name!r} is a directory, not a file (move it out of the way)"
        ) from None
    except OSError as exc:
        raise InaccessibleCheckpoint(
            f"checkpoint file {name!r} cannot be read: {exc.strerror or exc} (check its owner, "
            "mode and the disk)"
        ) from None
    return dataclasses.replace(ResumeState.decode(data, key), origin=os.path.abspath(path))


CHECKPOINT_ID = re.compile(r"^ckpt-(\d{8})(-[A-Za-z0-9_.-]{1,64})?$")
"""What a checkpoint id looks like (the file name without ``.zck``)."""


@dataclass(frozen=True)
class Refusal:
    """A checkpoint the search for the latest one did not take, and the error that refused it."""

    checkpoint_id: str
    error: CheckpointError

    def __str__(self) -> str:
        return f"{self.checkpoint_id}: {self.error}"


@dataclass(frozen=True)
class LatestPick:
    """What :meth:`CheckpointStore.pick_latest` found: the checkpoint taken (or None), the
    newer ones it refused, and how many older ones it did not try after a stopping refusal."""

    found: tuple[str, ResumeState] | None
    refused: tuple[Refusal, ...]
    untried: int = 0

    def describe(self, limit: int = 8) -> str:
        """The refusals on one line (the first ``limit``), newest first."""
        parts = [str(r) for r in self.refused[:limit]]
        if len(self.refused) > limit:
            parts.append(f"... and {len(self.refused) - limit} more refused")
        if self.untried:
            parts.append(f"{self.untried} older checkpoint(s) not tried")
        return "; ".join(parts)


class CheckpointStore:
    """Checkpoints in a state directory: ``ckpt-<n>[-tag].zck``, newest = highest n.

    ``keep``: after each save, delete all but the newest ``keep`` checkpoints (tagged or not);
    0 keeps every one. Saves are serialized, so concurrent callers get distinct ids. One server
    process per state directory. With ``key``, checkpoints are signed when saved and must be
    signed with it when loaded.
    """

    suffix = ".zck"

    def __init__(
        self, state_dir: str | os.PathLike[str], keep: int = 0, key: CheckpointKey | None = None
    ) -> None:
        if not isinstance(keep, int) or keep < 0:
            raise ValueError(f"keep must be an integer >= 0 (0: keep all), got {keep!r}")
        self.dir = Path(state_dir)
        self.keep = keep
        self.key = key
        self._lock = threading.Lock()
        #: Whether the directory had to be made (it did not exist before this store).
        self.created = not self.dir.is_dir()
        if self.dir.exists() and self.created:
            raise ConfigError(
                f"--state-dir {self.dir} is not a directory (a file is there): give the path of "
                "a directory, or move that file"
            )
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"--state-dir {self.dir} cannot be made: {exc.strerror or exc}; create it, or "
                "make its parent writable by the server's user, or give another path"
            ) from None
        self.clean_temp_files()
        self._check_writable()

    def _check_writable(self) -> None:
        """Warn at start-up when no checkpoint could be written here (read-only, not the
        server's user's, full): otherwise the first ``Checkpoint``, maybe hours in, finds out."""
        try:
            fd, probe = tempfile.mkstemp(prefix=".ckpt-probe.", suffix=".tmp", dir=self.dir)
            try:
                os.write(fd, b"zephon")
            finally:
                os.close(fd)
                os.unlink(probe)
        except OSError as exc:
            log.warning(
                "--state-dir %s is not writable (%s): checkpoints will fail until it is (a "
                "resume from it works); make it a writable directory of the server's user",
                self.dir,
                exc.strerror or exc,
            )

    def clean_temp_files(self) -> int:
        """Remove temp files left by an interrupted write; returns how many. One that cannot
        be removed (a read-only state directory, which still serves a resume) is left with a
        warning."""
        n = 0
        for stray in self.dir.glob(".ckpt-*.tmp"):
            try:
                stray.unlink(missing_ok=True)
            except OSError as exc:
                log.warning(
                    "cannot remove %s, left by an interrupted checkpoint write: %s (checkpoints "
                    "cannot be saved in %s until it is writable)",
                    stray,
                    exc.strerror or exc,
                    self.dir,
                )
                continue
            n += 1
        return n

    def ids(self) -> list[str]:
        """Checkpoint ids, oldest first."""
        found = [p.name[: -len(self.suffix)] for p in self.dir.glob(f"ckpt-*{self.suffix}")]
        return sorted((i for i in found if CHECKPOINT_ID.match(i)), key=lambda i: int(i[5:13]))

    def save(self, state: ResumeState) -> tuple[str, bytes]:
        """Persist atomically under a new id; returns (id, bytes).

        An ``OSError`` writing the file (a full disk, a read-only directory) raises
        :class:`CheckpointNotSaved` naming the directory and the fix; no partial file stays.
        """
        tag = re.sub(r"[^A-Za-z0-9_.-]", "_", state.tag)[:64]
        data = state.encode(self.key)
        with self._lock:
            ids = self.ids()
            n = int(ids[-1][5:13]) + 1 if ids else 1
            cid = f"ckpt-{n:08d}" + (f"-{tag}" if tag else "")
            try:
                write_atomic(self.dir / f"{cid}{self.suffix}", data)
            except OSError as exc:
                raise self._not_saved(exc, cid, len(data), len(ids)) from exc
            if self.keep:
                for old in [*ids, cid][: -self.keep]:
                    (self.dir / f"{old}{self.suffix}").unlink(missing_ok=True)
                    log.info("deleted checkpoint %s (keeping the newest %d)", old, self.keep)
        return cid, data

    def _not_saved(self, exc: OSError, cid: str, size: int, count: int) -> CheckpointNotSaved:
        """The error for a checkpoint file the state directory refused."""
        what = f"checkpoint {cid} ({size} bytes) was not saved"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                fs = os.statvfs(self.dir)
                free = f"{fs.f_bavail * fs.f_frsize} bytes free"
            except OSError:
                free = "free space unknown"
            keep = f"now {self.keep}" if self.keep else "now 0: keep all"
            fewer = f" or lower --keep-checkpoints ({keep})" if count else ""
            return NoSpaceForCheckpoint(
                f"no space left in {self.dir} ({free}, {count} checkpoints kept): {what}; "
                f"free space on that filesystem{fewer}; the replay cache under it takes at "
                "most --replay-cache-max-bytes"
            )
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.EEXIST, errno.ENOTDIR) or (
            self.dir.exists() and not self.dir.is_dir()
        ):
            return StateDirNotWritable(
                f"--state-dir {self.dir} is not a directory any more ({reason}): {what}; "
                "remove what replaced it, then checkpoint again"
            )
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return StateDirNotWritable(
                f"cannot write in {self.dir}: {reason}: {what}; make --state-dir a writable "
                "directory of the server's user"
            )
        return CheckpointNotSaved(
            f"cannot write in {self.dir}: {reason} (errno {exc.errno}): {what}; check the disk "
            "under --state-dir, then checkpoint again"
        )

    def load(self, checkpoint_id: str) -> ResumeState:
        """The checkpoint with that id (verified)."""
        if not CHECKPOINT_ID.match(checkpoint_id):
            raise UnknownCheckpoint(
                f"unknown checkpoint id {checkpoint_id!r}; ids look like ckpt-00000001"
            )
        path = self.dir / f"{checkpoint_id}{self.suffix}"
        if not path.exists():
            ids = self.ids()
            deleted = ""
            if self.keep and ids and int(checkpoint_id[5:13]) < int(ids[0][5:13]):
                deleted = (
                    f" (deleted: the server keeps only the newest {self.keep}; raise "
                    "--keep-checkpoints, or resume from the state bytes the trainer saved)"
                )
            raise UnknownCheckpoint(
                f"unknown checkpoint id {checkpoint_id!r}{deleted}; available: {ids[-5:]}"
            )
        return read_state_file(path, self.key)

    def pick_latest(self, accept: Callable[[ResumeState], None] | None = None) -> LatestPick:
        """The newest checkpoint that loads and that ``accept`` takes (it raises a
        :class:`CheckpointError` to refuse one), with the newer ones refused.

        Damage (corrupt, truncated, a directory) is skipped with a warning and the search goes
        on to older checkpoints. A checkpoint refused for what it is (another pipeline, a newer
        format, unsigned or wrongly signed), or that the server may not read (permissions, an
        I/O error: :class:`InaccessibleCheckpoint`), stops the search: taking an older one
        behind it would silently roll the run back.
        """
        ids = self.ids()
        odd = sorted(
            p.name
            for p in self.dir.glob(f"*{self.suffix}")
            if p.name[: -len(self.suffix)] not in ids
        )
        if odd:  # a file someone named by hand, or copied in: never resumed, but said so
            log.warning(
                "looking for the latest checkpoint: %d file(s) in %s are not named as checkpoints "
                "(ckpt-<8 digits>[-tag].zck) and are not considered: %s; resume one of them "
                "with --resume FILE",
                len(odd),
                self.dir,
                ", ".join(odd[:5]) + (" ..." if len(odd) > 5 else ""),
            )
        refused: list[Refusal] = []
        for i, cid in enumerate(reversed(ids)):
            try:
                state = self.load(cid)
                if accept is not None:
                    accept(state)
            except InaccessibleCheckpoint as exc:  # there, but not ours to read: say so
                refused.append(Refusal(cid, exc))
                return LatestPick(None, tuple(refused), untried=len(ids) - i - 1)
            except (CorruptCheckpoint, UnknownCheckpoint) as exc:
                log.warning("skipping corrupt checkpoint %s: %s", cid, exc)
                refused.append(Refusal(cid, exc))
                continue
            except CheckpointError as exc:
                refused.append(Refusal(cid, exc))
                return LatestPick(None, tuple(refused), untried=len(ids) - i - 1)
            return LatestPick((cid, state), tuple(refused))
        return LatestPick(None, tuple(refused))

    def latest(self) -> tuple[str, ResumeState] | None:
        """The newest checkpoint that loads, or None when there is none (or all are damaged).

        A corrupt newer checkpoint (truncated or damaged on disk) is skipped with a warning;
        one refused for what it is (a newer format, unsigned...) raises that refusal.
        """
        pick = self.pick_latest()
        if pick.found is None and pick.refused:
            last = pick.refused[-1].error
            damage = isinstance(last, CorruptCheckpoint | UnknownCheckpoint)
            if not damage or isinstance(last, InaccessibleCheckpoint):
                raise last
        return pick.found
