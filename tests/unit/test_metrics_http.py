"""``/metrics`` security: loopback by default, bearer/basic auth, TLS and mutual TLS, bounds: the
hermetic tests.

The tests of the same topic that need a subprocess, worker processes, a socket or the wall clock are
in ``tests/service/test_metrics_http.py``.
"""

from __future__ import annotations

import argparse
import base64

import pytest

from zephon_server.engine.errors import ZephonError
from zephon_server.serve_flags import metrics_config
from zephon_server.service.metrics_http import (
    Authenticator,
    MetricsHTTPConfig,
)
from zephon_testing.scenarios.metrics_http import (
    basic,
)

pytestmark = pytest.mark.timeout(120)


def test_the_authenticator_compares_every_credential():
    auth = Authenticator("tok", [("a", "1"), ("b", "2:3")])
    assert auth.allows("Bearer tok") and auth.allows("bearer  tok ")
    assert auth.allows(basic("a", "1")["Authorization"])
    assert auth.allows(basic("b", "2:3")["Authorization"])
    for header in (None, "", "Bearer", "Bearer to", "Basic", "Basic ???", "tok", "Digest tok"):
        assert not auth.allows(header), header
    assert not auth.allows(basic("a", "2:3")["Authorization"])
    assert not auth.allows("Basic " + base64.b64encode(b"a1").decode())
    assert Authenticator(None, []).allows(None)
    assert not Authenticator(None, [("a", "1")]).allows("Bearer tok")


def namespace(**kwargs) -> argparse.Namespace:
    base = dict(
        metrics_port=9400,
        metrics_host="127.0.0.1",
        metrics_tls="auto",
        metrics_auth_token=None,
        metrics_basic_auth_file=None,
        tls_cert=None,
        tls_key=None,
        tls_client_ca=None,
    )
    return argparse.Namespace(**{**base, **kwargs})


def test_config_from_flags_and_environment(tmp_path):
    assert metrics_config(namespace(metrics_port=None), {}) is None
    plain = metrics_config(namespace(), {})
    assert plain is not None and not plain.tls and plain.schemes == [] and plain.loopback
    env = metrics_config(namespace(), {"ZEPHON_METRICS_TOKEN": "env-secret"})
    assert env is not None and env.token == "env-secret" and "env-secret" not in repr(env)
    flag = metrics_config(namespace(metrics_auth_token="f"), {"ZEPHON_METRICS_TOKEN": "e"})
    assert flag is not None and flag.token == "f"
    tls = namespace(tls_cert="c.pem", tls_key="k.pem", tls_client_ca="ca.pem")
    auto = metrics_config(tls, {})
    assert auto is not None and auto.tls and auto.client_cafile == "ca.pem"
    off = metrics_config(namespace(**{**vars(tls), "metrics_tls": "off"}), {})
    assert off is not None and not off.tls and off.client_cafile is None
    wide = metrics_config(namespace(metrics_host="0.0.0.0"), {})
    assert wide is not None and not wide.loopback
    with pytest.raises(ZephonError, match="--metrics-tls on needs --tls-cert and --tls-key"):
        metrics_config(namespace(metrics_tls="on"), {})
    with pytest.raises(ZephonError, match="--metrics-host needs --metrics-port"):
        metrics_config(namespace(metrics_port=None, metrics_host="0.0.0.0"), {})
    empty = tmp_path / "empty"
    empty.write_text("# nobody\n")
    with pytest.raises(ZephonError, match="no 'user:password' line"):
        metrics_config(namespace(metrics_basic_auth_file=str(empty)), {})
    twice = tmp_path / "twice"
    twice.write_text("a:1\na:2\n")
    with pytest.raises(ZephonError, match="line 2: user 'a' appears twice"):
        metrics_config(namespace(metrics_basic_auth_file=str(twice)), {})
    with pytest.raises(ZephonError, match="cannot read it"):
        metrics_config(namespace(metrics_basic_auth_file=str(tmp_path / "missing")), {})
    with pytest.raises(ValueError, match="port must be between 0 and 65535, got 70000"):
        MetricsHTTPConfig(host="127.0.0.1", port=70000)
