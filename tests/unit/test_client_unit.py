"""DataClient unit tests against a fake DataService served by a real ``grpc.server``: the hermetic
tests.

The tests of the same topic that need a subprocess, worker processes, a socket or the wall clock are
in ``tests/service/test_client_unit.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from zephon_client.options import consumer_name
from zephon_client.stream import (
    CORE_INTERNAL_DETAILS,
    _Item,
    _retryable,
)
from zephon_client.tail import byte_decode

pytestmark = pytest.mark.timeout(20)


class _Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "received", "retry"),
    [
        (grpc.StatusCode.UNAVAILABLE, "Connection reset by peer", 0, True),
        # grpc.aio's status when the client core failed to write on a broken connection
        (grpc.StatusCode.INTERNAL, CORE_INTERNAL_DETAILS, 0, True),
        # the server's own INTERNAL before any batch is final: reopening would fail again
        (grpc.StatusCode.INTERNAL, "pipeline failed: worker 1 died", 0, False),
        (grpc.StatusCode.INTERNAL, "RST_STREAM with error code 2", 3, True),
        (grpc.StatusCode.CANCELLED, "Cancelled", 0, False),
        (grpc.StatusCode.OUT_OF_RANGE, "seq 0 is no longer reachable", 5, False),
    ],
)
def test_which_failed_calls_are_reopened(code, details, received, retry):
    item = _Item("error", error=_Status(code, details))
    assert _retryable(item, SimpleNamespace(received=received)) is retry


def test_byte_decode_marks_special_ids():
    assert byte_decode([104, 105, 256, 0xC3, 0xA9, 257]) == "hi<256>é<257>"


def test_torch_module_imports_without_torch():
    import importlib

    module = importlib.import_module("zephon_client.torch")
    assert callable(module.to_torch)


@pytest.mark.parametrize(
    ("name", "says"),
    [("r" * 129, "129 bytes of UTF-8; the limit is 128"), ("rank\n0", "control character")],
)
def test_a_consumer_name_the_server_would_refuse_fails_at_construction(name, says):
    from zephon_client import DataClient

    # Checked before any connection: the address is never dialled.
    with pytest.raises(ValueError, match=says):
        DataClient("127.0.0.1:1", consumer=name)
    assert consumer_name("rank3") == "rank3" and consumer_name("é" * 64) == "é" * 64
