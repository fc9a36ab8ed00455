"""The checked-in generated code matches ``proto/`` and the binding schema does not move: the tests
that need a subprocess, worker processes, a socket or the wall clock.

The hermetic tests of the same topic are in ``tests/unit/test_proto.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.test_proto import GEN_SCRIPT, ROOT

CHECKED_IN = ROOT / "client"


PACKAGE = CHECKED_IN / "zephon_proto"


@pytest.mark.timeout(120)
def test_generated_code_matches_the_proto(tmp_path):
    """Regenerate with the same command as ``make proto`` and compare byte for byte."""
    out = subprocess.run(
        [sys.executable, str(GEN_SCRIPT), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, f"tools/gen_proto.py failed:\n{out.stderr}"
    fresh = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert fresh, "the generator wrote nothing"
    checked_in = sorted(
        str(p.relative_to(CHECKED_IN))
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert checked_in == fresh, (
        f"client/zephon_proto holds {checked_in} but the generator writes {fresh}: "
        "run `make proto` (and delete stale files)"
    )
    drifted = [
        rel for rel in fresh if (tmp_path / rel).read_bytes() != (CHECKED_IN / rel).read_bytes()
    ]
    assert not drifted, (
        f"generated code is out of date with proto/ ({', '.join(drifted)}): run `make proto`"
    )


def test_generated_code_imports_without_path_tricks(tmp_path):
    """Importable from anywhere through the installed package, with no PYTHONPATH help."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (
        "import zephon_proto.v1.data_service_pb2_grpc as g\n"
        "assert g.DataServiceStub and g.DataServiceServicer\n"
        "assert g.add_DataServiceServicer_to_server\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    grpc_module = (PACKAGE / "v1" / "data_service_pb2_grpc.py").read_text()
    assert "from zephon_proto.v1 import data_service_pb2 " in grpc_module
    assert "sys.path" not in grpc_module
