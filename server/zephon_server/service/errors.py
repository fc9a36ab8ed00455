"""Engine errors to gRPC status codes (DESIGN.md §5); never UNKNOWN, never a traceback."""

from __future__ import annotations

import logging

import grpc

from ..delivery.hub import BadLane, HubClosed, OutOfRange
from ..engine.checkpoint import (
    CheckpointError,
    CheckpointNotSaved,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    NoSpaceForCheckpoint,
    StateDirNotWritable,
    UnknownCheckpoint,
    UntrustedCheckpoint,
)
from ..engine.errors import ConfigError, ZephonError

log = logging.getLogger(__name__)


class InvalidRequest(ZephonError, ValueError):
    """A request field over its limit or otherwise malformed (INVALID_ARGUMENT); the message
    names the field, the limit and what was found (:mod:`.limits`)."""


_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (BadLane, grpc.StatusCode.INVALID_ARGUMENT),
    (OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (UnknownCheckpoint, grpc.StatusCode.NOT_FOUND),
    (IncompatibleCheckpoint, grpc.StatusCode.FAILED_PRECONDITION),
    (UntrustedCheckpoint, grpc.StatusCode.PERMISSION_DENIED),
    (CorruptCheckpoint, grpc.StatusCode.DATA_LOSS),
    (NoSpaceForCheckpoint, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StateDirNotWritable, grpc.StatusCode.FAILED_PRECONDITION),
    (CheckpointNotSaved, grpc.StatusCode.UNAVAILABLE),
    (CheckpointError, grpc.StatusCode.OUT_OF_RANGE),
    (HubClosed, grpc.StatusCode.UNAVAILABLE),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
]


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for an exception raised while serving."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code, str(exc)
    if isinstance(exc, ZephonError):
        return grpc.StatusCode.INTERNAL, f"pipeline failed: {exc}".split("\n--- worker")[0]
    if isinstance(exc, OSError):
        # A file the server reads or writes (state directory, checkpoint file): the disk's
        # problem, not a bug, so one line and no traceback.
        where = f" ({exc.filename})" if exc.filename else ""
        message = f"server-side I/O error{where}: {exc.strerror or exc}; check the server's disk"
        log.warning("%s", message)
        return grpc.StatusCode.UNAVAILABLE, message
    log.exception("unexpected error while serving")
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    """Abort the RPC with the mapped status (raises)."""
    code, message = status_for(exc)
    context.abort(code, message)
