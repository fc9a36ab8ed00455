"""The scenarios of ``tests/unit/test_shard_identity.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def rewrite_same_size(path: Path) -> None:
    """Rewrite ``path`` in place (same inode, same size, other text), as a job re-run over
    its output would: every ``a`` becomes ``e``. Waits out a coarse file-system clock so the
    modification time moves, as it does for any rewrite that is not within one clock tick."""
    before = path.stat()
    data = path.read_bytes()
    assert b"a" in data
    with open(path, "r+b") as fh:
        fh.write(data.replace(b"a", b"e"))
    while path.stat().st_mtime_ns == before.st_mtime_ns:
        time.sleep(0.01)
        os.utime(path)
    assert path.stat().st_size == before.st_size and path.stat().st_ino == before.st_ino
