"""The memory allocator ``zephon serve`` runs with (server/zephon_server/runtime/allocator.py):
the hermetic tests.

The tests of the same topic that need a subprocess, worker processes, a socket or the wall clock are
in ``tests/service/test_allocator.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zephon_server.runtime import allocator
from zephon_server.runtime.allocator import Allocator, AllocatorError, resolve


def test_choices_resolve_to_a_library_or_glibc(monkeypatch, tmp_path):
    assert resolve("system") == Allocator("system")
    # auto keeps what the user preloads
    assert resolve("auto", {"LD_PRELOAD": "/opt/libtcmalloc.so"}) == Allocator("system")
    lib = tmp_path / "libcustom.so"
    lib.write_bytes(b"\x7fELF")
    assert resolve(str(lib)) == Allocator("libcustom.so", str(lib))
    monkeypatch.setattr(allocator, "find_library", lambda name, dirs=(): None)
    assert resolve("auto", {}) == Allocator("system")
    with pytest.raises(AllocatorError, match=r"apt-get install libmimalloc2\.0"):
        resolve("mimalloc")
    with pytest.raises(AllocatorError, match=r"apt-get install libjemalloc2"):
        resolve("jemalloc")
    with pytest.raises(AllocatorError, match="expected one of auto, mimalloc, jemalloc, system"):
        resolve("tcmalloc")
    with pytest.raises(AllocatorError, match="path of a shared library"):
        resolve(str(tmp_path / "missing.so"))

    def only_jemalloc(name, dirs=()):
        return "/x/libjemalloc.so.2" if name == "jemalloc" else None

    monkeypatch.setattr(allocator, "find_library", only_jemalloc)
    assert resolve("auto", {}) == Allocator("jemalloc", "/x/libjemalloc.so.2")


def test_find_library_looks_in_the_given_directories(monkeypatch, tmp_path):
    monkeypatch.setattr(allocator, "_ldconfig_paths", dict)
    assert allocator.find_library("jemalloc", [str(tmp_path)]) is None
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    assert allocator.find_library("jemalloc", [str(tmp_path)]) == str(tmp_path / "libjemalloc.so.2")
    # ... before the linker's cache, which is only asked when they have nothing
    elsewhere = tmp_path / "opt"
    elsewhere.mkdir()
    (elsewhere / "libmimalloc.so.2").write_bytes(b"")
    cache = {"libmimalloc.so.2": str(elsewhere / "libmimalloc.so.2")}
    monkeypatch.setattr(allocator, "_ldconfig_paths", lambda: cache)
    assert allocator.find_library("jemalloc", [str(tmp_path)]) == str(tmp_path / "libjemalloc.so.2")
    assert allocator.find_library("mimalloc", [str(tmp_path)]) == cache["libmimalloc.so.2"]
    (tmp_path / "libmimalloc.so.2").write_bytes(b"")
    assert allocator.find_library("mimalloc", [str(tmp_path)]) == str(tmp_path / "libmimalloc.so.2")


def test_the_mapped_allocator_is_read_from_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0\n"
    )
    found = allocator.loaded_library(str(maps))
    assert found == "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0"
    assert allocator.describe(found) == f"mimalloc ({found})"
    assert allocator.name_of("/opt/lib/libtcmalloc.so.4") == "libtcmalloc.so.4"
    custom = tmp_path / "libcustom.so"
    custom.write_bytes(b"")
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 1 {custom.resolve()}\n")
    assert allocator.loaded_library(str(maps)) is None
    assert allocator.loaded_library(str(maps), also=str(custom)) == str(custom.resolve())
    maps.write_text("7f00-7f01 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert allocator.loaded_library(str(maps)) is None
    assert allocator.describe(None) == "glibc malloc"
    assert allocator.current_name() in ("glibc", "mimalloc", "jemalloc")  # this process


def test_the_allocator_is_read_from_the_command_line_before_parsing():
    assert allocator.requested(["serve", "--config", "p.yaml"], {}) == "auto"
    assert allocator.requested(["serve"], {allocator.ENV: "system"}) == "system"
    assert allocator.requested(["serve", "--allocator", "system"], {allocator.ENV: "x"}) == "system"
    assert allocator.requested(["serve", "--allocator=/opt/lib.so"], {}) == "/opt/lib.so"
    last = ["serve", "--allocator", "system", "--allocator", "jemalloc"]
    assert allocator.requested(last, {}) == "jemalloc"  # as argparse: the last one wins
    assert allocator.requested(["serve", "--allocator"], {}) == "auto"  # the parser says why
    assert allocator.requested(["serve", "--", "--allocator", "system"], {}) == "auto"


# --------------------------------------------------------------------------------------------
# one decision, whoever calls (issue 21): the program, tests and embedders take the same path
# --------------------------------------------------------------------------------------------


def test_the_decision_keeps_an_allocator_that_is_preloaded_already(monkeypatch):
    lib = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"
    monkeypatch.setattr(allocator, "find_library", lambda name, dirs=(): lib)
    for choice in ("auto", "mimalloc"):
        kept = allocator.decide(choice, {"LD_PRELOAD": lib}, loaded=lib)
        assert not kept.reexec and kept.name == "mimalloc"  # never "glibc malloc"
        assert kept.message == f"memory allocator: mimalloc ({lib}), preloaded already"
    # nothing loaded yet: preload it, keeping what LD_PRELOAD had
    fresh = allocator.decide("auto", {}, loaded=None)
    assert fresh.reexec and fresh.preload == (lib,) and fresh.name == "mimalloc"
    named = allocator.decide("mimalloc", {"LD_PRELOAD": "/opt/libx.so"}, loaded=None)
    assert named.preload == (lib, "/opt/libx.so")
    # auto keeps another library the user preloads; system drops an allocator only
    other = allocator.decide("auto", {"LD_PRELOAD": "/opt/libx.so"}, loaded=None)
    assert not other.reexec and "as LD_PRELOAD sets it (/opt/libx.so)" in other.message
    drop = allocator.decide("system", {"LD_PRELOAD": f"/opt/libx.so:{lib}"}, loaded=lib)
    assert drop.reexec and drop.preload == ("/opt/libx.so",) and drop.name == "glibc"
    assert allocator.decide("system", {}, loaded=None).message == "memory allocator: glibc malloc"
    monkeypatch.setattr(allocator, "find_library", lambda name, dirs=(): None)
    hint = allocator.decide("auto", {}, loaded=None)
    assert not hint.reexec and "apt-get install libmimalloc2.0" in hint.message


def test_ensure_allocator_carries_the_decision_out_only_for_the_program(monkeypatch):
    lib = "/opt/lib/libmimalloc.so.2"
    monkeypatch.setattr(allocator, "find_library", lambda name, dirs=(): lib)
    monkeypatch.setattr(allocator, "loaded_library", lambda *a, **k: None)
    calls = []

    def execve(path, args, env):
        calls.append((args, env))
        raise SystemExit("re-executed")

    monkeypatch.setattr(os, "execve", execve)
    env = {"PATH": "/bin", "MIMALLOC_RESET_DELAY": "5"}
    # embedded (tests, another program's process): the same decision, logged, not carried out
    embedded = allocator.ensure_allocator("auto", None, env)
    assert embedded == allocator.decide("auto", env, None) and embedded.reexec and calls == []
    # the program: carried out with the same preload and the allocator's settings
    with pytest.raises(SystemExit, match="re-executed"):
        allocator.ensure_allocator("auto", ["python", "-m", "zephon_server.cli", "serve"], env)
    ((args, new_env),) = calls
    assert args == ["python", "-m", "zephon_server.cli", "serve"]
    assert new_env["LD_PRELOAD"] == lib and new_env["ZEPHON_ALLOCATOR_EXEC"] == "mimalloc"
    assert new_env["MIMALLOC_ALLOW_DECOMMIT"] == "0" and new_env["MIMALLOC_RESET_DELAY"] == "5"


def test_the_container_image_preloads_what_the_re_execution_would():
    dockerfile = (Path(__file__).resolve().parents[2] / "docker" / "Dockerfile").read_text()
    env: dict[str, str] = {}
    for block in dockerfile.split("\nENV ")[1:]:
        text = block.split("\n\n")[0].replace("\\\n", " ")
        for word in text.split():
            name, sep, value = word.partition("=")
            if sep:
                env[name] = value
    assert env["LD_PRELOAD"] == "/usr/local/lib/libmimalloc.so.2"
    assert allocator.is_allocator(env["LD_PRELOAD"])
    assert "ln -s" in dockerfile and "/usr/local/lib/libmimalloc.so.2" in dockerfile
    for name, value in allocator.TUNING["mimalloc"].items():
        assert env.get(name) == value, name
