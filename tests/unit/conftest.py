"""The unit tier's rule, enforced around every test here: see ``tests/support/hermetic.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.hermetic import HermeticGuard


@pytest.fixture(autouse=True)
def hermetic(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HermeticGuard]:
    """No sockets, no subprocesses or child processes, no sleeps during a unit test."""
    guard = HermeticGuard(request.node.nodeid)
    guard.install(monkeypatch)
    yield guard
    guard.check()
