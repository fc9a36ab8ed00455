"""The memory allocator ``zephon serve`` runs with (server/zephon_server/runtime/allocator.py).

Unit tests of the choice, then real ``zephon serve`` processes: by default mimalloc is mapped
into the server and its worker processes (same pid after the re-execution), ``--allocator
system`` keeps glibc's malloc, and the lanes' batches are bit-identical under both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zephon_server.runtime import allocator
from zephon_testing.servers import lane_digests, serve_once, server, write_config

MIMALLOC = allocator.find_library("mimalloc")


# --------------------------------------------------------------------------------------------
# real servers
# --------------------------------------------------------------------------------------------


def mapped(pid: int) -> set[str]:
    text = Path(f"/proc/{pid}/maps").read_text()
    return {os.path.basename(line.rsplit(" ", 1)[-1]) for line in text.splitlines()}


def has_mimalloc(pid: int) -> bool:
    return any(name.startswith("libmimalloc") for name in mapped(pid))


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if b"=" in item)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        out += kids
        todo += kids
    return out


@pytest.mark.service
@pytest.mark.timeout(240)
def test_serve_preloads_mimalloc_and_the_data_do_not_change(tmp_path, corpus_dir):
    assert MIMALLOC, "tools/install-system-deps.sh must install Debian's libmimalloc2.0"
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=2)
    args = ["--config", str(cfg), "--runner", "processes", "--workers", "2"]
    with server(args, tmp_path, env={"MIMALLOC_RESET_DELAY": "5"}) as fast:
        assert has_mimalloc(fast.proc.pid), fast.output()  # the same pid, re-executed
        workers = descendants(fast.proc.pid)
        deadline = time.monotonic() + 30  # workers may still be spawning at SERVING
        while not workers and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = descendants(fast.proc.pid)
        assert workers and all(has_mimalloc(pid) for pid in workers)
        # ... with mimalloc's settings (pages kept), here and in the workers; a setting the
        # user gave wins.
        for pid in (fast.proc.pid, *workers):
            env = environ(pid)
            assert env["MIMALLOC_ALLOW_DECOMMIT"] == "0", pid
            assert env["MIMALLOC_PURGE_DELAY"] == "-1"
            assert env["MIMALLOC_RESET_DELAY"] == "5"
        assert "memory allocator: mimalloc" in fast.output()
        preloaded = lane_digests(fast, 2)
    with server([*args, "--allocator", "system"], tmp_path) as plain:
        assert not has_mimalloc(plain.proc.pid)
        assert "MIMALLOC_ALLOW_DECOMMIT" not in environ(plain.proc.pid)
        assert "memory allocator: glibc malloc" in plain.output()
        assert lane_digests(plain, 2) == preloaded
    # ZEPHON_ALLOCATOR sets the default; an explicit path works like a name, also for a
    # library Zephon does not know by name (here mimalloc under another file name).
    custom = tmp_path / "libfastalloc.so"
    shutil.copy(MIMALLOC, custom)
    with server(
        ["--config", str(cfg), "--allocator", str(custom)], tmp_path, env={"ZEPHON_ALLOCATOR": "x"}
    ) as by_path:
        assert "libfastalloc.so" in mapped(by_path.proc.pid)
        assert f"memory allocator: libfastalloc.so ({custom.resolve()})" in by_path.output()
        assert "could not be preloaded" not in by_path.output()
    with server(["--config", str(cfg)], tmp_path, env={"ZEPHON_ALLOCATOR": "system"}) as env:
        assert not has_mimalloc(env.proc.pid)
    # --allocator system also drops an allocator the server inherited in LD_PRELOAD.
    inherited = {"LD_PRELOAD": MIMALLOC}
    with server(["--config", str(cfg), "--allocator", "system"], tmp_path, env=inherited) as srv:
        assert not has_mimalloc(srv.proc.pid)
        assert "memory allocator: glibc malloc" in srv.output()
    with server(["--config", str(cfg)], tmp_path, env=inherited) as srv:
        assert has_mimalloc(srv.proc.pid)  # auto keeps a preload the user set


@pytest.mark.service
def test_an_allocator_that_is_not_there_fails_at_start_up(tmp_path, corpus_dir):
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=2)
    done = serve_once(["--config", str(cfg), "--allocator", "/nonexistent/libmalloc.so"], tmp_path)
    assert done.returncode == 2
    assert "--allocator '/nonexistent/libmalloc.so': expected one of auto" in done.stderr


# --------------------------------------------------------------------------------------------
# start-up under the default allocator (issue 20: indexing was 4.5x slower on mimalloc)
# --------------------------------------------------------------------------------------------

INDEX_FAULTS = """
import resource, sys
from zephon_server.engine.shards import index_lines
big, small = sys.argv[1], sys.argv[2:]
for path in (big, *small):  # first use: the allocator's and numpy's own set-up
    index_lines(path)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    for path in (big, *small):
        index_lines(path)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def index_faults(files: list[Path], env: dict[str, str]) -> int:
    """Minor page faults of indexing ``files`` three times over, in a fresh interpreter."""
    run = subprocess.run(
        [sys.executable, "-c", INDEX_FAULTS, *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return int(run.stdout.split()[-1])


@pytest.mark.service
@pytest.mark.timeout(120)
def test_indexing_takes_no_more_page_faults_on_the_default_allocator(tmp_path):
    # Each shard's index used to allocate a 16 MiB + 1 byte read buffer: glibc keeps that on
    # its heap, mimalloc 2.0 maps it fresh from the kernel (4,096 page faults) and unmaps it
    # on free, on every shard: 1,000 shards of 1 MB took 4.5x as long to index.
    assert MIMALLOC, "tools/install-system-deps.sh must install Debian's libmimalloc2.0"
    line = b'{"text": "' + b"zephon " * 150 + b'"}\n'
    big = tmp_path / "big.jsonl"
    big.write_bytes(line * ((64 << 20) // len(line)))
    small = []
    for i in range(8):
        small.append(tmp_path / f"small{i}.jsonl")
        small[-1].write_bytes(line * ((1 << 20) // len(line)) + b'{"text": "end"}')
    files = [big, *small]
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and "MIMALLOC" not in k}
    glibc = index_faults(files, base)
    # exactly the environment `zephon serve` gives mimalloc (allocator.TUNING)
    preloaded = allocator.tuned_environ("mimalloc", {**base, "LD_PRELOAD": MIMALLOC})
    on_mimalloc = index_faults(files, preloaded)
    pages_read = 3 * sum(f.stat().st_size for f in files) // 4096
    assert on_mimalloc <= 2 * glibc + 512, (on_mimalloc, glibc, pages_read)
    # ... and on neither does indexing fault in proportion to the bytes it reads
    assert max(glibc, on_mimalloc) <= pages_read // 16, (on_mimalloc, glibc, pages_read)


REEXEC = """
import json, os, subprocess, sys
sys.argv = ["zephon", "serve", "--port", "0", *sys.argv[1:]]
spawned = []
_popen = subprocess.Popen.__init__

def popen(self, args, *more, **kw):
    spawned.append(str(args))
    _popen(self, args, *more, **kw)

subprocess.Popen.__init__ = popen
import zephon_server.cli as cli

def execve(path, args, env):  # the re-execution: report what this image did before it
    seen = {"modules": sorted(sys.modules), "preload": env.get("LD_PRELOAD"), "spawned": spawned}
    print(json.dumps(seen))
    sys.stdout.flush()
    os._exit(0)

os.execve = execve
cli.entry()
"""


@pytest.mark.service
@pytest.mark.timeout(60)
def test_serve_re_executes_before_importing_the_server():
    # The first image is thrown away: whatever it imports, the new one imports again. Parsing
    # the command line used to import the server (numpy, gRPC, the engine) first.
    assert MIMALLOC
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.ENV)}
    run = subprocess.run(
        [sys.executable, "-c", REEXEC, "--allocator", "mimalloc", "--config", "x.yaml"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=True,
    )
    seen = json.loads(run.stdout.splitlines()[-1])
    assert os.path.basename(seen["preload"]).startswith("libmimalloc"), seen["preload"]
    heavy = {"numpy", "grpc", "zephon_server.service.server", "zephon_server.engine.pipeline"}
    assert heavy.isdisjoint(seen["modules"]), sorted(heavy & set(seen["modules"]))
    # ... nor runs anything: mimalloc is in a standard directory, glibc's soname is known
    # (each `ldconfig -p` was a fork and exec, in both images and every worker process)
    assert seen["spawned"] == []


COUNT_STARTS = """
import os
with open(os.environ["ZEPHON_TEST_STARTS"], "a") as f:
    f.write(f"{os.getpid()} {os.environ.get('LD_PRELOAD', '')}\\n")
"""


@pytest.mark.service
@pytest.mark.timeout(180)
def test_a_server_started_with_mimalloc_preloaded_does_not_re_execute(tmp_path, corpus_dir):
    # As in the container image (ENV LD_PRELOAD): `auto` finds mimalloc loaded, names it and
    # spares the second interpreter start. Interpreter starts are counted by a sitecustomize.
    assert MIMALLOC
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=2)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNT_STARTS)
    base = {
        "PYTHONPATH": f"{hook}:{os.environ.get('PYTHONPATH', '')}",
        "ZEPHON_ALLOCATOR": "",
    }
    starts = {}
    for name, extra in (("preloaded", {"LD_PRELOAD": MIMALLOC}), ("plain", {"LD_PRELOAD": ""})):
        log = tmp_path / f"starts-{name}"
        env = {**base, **extra, "ZEPHON_TEST_STARTS": str(log)}
        with server(["--config", str(cfg), "--log-interval", "0"], tmp_path, env=env) as srv:
            assert has_mimalloc(srv.proc.pid), srv.output()
            output = srv.output()
        starts[name] = log.read_text().splitlines()
        assert "memory allocator: mimalloc" in output, output
        if name == "preloaded":
            assert "preloaded already" in output and "re-executed" not in output, output
    assert len(starts["preloaded"]) == 1, starts  # one interpreter start
    # without the preload the same command re-executes: the same pid starts twice
    assert len(starts["plain"]) == 2 and len({s.split()[0] for s in starts["plain"]}) == 1, starts


ZEPHON = Path(sys.executable).with_name("zephon")
"""The installed ``zephon`` command: the shell launcher ``server/bin/zephon``."""


@pytest.mark.service
@pytest.mark.timeout(180)
def test_the_zephon_command_preloads_mimalloc_before_python_starts(
    tmp_path, corpus_dir, monkeypatch
):
    # The launcher sets LD_PRELOAD and the mimalloc settings, then execs the program: one
    # interpreter start (counted by a sitecustomize), the launched pid serving on mimalloc.
    assert MIMALLOC and ZEPHON.is_file(), ZEPHON
    cfg = write_config(tmp_path / "p.yaml", corpus_dir, lanes=2)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNT_STARTS)
    starts = tmp_path / "starts"
    for name in ("LD_PRELOAD", allocator.ENV, *allocator.TUNING["mimalloc"]):
        monkeypatch.delenv(name, raising=False)
    env = {
        "PYTHONPATH": f"{hook}:{os.environ.get('PYTHONPATH', '')}",
        "ZEPHON_TEST_STARTS": str(starts),
    }
    with server(["--config", str(cfg)], tmp_path, env=env, command=[str(ZEPHON)]) as srv:
        pid = srv.proc.pid
        assert has_mimalloc(pid), srv.output()
        seen = environ(pid)
        output = srv.output()
    assert "preloaded already" in output and "re-executed" not in output, output
    assert os.path.realpath(seen["LD_PRELOAD"]) == os.path.realpath(MIMALLOC)
    assert {k: seen[k] for k in allocator.TUNING["mimalloc"]} == allocator.TUNING["mimalloc"]
    assert len(starts.read_text().splitlines()) == 1, starts.read_text()

    # --allocator system through the same command: glibc, nothing preloaded
    args = ["--config", str(cfg), "--allocator", "system"]
    with server(args, tmp_path, env=env, command=[str(ZEPHON)]) as srv:
        assert not has_mimalloc(srv.proc.pid), srv.output()
        assert environ(srv.proc.pid).get("LD_PRELOAD", "") == ""
