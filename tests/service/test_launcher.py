"""The ``zephon`` command, the shell launcher ``server/bin/zephon``: it preloads what
``zephon_server/runtime/allocator.py`` would choose, or leaves the choice to the program.

Each case runs the real launcher under ``/bin/sh`` with a stand-in ``zephon-python`` beside it
that prints what it was given. ``tests/service/test_allocator.py`` starts a real server with it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from zephon_server.cli import _command
from zephon_server.runtime import allocator

pytestmark = [pytest.mark.service, pytest.mark.timeout(60)]

LAUNCHER = Path(__file__).resolve().parents[2] / "server" / "bin" / "zephon"
SHOW = (
    '#!/bin/sh\nprintf "%s\\n" "LD_PRELOAD=${LD_PRELOAD-}" '
    '"DECOMMIT=${MIMALLOC_ALLOW_DECOMMIT-}" "$@"\n'
)


@pytest.fixture
def bin_dir(tmp_path):
    """A directory holding a copy of the launcher and a stand-in ``zephon-python``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "zephon").write_text(LAUNCHER.read_text())
    (bin_dir / "zephon-python").write_text(SHOW)
    for name in ("zephon", "zephon-python"):
        (bin_dir / name).chmod(0o755)
    return bin_dir


def launch(program: Path, args: list[str], env: dict[str, str]) -> tuple[dict[str, str], list]:
    """Run ``program args`` with exactly ``env`` (plus PATH); what zephon-python was given."""
    run = subprocess.run(
        [str(program), *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    lines = run.stdout.split("\n")[:-1]
    seen = dict(line.split("=", 1) for line in lines[:2])
    return seen, lines[2:]


def in_standard_dirs(name: str) -> str | None:
    """Where allocator ``name`` is in :data:`allocator.LIBRARY_DIRS` (no linker cache)."""
    return allocator.find_library(name, allocator.LIBRARY_DIRS) if name in allocator.KNOWN else None


CASES = [
    (["serve", "--config", "a b.yaml"], {}),
    (["serve", "--allocator", "system", "--config", "p.yaml"], {}),
    (["serve", "--allocator=mimalloc"], {}),
    (["serve", "--allocator", "jemalloc"], {}),
    (["serve", "--allocator", "system", "--allocator", "auto"], {}),
    (["serve", "--", "--allocator", "system"], {}),
    (["-v", "serve"], {}),
    (["serve"], {"ZEPHON_ALLOCATOR": "system"}),
    (["serve", "--allocator", "auto"], {"ZEPHON_ALLOCATOR": "system"}),
    (["serve"], {"LD_PRELOAD": "/opt/lib/libother.so"}),
    (["serve"], {"MIMALLOC_ALLOW_DECOMMIT": "1"}),
    (["serve", "--allocator", "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"], {}),
    (["index", "--config", "p.yaml"], {}),
    (["dump", "--allocator", "mimalloc"], {}),
    ([], {}),
]


@pytest.mark.parametrize(("args", "env"), CASES)
def test_the_launcher_preloads_what_the_program_would_choose(bin_dir, monkeypatch, args, env):
    monkeypatch.setattr(allocator, "_ldconfig_paths", dict)  # the standard directories only
    seen, passed = launch(bin_dir / "zephon", args, env)
    assert passed == args  # every argument through unchanged, spaces included
    choice = allocator.requested(args, env)
    expected = env.get("LD_PRELOAD", "")
    if _command(args) == "serve" and not expected and choice in ("auto", *allocator.KNOWN):
        expected = in_standard_dirs("mimalloc" if choice == "auto" else choice) or ""
    assert seen["LD_PRELOAD"] == expected
    if expected and "mimalloc" in expected and "MIMALLOC_ALLOW_DECOMMIT" not in env:
        assert seen["DECOMMIT"] == allocator.TUNING["mimalloc"]["MIMALLOC_ALLOW_DECOMMIT"]
    else:
        assert seen["DECOMMIT"] == env.get("MIMALLOC_ALLOW_DECOMMIT", "")
    if seen["LD_PRELOAD"] and not env.get("LD_PRELOAD"):  # what the program would resolve
        assert seen["LD_PRELOAD"] == allocator.resolve(choice, {}).library


def test_the_launcher_finds_the_program_through_a_symbolic_link(bin_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "zephon").symlink_to(bin_dir / "zephon")
    _, passed = launch(elsewhere / "zephon", ["index", "--config", "p.yaml"], {})
    assert passed == ["index", "--config", "p.yaml"]


def test_the_launcher_mirrors_the_allocator_module():
    text = LAUNCHER.read_text()
    dirs = re.search(r"for dir in (.*?); do", text, re.S)
    assert dirs and tuple(dirs.group(1).replace("\\\n", " ").split()) == allocator.LIBRARY_DIRS
    names = dict(re.findall(r'^\s+(?:auto \| )?(\w+)\) names="([^"]*)"', text, re.M))
    assert names == {name: " ".join(libs) for name, (libs, _) in allocator.KNOWN.items()}
    tuning = dict(re.findall(r"\$\{(MIMALLOC_\w+)=([^}]*)\}", text))
    assert tuning == allocator.TUNING["mimalloc"]


def test_without_the_program_the_launcher_names_the_fix(tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "zephon").write_text(LAUNCHER.read_text())
    (alone / "zephon").chmod(0o755)
    # A PATH with the tools the launcher uses and no zephon-python, even where one is
    # installed system-wide.
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("dirname", "readlink"):
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    run = subprocess.run(
        [str(alone / "zephon"), "serve"],
        env={"PATH": str(tools)},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert run.returncode == 127
    assert "zephon-python is neither beside" in run.stderr and "pip install" in run.stderr
