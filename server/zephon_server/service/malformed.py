"""Requests whose bytes do not decode: INVALID_ARGUMENT and one rate-limited log line.

Left to itself, gRPC's Python server logs a full traceback for every request message its
deserializer rejects and answers INTERNAL ("Exception deserializing request!"), so a client
sending garbage (a version mismatch, a scanner, a fuzzer) floods the log and looks like a
server bug. :class:`MalformedRequestInterceptor` wraps the deserializer of every method of
every service (DataService, health, reflection) so that undecodable bytes become a
:class:`Malformed` value instead of an exception, and the method's behavior answers it with
INVALID_ARGUMENT naming the message type, after one :class:`~.ratelimit.RateLimitedLog` line
per method and interval that names the peer and the problem.

For a streaming request the check happens as the servicer reads the message: the abort
raises out of its ``next(requests)``, as a broken client stream would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from .ratelimit import RateLimitedLog

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Malformed:
    """What the tolerant deserializer returns for bytes that do not decode."""

    type_name: str  # the message type expected, e.g. zephon.v1.CheckpointRequest
    size: int  # bytes received
    problem: str  # the decoder's complaint


def _type_name(deserializer: Callable[[bytes], Any]) -> str:
    owner = getattr(deserializer, "__self__", None)  # Message.FromString is a classmethod
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "the request message"))


def tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserializer``, returning :class:`Malformed` instead of raising."""
    type_name = _type_name(deserializer)

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # any decoder failure is the client's bytes
            return Malformed(type_name, len(data), str(exc) or type(exc).__name__)

    return parse


class MalformedRequestInterceptor(grpc.ServerInterceptor):
    """Wraps every method handler so undecodable requests get INVALID_ARGUMENT (module doc)."""

    def __init__(self, reports: RateLimitedLog | None = None) -> None:
        self.reports = reports or RateLimitedLog(log)

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return self._wrap(handler, handler_call_details.method)

    def reject(self, context: grpc.ServicerContext, method: str, bad: Malformed) -> None:
        """Log (rate-limited) and abort with INVALID_ARGUMENT (raises)."""
        self.reports.warning(
            f"malformed {method}",
            "malformed request to %s from %s: %d bytes do not decode as %s (%s)",
            method,
            context.peer(),
            bad.size,
            bad.type_name,
            bad.problem,
        )
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request does not decode as {bad.type_name} ({bad.size} bytes: {bad.problem}); "
            "send messages built from the server's proto (zephon_proto, data_service.proto)",
        )

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        parse = tolerant(handler.request_deserializer)
        serialize = handler.response_serializer
        if handler.request_streaming:
            inner = handler.stream_stream or handler.stream_unary

            def streaming(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                return inner(self._checked(requests, context, method), context)

            make = (
                grpc.stream_stream_rpc_method_handler
                if handler.response_streaming
                else grpc.stream_unary_rpc_method_handler
            )
            return make(streaming, request_deserializer=parse, response_serializer=serialize)
        inner = handler.unary_stream or handler.unary_unary

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, Malformed):
                self.reject(context, method, request)
            return inner(request, context)

        make = (
            grpc.unary_stream_rpc_method_handler
            if handler.response_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        return make(unary, request_deserializer=parse, response_serializer=serialize)

    def _checked(
        self, requests: Iterator[Any], context: grpc.ServicerContext, method: str
    ) -> Iterator[Any]:
        for request in requests:
            if isinstance(request, Malformed):
                self.reject(context, method, request)
            yield request
