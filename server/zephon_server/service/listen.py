"""Checks before the server listens: the TLS files and the address, each failure named.

gRPC reports every bind failure, and a TLS key that does not match its certificate, as
``RuntimeError: Failed to bind to address``, which points the wrong way. So the server checks
first, and fails with what is wrong and the fix: a missing, unreadable or non-PEM TLS file, an
encrypted key, a key of another certificate (Python's ``ssl`` loads the pair the way gRPC
will), a host name that does not resolve or is not this machine's, a port in use or
privileged.
"""

from __future__ import annotations

import errno
import re
import socket
import ssl

from ..engine.errors import ZephonError
from ..engine.user_files import read_user_file

_CERT = b"-----BEGIN CERTIFICATE-----"
_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----")
_ENCRYPTED = re.compile(rb"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: *4, *ENCRYPTED")


def _read(flag: str, path: str) -> bytes:
    return read_user_file(flag, path, "a PEM file")


def _no_password() -> str:
    raise ZephonError("encrypted key")  # never reached: encrypted keys are refused before


def check_tls_files(
    cert_path: str, key_path: str, ca_path: str | None
) -> tuple[bytes, bytes, bytes | None]:
    """``(key, cert, ca)`` PEM bytes after checking each file and that the key belongs to
    the certificate; :class:`ZephonError` naming the flag, the file and the fix otherwise."""
    cert = _read("--tls-cert", cert_path)
    key = _read("--tls-key", key_path)
    ca = _read("--tls-client-ca", ca_path) if ca_path else None
    if _CERT not in cert:
        raise ZephonError(
            f"--tls-cert {cert_path!r} is not a PEM certificate (no '-----BEGIN CERTIFICATE-----' "
            "line); convert a DER one with: openssl x509 -inform der -in CERT -out cert.pem"
        )
    if not _KEY.search(key):
        raise ZephonError(
            f"--tls-key {key_path!r} is not a PEM private key (no '-----BEGIN ... PRIVATE "
            "KEY-----' line); convert a DER one with: openssl pkey -inform der -in KEY -out "
            "key.pem"
        )
    if _ENCRYPTED.search(key):
        raise ZephonError(
            f"--tls-key {key_path!r} is encrypted; the server needs an unencrypted key "
            "(openssl pkey -in KEY -out key.pem, then restrict who can read it)"
        )
    if ca is not None and _CERT not in ca:
        raise ZephonError(
            f"--tls-client-ca {ca_path!r} is not a PEM certificate bundle (no '-----BEGIN "
            "CERTIFICATE-----' line)"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_path, key_path, password=_no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ZephonError(
                f"the TLS key does not match the certificate (--tls-key {key_path}, --tls-cert "
                f"{cert_path}); give the key the certificate was issued for"
            ) from None
        raise ZephonError(
            f"cannot load the TLS certificate and key (--tls-cert {cert_path}, --tls-key "
            f"{key_path}): {exc.reason or exc}; check that both are intact PEM files"
        ) from None
    if ca is not None:
        try:
            context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except ssl.SSLError as exc:
            raise ZephonError(
                f"--tls-client-ca {ca_path!r}: cannot load the certificates "
                f"({exc.reason or exc}); check that it is an intact PEM bundle"
            ) from None
    return key, cert, ca


def listen_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (a message naming the fix), or None.

    Resolves the host and binds a probe socket to each of its addresses (as gRPC does, with
    ``SO_REUSEADDR``); one that binds is enough, as for gRPC.
    """
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(
            name or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        return (
            f"cannot resolve host {host!r} ({exc.strerror}); --host takes a name or address "
            "of this machine, e.g. 127.0.0.1, or 0.0.0.0 for every interface"
        )
    if port == 0:
        return None
    errors: list[OSError] = []
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                errors.append(exc)
                continue
            return None
    codes = {exc.errno for exc in errors}
    if errno.EADDRINUSE in codes:
        return (
            "address already in use (stop the other process or pick another --port; --port 0 "
            "picks a free one)"
        )
    if errno.EACCES in codes:
        return (
            f"permission denied: port {port} is privileged (below 1024); pick --port 1024 or "
            "above, or grant CAP_NET_BIND_SERVICE"
        )
    if errno.EADDRNOTAVAIL in codes:
        return (
            f"{host!r} is not an address of this machine; use one of its addresses, or "
            "0.0.0.0 for every interface"
        )
    return f"cannot bind it: {errors[0].strerror}" if errors else None
