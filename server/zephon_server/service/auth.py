"""Bearer-token authentication for every RPC except health checks."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import grpc

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("auth token must not be empty")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        method = handler_call_details.method
        if method.startswith(EXEMPT_PREFIXES):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = str(metadata.get("authorization", "")).encode()
        if hmac.compare_digest(given, self._expected):
            return continuation(handler_call_details)
        reason = "missing" if not given else "wrong"
        return _deny(
            f"{reason} bearer token: send metadata 'authorization: Bearer <token>' "
            "(the server's --auth-token / ZEPHON_AUTH_TOKEN)"
        )


def _deny(message: str) -> grpc.RpcMethodHandler:
    """A handler that aborts at once; gRPC reads at most one request before calling it."""

    def unary(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(unary)
