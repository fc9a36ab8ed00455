"""Channels to Zephon servers: keepalive options, TLS / mutual TLS, bearer tokens, endpoints."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

from . import io_loop

logger = logging.getLogger(__name__)

AUTH_TOKEN_ENV = "ZEPHON_AUTH_TOKEN"
"""Environment variable holding the bearer token when ``auth_token`` is not given."""

DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    # Detect a dead peer on an idle or stalled connection.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # grpcio 1.85 times keepalive pings out after this (default 60 s): without it a dead peer
    # is found after ~70 s, whatever keepalive_timeout_ms says.
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect the channel quickly after a server restart (our own backoff paces retries).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # Batches of long sequences easily exceed the 4 MiB default.
    ("grpc.max_receive_message_length", 1 << 30),
)
"""Channel options used unless ``channel_options`` is given (keepalive, fast reconnect, 1 GiB
messages). A server must allow pings every 10 s (``grpc.keepalive_permit_without_calls=1``,
``grpc.http2.min_ping_interval_without_data_ms <= 10000``) or it answers with GOAWAY."""


@dataclass(frozen=True)
class TLSConfig:
    """TLS (and mutual TLS) settings of the client's channels.

    Each certificate/key is PEM: ``bytes`` are the PEM contents, a ``str``/``Path`` a file to
    read. ``root_certificates`` ``None`` uses the system roots; ``certificate_chain`` and
    ``private_key`` (both or neither) present a client certificate for mTLS;
    ``server_name_override`` checks the server's certificate against that name instead of the
    address's host (for tests and IP addresses).
    """

    root_certificates: bytes | str | Path | None = None
    certificate_chain: bytes | str | Path | None = None
    private_key: bytes | str | Path | None = None
    server_name_override: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The ``grpc.ssl_channel_credentials`` these settings describe."""
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("TLSConfig: certificate_chain and private_key go together (mTLS)")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.root_certificates),
            private_key=_pem(self.private_key),
            certificate_chain=_pem(self.certificate_chain),
        )

    def options(self) -> list[tuple[str, Any]]:
        """Channel options the settings need (the target name override)."""
        if self.server_name_override:
            return [("grpc.ssl_target_name_override", self.server_name_override)]
        return []


def make_channel(
    address: str,
    *,
    tls: TLSConfig | None = None,
    options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
) -> grpc.Channel:
    """A channel to ``address`` (``host:port``): insecure, or TLS/mTLS with ``tls``."""
    opts = list(options)
    if tls is None:
        return grpc.insecure_channel(address, options=opts)
    return grpc.secure_channel(address, tls.credentials(), options=opts + tls.options())


def make_aio_channel(
    address: str,
    *,
    tls: TLSConfig | None = None,
    options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
) -> grpc.aio.Channel:
    """The ``grpc.aio`` twin of :func:`make_channel`, made and used on the client's I/O loop."""

    def make() -> grpc.aio.Channel:
        opts = list(options)
        if tls is None:
            return grpc.aio.insecure_channel(address, options=opts)
        return grpc.aio.secure_channel(address, tls.credentials(), options=opts + tls.options())

    return io_loop.run(make)


def close_aio_channel(channel: grpc.aio.Channel, timeout: float = 1.0) -> None:
    """Close an aio channel (cancelling its calls), waiting up to ``timeout`` seconds."""
    try:
        io_loop.run(lambda: channel.close(), timeout)
    except Exception:  # closing is best effort: the calls are cancelled either way
        logger.debug("closing a stream channel failed", exc_info=True)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` (``authorization: Bearer <token>``); empty without one.

    ``None`` reads the ``ZEPHON_AUTH_TOKEN`` environment variable.
    """
    if token is None:
        token = os.environ.get(AUTH_TOKEN_ENV) or None
    return (("authorization", f"Bearer {token}"),) if token else ()


def _pem(value: bytes | str | Path | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


class Endpoint:
    """One server of a :class:`~zephon_client.DataClient`: its address, channels, stubs and
    GetInfo answer.

    Unary calls use a synchronous channel; ``StreamBatches`` calls run on the client's I/O
    loop over a ``grpc.aio`` channel made on first use (:meth:`stream_stub`).
    """

    def __init__(
        self, address: str, *, tls: TLSConfig | None, options: Sequence[tuple[str, Any]]
    ) -> None:
        self.address = address
        self.tls = tls
        self._options = tuple(options)
        self.channel = make_channel(address, tls=tls, options=options)
        self.stub = pb_grpc.DataServiceStub(self.channel)
        self._aio_channel: Any = None
        self._stream_stub: pb_grpc.DataServiceStub | None = None
        self.info = pb.GetInfoResponse()

    def stream_stub(self) -> pb_grpc.DataServiceStub:
        """The ``grpc.aio`` stub for streams (its channel is made on the first call)."""
        if self._stream_stub is None:
            self._aio_channel = make_aio_channel(self.address, tls=self.tls, options=self._options)
            self._stream_stub = pb_grpc.DataServiceStub(self._aio_channel)
        return self._stream_stub

    def close(self) -> None:
        self.channel.close()
        if self._aio_channel is not None:
            close_aio_channel(self._aio_channel)

    def serves(self, lane: int) -> bool:
        return not self.info.served_lanes or lane in self.info.served_lanes
