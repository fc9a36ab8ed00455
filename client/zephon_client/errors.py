"""Errors the Zephon client raises.

* :class:`ZephonClientError`: the server answered with a gRPC status the client does not
  recover from (``OUT_OF_RANGE``, ``UNAUTHENTICATED``, ``NOT_FOUND`` ...), reconnecting gave up
  after ``reconnect_timeout``, or the server broke the protocol / the client was misused
  (``code`` is ``None`` for those).
* :class:`PipelineMismatch` (a ``ZephonClientError``, ``FAILED_PRECONDITION``): a server the
  client (re)connected to serves another pipeline than the one the client started with (a
  different fingerprint or lane count), so its batches would differ from the stream's.
* :class:`~zephon_client.wire.ChainMismatch`: a batch's digests do not match its tensors or
  the lane's previous chain digest (the stream is not the uninterrupted one).
* :class:`~zephon_client.wire.WireError`: a message does not follow the wire format.
"""

from __future__ import annotations

import grpc

from .wire import ChainMismatch, WireError

__all__ = ["ChainMismatch", "PipelineMismatch", "WireError", "ZephonClientError"]


class ZephonClientError(RuntimeError):
    """A failed call to a Zephon server, or a client-side protocol/usage error.

    ``code`` is the gRPC status code (``None`` when the error did not come from the server),
    ``message`` the server's message (its ``details``) or the client's explanation; ``lane``
    and ``address`` say where it happened when known.
    """

    def __init__(
        self,
        code: grpc.StatusCode | None,
        message: str,
        *,
        lane: int | None = None,
        address: str | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.lane = lane
        self.address = address
        where = []
        if address is not None:
            where.append(f"server {address}")
        if lane is not None:
            where.append(f"lane {lane}")
        prefix = code.name if code is not None else "error"
        suffix = f" ({', '.join(where)})" if where else ""
        super().__init__(f"{prefix}{suffix}: {message}")

    @classmethod
    def from_rpc_error(
        cls, error: grpc.RpcError, *, lane: int | None = None, address: str | None = None
    ) -> ZephonClientError:
        """Wrap a ``grpc.RpcError`` (a failed call) keeping its code and the server's message."""
        code = error.code() if callable(getattr(error, "code", None)) else None  # type: ignore[attr-defined]
        details = error.details() if callable(getattr(error, "details", None)) else None  # type: ignore[attr-defined]
        return cls(code, details or str(error), lane=lane, address=address)


class PipelineMismatch(ZephonClientError):
    """The server at ``address`` now serves another pipeline than this client's.

    Raised when a (re)connection's ``GetInfo`` reports a fingerprint or lane count other than
    the one the client learnt when it was constructed (typically: the server was restarted
    with another configuration on the same address). Continuing would yield another stream's
    batches under the same seqs, so the client stops instead, whatever ``verify`` says.
    ``expected_*`` are the client's, ``found_*`` the server's.
    """

    def __init__(
        self,
        *,
        address: str,
        expected_fingerprint: str,
        found_fingerprint: str,
        expected_lanes: int,
        found_lanes: int,
        lane: int | None = None,
    ) -> None:
        self.expected_fingerprint = expected_fingerprint
        self.found_fingerprint = found_fingerprint
        self.expected_lanes = expected_lanes
        self.found_lanes = found_lanes
        super().__init__(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the server now serves another pipeline: fingerprint {found_fingerprint} with "
            f"{found_lanes} lanes, but this client streams fingerprint {expected_fingerprint} "
            f"with {expected_lanes} lanes; its batches would differ, so the client stops. "
            "Restart the trainer from a checkpoint of the pipeline the server serves now, or "
            f"point the client at a server of pipeline {expected_fingerprint}",
            lane=lane,
            address=address,
        )
