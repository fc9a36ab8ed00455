"""Why a connection fails: gRPC's details read into a cause and its fix (the TLS probe,
which needs sockets, is tested in ``tests/reliability/test_security.py``)."""

from __future__ import annotations

import pytest

from zephon_client import TLSConfig
from zephon_client.connect_hint import diagnose

TLS = TLSConfig(root_certificates=b"-----BEGIN CERTIFICATE-----\n")
# Details as grpcio 1.7x/1.8x reports them (captured from real handshakes).
UNTRUSTED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls handshake "
    "failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
    "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK"
)
WRONG_NAME = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Custom "
    "verification check failed with error: UNAUTHENTICATED: Hostname Verification Check failed."
)
PLAINTEXT_SERVER = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls handshake "
    "failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:"
    "OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate verification context: OK"
)
REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to "
    "connect to remote host: Connection refused"
)


@pytest.mark.parametrize(
    ("tls", "details", "says", "permanent"),
    [
        (TLS, UNTRUSTED, "not signed by a CA this client trusts", True),
        (TLS, WRONG_NAME, "not issued for the name '127.0.0.1'", True),
        (TLS, PLAINTEXT_SERVER, "does not speak TLS", True),
        (None, REFUSED, "nothing listens at 127.0.0.1:1", False),
    ],
)
def test_details_name_the_cause_and_whether_waiting_helps(tls, details, says, permanent):
    found = diagnose("127.0.0.1:1", tls, details)
    assert found is not None and says in found.hint and found.permanent is permanent


def test_unknown_details_and_a_plaintext_client_at_a_plaintext_server_say_nothing():
    assert diagnose("127.0.0.1:1", None, "DNS resolution failed for nowhere:1") is None
    # WRONG_VERSION_NUMBER only means "plaintext server" for a TLS client.
    assert diagnose("127.0.0.1:1", None, PLAINTEXT_SERVER) is None
