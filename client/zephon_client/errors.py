"""Errors the Zephon client raises.

* :class:`ZephonClientError`: the server answered with a gRPC status the client does not
  recover from (``OUT_OF_RANGE``, ``UNAUTHENTICATED``, ``NOT_FOUND`` ...), reconnecting gave up
  after ``reconnect_timeout``, or the server broke the protocol / the client was misused
  (``code`` is ``None`` for those).
* :class:`~zephon_client.wire.ChainMismatch`: a batch's digests do not match its tensors or
  the lane's previous chain digest (the stream is not the uninterrupted one).
* :class:`~zephon_client.wire.WireError`: a message does not follow the wire format.
"""

from __future__ import annotations

import grpc

from .wire import ChainMismatch, WireError

__all__ = ["ChainMismatch", "WireError", "ZephonClientError"]


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
