"""The scenarios of ``tests/reliability/test_security.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc

from zephon_client import TLSConfig
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_testing.servers import ServerProcess

TOKEN = "s3cr3t-token-for-tests"


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(subject: str, key, issuer=None, issuer_key=None, *, ca: bool = False, server=False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer is not None else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key if issuer_key is not None else key, hashes.SHA256())


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate (SAN localhost, 127.0.0.1) and a client certificate signed
    by it, plus a second, untrusted CA with its own client certificate. Returns PEM paths."""
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}

    def write(name: str, data: bytes) -> None:
        out[name] = directory / f"{name}.pem"
        out[name].write_bytes(data)

    for prefix in ("", "rogue_"):
        ca_key = _key()
        ca = _cert(f"{prefix}zephon test CA", ca_key, ca=True)
        write(f"{prefix}ca", ca.public_bytes(serialization.Encoding.PEM))
        client_key = _key()
        client = _cert(f"{prefix}trainer", client_key, ca, ca_key)
        write(f"{prefix}client_cert", client.public_bytes(serialization.Encoding.PEM))
        write(f"{prefix}client_key", _pem_key(client_key))
        if not prefix:
            server_key = _key()
            server = _cert("zephon server", server_key, ca, ca_key, server=True)
            write("server_cert", server.public_bytes(serialization.Encoding.PEM))
            write("server_key", _pem_key(server_key))
    return out


def tls_server(config: Path, work: Path, pki: dict[str, Path], *, mutual: bool, env=None):
    args = ["--config", str(config), "--tls-cert", str(pki["server_cert"])]
    args += ["--tls-key", str(pki["server_key"])]
    if mutual:
        args += ["--tls-client-ca", str(pki["ca"])]
    # The helper's readiness is the port file; the gRPC port itself only speaks TLS.
    return ServerProcess(args, work, env)


def outcome(address: str, tls: TLSConfig | None, token: str | None) -> str:
    """What a client gets from GetInfo and a StreamBatches call: 'ok' or the status name."""
    from zephon_client.channel import make_channel

    channel = make_channel(address, tls=tls)
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
    stub = pb_grpc.DataServiceStub(channel)
    try:
        stub.GetInfo(pb.GetInfoRequest(), timeout=5, metadata=metadata)
        call = stub.StreamBatches(
            iter([pb.StreamBatchesRequest(open=pb.OpenLane(lane=0, consumer="probe"))]),
            timeout=5,
            metadata=metadata,
        )
        first = next(iter(call))
        call.cancel()
        return "ok" if first.WhichOneof("kind") == "batch" else "no batch"
    except grpc.RpcError as err:
        assert "Traceback" not in (err.details() or "")
        return err.code().name
    finally:
        channel.close()


def health(address: str, tls: TLSConfig | None) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from zephon_client.channel import make_channel

    channel = make_channel(address, tls=tls)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError as err:
        return err.code().name
    finally:
        channel.close()


def trusted(pki, *, cert: bool = False) -> TLSConfig:
    return TLSConfig(
        root_certificates=pki["ca"],
        certificate_chain=pki["client_cert"] if cert else None,
        private_key=pki["client_key"] if cert else None,
    )


def run_security_matrix(config: Path, work: Path, pki: dict[str, Path]) -> dict[str, str]:
    """Every (server setup, client) pair → outcome; see the tests for the expected values."""
    rogue_ca = TLSConfig(root_certificates=pki["rogue_ca"])
    rogue_cert = TLSConfig(
        root_certificates=pki["ca"],
        certificate_chain=pki["rogue_client_cert"],
        private_key=pki["rogue_client_key"],
    )
    wrong_name = TLSConfig(root_certificates=pki["ca"], server_name_override="elsewhere.example")
    results: dict[str, str] = {}
    srv = tls_server(config, work, pki, mutual=False)
    try:
        a = srv.address
        results["tls: trusted client"] = outcome(a, trusted(pki), None)
        results["tls: plaintext client"] = outcome(a, None, None)
        results["tls: client trusting another CA"] = outcome(a, rogue_ca, None)
        results["tls: wrong server name"] = outcome(a, wrong_name, None)
        results["tls: localhost name"] = outcome(f"localhost:{srv.port}", trusted(pki), None)
    finally:
        assert srv.terminate() == 0
    srv = tls_server(config, work, pki, mutual=True)
    try:
        a = srv.address
        results["mtls: client certificate"] = outcome(a, trusted(pki, cert=True), None)
        results["mtls: no client certificate"] = outcome(a, trusted(pki), None)
        results["mtls: untrusted client certificate"] = outcome(a, rogue_cert, None)
        results["mtls: plaintext client"] = outcome(a, None, None)
        results["mtls: health with client certificate"] = health(a, trusted(pki, cert=True))
    finally:
        assert srv.terminate() == 0
    srv = ServerProcess(["--config", str(config), "--auth-token", TOKEN], work)
    try:
        a = srv.address
        results["token: right token"] = outcome(a, None, TOKEN)
        results["token: missing"] = outcome(a, None, None)
        results["token: wrong"] = outcome(a, None, "not-the-token")
        results["token: empty"] = outcome(a, None, "")
        results["token: health without token"] = health(a, None)
    finally:
        assert srv.terminate() == 0
    # Both at once, the token from the environment (no flag).
    srv = tls_server(config, work, pki, mutual=True, env={"ZEPHON_AUTH_TOKEN": TOKEN})
    try:
        a = srv.address
        results["mtls+env token: right token"] = outcome(a, trusted(pki, cert=True), TOKEN)
        results["mtls+env token: wrong token"] = outcome(a, trusted(pki, cert=True), "nope")
        results["mtls+env token: health without token"] = health(a, trusted(pki, cert=True))
    finally:
        assert srv.terminate() == 0
    return results


EXPECTED = {
    "tls: trusted client": "ok",
    "tls: plaintext client": "UNAVAILABLE",
    "tls: client trusting another CA": "UNAVAILABLE",
    "tls: wrong server name": "UNAVAILABLE",
    "tls: localhost name": "ok",
    "mtls: client certificate": "ok",
    "mtls: no client certificate": "UNAVAILABLE",
    "mtls: untrusted client certificate": "UNAVAILABLE",
    "mtls: plaintext client": "UNAVAILABLE",
    "mtls: health with client certificate": "SERVING",
    "token: right token": "ok",
    "token: missing": "UNAUTHENTICATED",
    "token: wrong": "UNAUTHENTICATED",
    "token: empty": "UNAUTHENTICATED",
    "token: health without token": "SERVING",
    "mtls+env token: right token": "ok",
    "mtls+env token: wrong token": "UNAUTHENTICATED",
    "mtls+env token: health without token": "SERVING",
}
