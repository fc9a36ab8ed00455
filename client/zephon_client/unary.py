"""Unary calls to a Zephon server, retried while it is unavailable.

A server restarting, or a port not listening yet, answers ``UNAVAILABLE``: the call is retried
with exponential backoff (the streams' :data:`~.stream.BACKOFF_INITIAL` to
:data:`~.stream.BACKOFF_MAX`) for ``reconnect_timeout`` seconds, each retry logged with the
cause when one is known. A cause that waiting cannot fix (:mod:`.connect_hint`: a TLS
mismatch, a refused certificate) fails at once, naming its fix.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc

from .channel import Endpoint
from .connect_hint import diagnose_error
from .errors import ZephonClientError
from .stream import BACKOFF_INITIAL, BACKOFF_MAX

logger = logging.getLogger("zephon_client.client")


def call_unary(
    endpoint: Endpoint,
    method: str,
    request: Any,
    *,
    timeout: float | None,
    metadata: Any,
    reconnect_timeout: float,
    closed: threading.Event,
) -> Any:
    """``method`` of ``endpoint``'s stub with ``request`` (deadline ``timeout``); raises
    :class:`ZephonClientError` for a status other than ``UNAVAILABLE``, a permanent cause,
    ``reconnect_timeout`` spent, or ``closed`` set."""
    if closed.is_set():
        raise ZephonClientError(None, "the client is closed")
    deadline = time.monotonic() + reconnect_timeout
    delay = BACKOFF_INITIAL
    while True:
        try:
            return getattr(endpoint.stub, method)(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as error:
            code = error.code() if callable(getattr(error, "code", None)) else None  # type: ignore[attr-defined]
            remaining = deadline - time.monotonic()
            why = diagnose_error(endpoint.address, endpoint.tls, error)
            permanent = why is not None and why.permanent
            if (
                code != grpc.StatusCode.UNAVAILABLE
                or permanent
                or remaining <= 0
                or closed.is_set()
            ):
                err = ZephonClientError.from_rpc_error(error, address=endpoint.address)
                if code == grpc.StatusCode.UNAVAILABLE:
                    gave_up = (
                        "not retried" if permanent else f"gave up after {reconnect_timeout:g} s"
                    )
                    hint = f"; {why.hint}" if why is not None else ""
                    err = ZephonClientError(
                        code, f"{err.message} ({method}; {gave_up}){hint}", address=endpoint.address
                    )
                raise err from None
            logger.warning(
                "%s on %s: UNAVAILABLE; retrying in %.1f s%s",
                method,
                endpoint.address,
                delay,
                f" ({why.hint})" if why is not None else "",
            )
            if closed.wait(min(delay, remaining)):
                raise ZephonClientError(None, "the client is closed") from None
            delay = min(delay * 2, BACKOFF_MAX)
