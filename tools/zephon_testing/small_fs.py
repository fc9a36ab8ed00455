"""Real small filesystems for disk-full tests: a tmpfs of a few hundred KB mounted on a path.

Mounting needs root (or CAP_SYS_ADMIN), which the test machines and the CI container have; a
machine without it fails these tests with a message saying so rather than skipping them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, size: str, options: str = "") -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount -o size=...``, e.g. ``256k``; more ``options`` such as
    ``nr_inodes=16``) mounted on ``path`` for the block; unmounted after it (lazily, should
    a process still hold a file)."""
    path.mkdir(parents=True, exist_ok=True)
    extra = f",{options}" if options else ""
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755{extra}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"cannot mount a {size} tmpfs on {path} (the disk-full tests need root or "
            f"CAP_SYS_ADMIN; running as uid {os.geteuid()}): {proc.stderr.strip()}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def remount(path: Path, options: str) -> None:
    """``mount -o remount,<options>`` (e.g. ``ro``) of a tmpfs from :func:`tmpfs`."""
    subprocess.run(
        ["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True
    )


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of ``path``."""
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize
