"""``tools/install-mimalloc.sh`` finds an installed mimalloc however long ``ldconfig -p`` is.

Under ``set -o pipefail``, ``ldconfig -p | grep -q`` fails whenever grep exits at its match
while ldconfig is still writing (SIGPIPE): mimalloc then looked missing, and the script tried
to install it again, failing where nothing can be installed (a CI run lost two Docker tests to
it). A fake ``ldconfig`` lists the library first and then a long tail; a fake ``apt-get`` fails,
so the script passes only if it sees the library.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.service

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "install-mimalloc.sh"

LDCONFIG = """#!/bin/bash
echo "	libmimalloc.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
for i in $(seq 1 20000); do
  echo "	libfiller$i.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libfiller$i.so.1"
done
"""


def test_an_installed_mimalloc_is_found_in_a_long_ldconfig_listing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ldconfig", LDCONFIG), ("apt-get", "#!/bin/sh\nexit 1\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for _ in range(3):
        proc = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
