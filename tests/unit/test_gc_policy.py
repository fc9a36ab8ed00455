"""The garbage-collector policy of Zephon's own processes (server/zephon_server/gc_policy.py): the
hermetic tests.

The tests of the same topic that need a subprocess, worker processes, a socket or the wall clock are
in ``tests/service/test_gc_policy.py``.
"""

from __future__ import annotations

import pytest

from zephon_server.runtime import gc_policy


def test_an_unknown_policy_names_the_choices():
    with pytest.raises(gc_policy.GcPolicyError, match="choose one of: tuned, default"):
        gc_policy.check("aggressive")
    with pytest.raises(gc_policy.GcPolicyError, match="ZEPHON_GC"):
        gc_policy.apply("off")
