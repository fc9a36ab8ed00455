"""Container health probe: exit 0 only when the local Zephon server's gRPC health is SERVING.

Calls ``grpc.health.v1.Health/Check`` for the overall service (``""``) with a 3 s deadline and
prints one line (Docker keeps it in ``docker inspect``'s health log). Environment:

* ``ZEPHON_HEALTH_HOST`` (default ``127.0.0.1``) and ``ZEPHON_PORT`` (default ``50051``):
  where the server listens.
* ``ZEPHON_TLS_CA``: PEM bundle that signed the server's certificate; setting it (or a client
  certificate) switches the probe to TLS. ``ZEPHON_TLS_SERVER_NAME`` overrides the name checked
  against the certificate (the probe dials localhost, the certificate rarely names it).
* ``ZEPHON_TLS_CLIENT_CERT`` and ``ZEPHON_TLS_CLIENT_KEY``: the probe's own certificate when the
  server requires client certificates (``--tls-client-ca``).
* ``ZEPHON_AUTH_TOKEN``: sent as ``authorization: Bearer <token>`` metadata.
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 3.0


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _channel(target: str) -> grpc.Channel:
    ca = os.environ.get("ZEPHON_TLS_CA")
    cert = os.environ.get("ZEPHON_TLS_CLIENT_CERT")
    key = os.environ.get("ZEPHON_TLS_CLIENT_KEY")
    if not (ca or cert):
        return grpc.insecure_channel(target)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca), private_key=_read(key), certificate_chain=_read(cert)
    )
    options = []
    if name := os.environ.get("ZEPHON_TLS_SERVER_NAME"):
        options.append(("grpc.ssl_target_name_override", name))
    return grpc.secure_channel(target, credentials, options=options)


def main() -> int:
    """Probe once; 0 when SERVING, 1 otherwise."""
    host = os.environ.get("ZEPHON_HEALTH_HOST", "127.0.0.1")
    target = f"{host}:{os.environ.get('ZEPHON_PORT', '50051')}"
    metadata = []
    if token := os.environ.get("ZEPHON_AUTH_TOKEN"):
        metadata.append(("authorization", f"Bearer {token}"))
    try:
        with _channel(target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S, metadata=metadata
            )
    except grpc.RpcError as err:
        print(f"unhealthy: {target}: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"unhealthy: cannot read TLS files: {err}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"unhealthy: {target}: {status}", file=sys.stderr)
        return 1
    print(f"healthy: {target}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
