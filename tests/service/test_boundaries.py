"""Layer boundaries: the tests that need a subprocess (a fresh interpreter importing the
command line).

The hermetic tests of the same topic are in ``tests/unit/test_boundaries.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_command_line_imports_no_client_and_no_engine_side_effect():
    # Importing the command line module leaves the client unimported (the server installs
    # and serves without it) and the process untuned (no import-time side effects).
    probe = (
        "import os, sys, gc; before = dict(os.environ); t = gc.get_threshold()\n"
        "import zephon_server.cli, zephon_server.engine\n"
        "import zephon_server.engine.tokenizer, zephon_server.engine.runners.processes\n"
        "assert 'zephon_client' not in sys.modules, 'client imported'\n"
        "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())\n"
        "assert gc.get_threshold() == t and gc.get_freeze_count() == 0\n"
        "print('clean')\n"
    )
    assert run_probe(probe) == "clean"


def test_only_the_tail_command_imports_the_client_to_parse_its_flags():
    probe = (
        "import sys\n"
        "from zephon_server.cli import build_parser\n"
        "build_parser('serve').parse_args(['serve', '--config', 'p.yaml'])\n"
        "assert 'zephon_client' not in sys.modules, 'client imported for serve'\n"
        "args = build_parser('tail').parse_args(['tail', '--address', 'h:1', '--lane', '0',"
        " '--tls-ca', 'ca.pem', '--wait', '5'])\n"
        "assert (args.tls_ca, args.wait) == ('ca.pem', 5.0), args\n"
        "print('ok')\n"
    )
    assert run_probe(probe) == "ok"


def run_probe(probe: str) -> str:
    """What ``probe`` prints in a fresh interpreter that sees only the server and client."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'server'}:{ROOT / 'client'}"}
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()
