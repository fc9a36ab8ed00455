"""Why a connection to a Zephon server fails, and whether waiting could ever fix it.

gRPC reports every failed connection as ``UNAVAILABLE``, which the client retries for
``reconnect_timeout`` (a server restarting, a port not yet listening). Some causes are not
transient: a plaintext client at a TLS server, a TLS client at a plaintext server, a
certificate the client does not trust or one issued for another name, a server that
requires a client certificate. Retrying those only delays the error by a minute and then
shows gRPC's words ("Socket closed"). :func:`diagnose` reads the status details and, when
they are ambiguous ("Socket closed"), makes one TLS handshake of its own to the address to
tell which it is; it returns the fix to name and whether the failure is permanent.
"""

from __future__ import annotations

import re
import socket
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 2.0
"""Seconds the TLS probe of :func:`diagnose` waits to connect and for the server's first bytes."""

_PLAINTEXT_SERVER = re.compile(r"WRONG_VERSION_NUMBER|HTTP_REQUEST|UNKNOWN_PROTOCOL")
_UNTRUSTED = re.compile(r"CERTIFICATE_VERIFY_FAILED|unable to get local issuer|self.signed")
_WRONG_NAME = re.compile(r"Hostname Verification|Peer name .* is not in peer certificate")
_CLOSED = re.compile(r"Socket closed")  # (a reset mid-call is a network blip: not probed)
_REFUSED = re.compile(r"Connection refused")


@dataclass(frozen=True)
class Diagnosis:
    """What to tell the user: ``hint`` names the cause and the fix; ``permanent`` failures
    are not retried (waiting cannot fix a configuration)."""

    hint: str
    permanent: bool


def diagnose(address: str, tls: Any, details: str) -> Diagnosis | None:
    """The cause of an ``UNAVAILABLE`` with ``details`` on a channel to ``address`` (``tls``:
    the client's :class:`~zephon_client.TLSConfig` or ``None``); ``None`` when unknown."""
    if tls is not None and _PLAINTEXT_SERVER.search(details):
        return Diagnosis(
            f"the server at {address} does not speak TLS: connect without tls (zephon tail: "
            "drop the --tls-* flags), or start the server with --tls-cert and --tls-key",
            permanent=True,
        )
    if _UNTRUSTED.search(details):
        return Diagnosis(
            f"the certificate of the server at {address} is not signed by a CA this client "
            "trusts: pass the CA certificate that signed it, TLSConfig(root_certificates=PEM) "
            "(zephon tail: --tls-ca PEM)",
            permanent=True,
        )
    if _WRONG_NAME.search(details):
        host = address.rsplit(":", 1)[0]
        return Diagnosis(
            f"the certificate of the server at {address} is not issued for the name {host!r}: "
            "connect with a host name the certificate lists, or check it against that name "
            "with TLSConfig(server_name_override=NAME) (zephon tail: --tls-server-name NAME)",
            permanent=True,
        )
    if _CLOSED.search(details):
        return _after_closed(address, tls)
    if _REFUSED.search(details):
        return Diagnosis(
            f"nothing listens at {address}: is the server running, with this port?",
            permanent=False,
        )
    return None


def _after_closed(address: str, tls: Any) -> Diagnosis | None:
    """The server closed the connection: ask it with a TLS handshake of our own whether it
    speaks TLS and whether it requires a client certificate."""
    answer = probe_tls(address)
    if answer is None or (answer == "tls" and tls is not None):
        return None
    if answer == "tls":
        return Diagnosis(
            f"the server at {address} speaks TLS and this client connects in plaintext: pass "
            "tls=TLSConfig(root_certificates=CA_PEM) (zephon tail: --tls-ca CA_PEM)",
            permanent=True,
        )
    if answer == "client certificate required" and tls is None:
        return Diagnosis(
            f"the server at {address} speaks TLS and this client connects in plaintext; it "
            "also requires a client certificate (mutual TLS): pass tls=TLSConfig("
            "root_certificates=CA_PEM, certificate_chain=PEM, private_key=PEM) (zephon tail: "
            "--tls-ca, --tls-cert, --tls-key)",
            permanent=True,
        )
    if answer == "client certificate required":
        if getattr(tls, "certificate_chain", None) is None:
            return Diagnosis(
                f"the server at {address} requires a client certificate (mutual TLS): pass "
                "TLSConfig(certificate_chain=PEM, private_key=PEM) with a certificate signed "
                "by the CA the server trusts (zephon tail: --tls-cert, --tls-key)",
                permanent=True,
            )
        # The client has one: ask again presenting it. Accepted, the failure was something
        # else (a blip): retried as before.
        if probe_tls(address, certificate=_pem_pair(tls)) == "client certificate required":
            return Diagnosis(
                f"the server at {address} does not accept this client's certificate (mutual "
                "TLS): use a certificate signed by the CA given to the server as "
                "--tls-client-ca",
                permanent=True,
            )
    return None


def _pem_pair(tls: Any) -> tuple[bytes, bytes] | None:
    """The client certificate chain and key of ``tls`` as PEM bytes (None if unreadable)."""
    try:
        return tuple(  # type: ignore[return-value]
            v if isinstance(v, bytes) else Path(v).read_bytes()
            for v in (tls.certificate_chain, tls.private_key)
        )
    except OSError:
        return None


def probe_tls(
    address: str,
    timeout: float = PROBE_TIMEOUT_S,
    certificate: tuple[bytes, bytes] | None = None,
) -> str | None:
    """``"tls"`` when ``address`` completes a TLS handshake and starts HTTP/2,
    ``"client certificate required"`` when it completes the handshake and then closes (a
    mutual-TLS server given no certificate, or one it does not accept: ``certificate`` is the
    PEM chain and key to present), ``"plaintext"`` when it does not speak TLS, and ``None``
    when it cannot be reached or answers otherwise. Nothing is sent but the handshake, and no
    server certificate is checked: only the protocol is asked."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if certificate is not None and not _load_certificate(context, certificate):
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
            raw.settimeout(timeout)
            try:
                conn = context.wrap_socket(raw, server_hostname=host.strip("[]") or None)
            except ssl.SSLError:
                return "plaintext"
            with conn:
                try:
                    first = conn.recv(1)
                except ssl.SSLError as exc:
                    return "client certificate required" if "CERTIFICATE" in str(exc) else None
                return "tls" if first else "client certificate required"
    except (OSError, ValueError):
        return None


def diagnose_error(address: str, tls: Any, error: Any) -> Diagnosis | None:
    """:func:`diagnose` for a failed call's ``grpc.RpcError`` (``None`` unless UNAVAILABLE)."""
    import grpc

    code = error.code() if callable(getattr(error, "code", None)) else None
    if code != grpc.StatusCode.UNAVAILABLE:
        return None
    details = error.details() if callable(getattr(error, "details", None)) else None
    return diagnose(address, tls, details or str(error))


def _load_certificate(context: ssl.SSLContext, certificate: tuple[bytes, bytes]) -> bool:
    """Load the PEM ``certificate`` (chain, key) into ``context`` (``ssl`` reads files only:
    a private temporary directory holds them for the call)."""
    with tempfile.TemporaryDirectory(prefix="zephon-probe-") as directory:
        chain, key = Path(directory, "chain.pem"), Path(directory, "key.pem")
        for path, data in ((chain, certificate[0]), (key, certificate[1])):
            path.touch(mode=0o600)
            path.write_bytes(data)
        try:
            context.load_cert_chain(chain, key)
        except (ssl.SSLError, OSError, ValueError):
            return False
    return True
