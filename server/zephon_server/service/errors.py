"""Engine errors to gRPC status codes (DESIGN.md §5); never UNKNOWN, never a traceback."""

from __future__ import annotations

import logging

import grpc

from ..engine.checkpoint import (
    CheckpointError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    UnknownCheckpoint,
    UntrustedCheckpoint,
)
from ..engine.errors import ConfigError, ZephonError
from ..engine.hub import BadLane, HubClosed, OutOfRange

log = logging.getLogger(__name__)

_CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (BadLane, grpc.StatusCode.INVALID_ARGUMENT),
    (OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (UnknownCheckpoint, grpc.StatusCode.NOT_FOUND),
    (IncompatibleCheckpoint, grpc.StatusCode.FAILED_PRECONDITION),
    (UntrustedCheckpoint, grpc.StatusCode.PERMISSION_DENIED),
    (CorruptCheckpoint, grpc.StatusCode.DATA_LOSS),
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
    log.exception("unexpected error while serving")
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def abort(context: grpc.ServicerContext, exc: BaseException) -> None:
    """Abort the RPC with the mapped status (raises)."""
    code, message = status_for(exc)
    context.abort(code, message)
