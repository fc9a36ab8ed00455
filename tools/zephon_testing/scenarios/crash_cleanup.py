"""The scenarios of ``tests/reliability/test_crash_cleanup.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.shm_owner import BLOCK_PREFIX, OWNER_PREFIX
from zephon_testing.servers import (
    ServerProcess,
    dump_digests,
    open_request,
    read_lane,
    response_batches,
)

SHM = Path("/dev/shm")


def serve(config: Path, workdir: Path, runner: str = "processes") -> ServerProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    args = ["--config", str(config), "--state-dir", str(workdir / "state"), "--max-ahead", "2"]
    return ServerProcess([*args, "--runner", runner, "--workers", "2"], workdir)


def start_time(pid: int) -> int | None:
    """The start time of a running (not zombie) process, None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def tree(root: int) -> dict[int, int]:
    """pid -> start time of every running descendant of ``root``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found and (started := start_time(pid)) is not None:
                found[pid] = started
                frontier.append(pid)
    return found


def running(procs: dict[int, int]) -> dict[int, str]:
    """The processes of ``procs`` still running (same pid and start time), with commands."""
    out = {}
    for pid, started in procs.items():
        if start_time(pid) == started:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    out[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            except OSError:
                continue
    return out


def reap(procs: dict[int, int]) -> None:
    """SIGKILL what still runs of ``procs`` (a failed test leaves no orphans behind)."""
    for pid in running(procs):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def command(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def mapped(pids) -> set[str]:
    """Names under /dev/shm that the processes ``pids`` have mapped. A semaphore's creator
    maps it under glibc's temporary name (then unlinked): such names are found by inode."""
    names, inodes = set(), set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.readlines()
        except OSError:
            continue
        for line in lines:
            parts = line.rstrip("\n").split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                inodes.add(int(parts[4]))
                if not parts[5].endswith(" (deleted)"):
                    names.add(parts[5][len("/dev/shm/") :])
    for name in os.listdir(SHM):
        with contextlib.suppress(OSError):
            if os.stat(SHM / name).st_ino in inodes:
                names.add(name)
    return names


def owner_of(pid: int) -> str | None:
    """The owner id of server ``pid`` (from its owner file), None if it has none."""
    prefix = f"{OWNER_PREFIX}{pid}-"
    found = [n[len(OWNER_PREFIX) :] for n in os.listdir(SHM) if n.startswith(prefix)]
    assert len(found) <= 1, found
    return found[0] if found else None


def named(owner: str | None) -> set[str]:
    """The entries named after ``owner``: its payload blocks and its owner file."""
    if owner is None:
        return set()
    return {
        n
        for n in os.listdir(SHM)
        if n == f"{OWNER_PREFIX}{owner}" or n.startswith(f"{BLOCK_PREFIX}{owner}-")
    }


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


class LaneReader:
    """Reads lane 0 on a thread, acknowledging, so that the server keeps producing."""

    def __init__(self, srv: ServerProcess) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.requests.put(open_request(0))
        self.call = srv.stub().StreamBatches(iter(self.requests.get, None), timeout=120)
        self.next_seq = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            for resp in self.call:
                got = response_batches(resp)
                self.next_seq = got[-1].seq + 1
                self.requests.put(pb.StreamBatchesRequest(ack=pb.Ack(next_seq=self.next_seq)))

    def stop(self) -> int:
        """Stop reading; the next seq of lane 0."""
        self.requests.put(None)
        self.call.cancel()
        self.thread.join(10)
        return self.next_seq


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def catch_holding_blocks(srv: ServerProcess) -> tuple[str, int]:
    """Stop the server (SIGSTOP) at a moment it holds payload blocks, while lane 0 is read;
    its owner id and lane 0's next seq. Stopped, its blocks stay (workers only add some)."""
    reader = LaneReader(srv)
    try:
        assert wait_until(lambda: owner_of(srv.proc.pid) is not None, 60), srv.output()[-2000:]
        owner = owner_of(srv.proc.pid)
        assert owner is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(n.startswith(BLOCK_PREFIX) for n in named(owner)):
                os.kill(srv.proc.pid, signal.SIGSTOP)
                assert wait_until(lambda: stopped(srv.proc.pid), 5)
                if any(n.startswith(BLOCK_PREFIX) for n in named(owner)):
                    return owner, reader.stop()
                os.kill(srv.proc.pid, signal.SIGCONT)
            time.sleep(0.002)
        raise AssertionError(f"never saw a payload block:\n{srv.output()[-2000:]}")
    finally:
        reader.stop()


def snapshot(srv: ServerProcess, owner: str | None) -> tuple[dict[int, int], set[str]]:
    """The (stopped) server's process tree and its /dev/shm entries."""
    procs = tree(srv.proc.pid)
    return procs, mapped([srv.proc.pid, *procs]) | named(owner)


def run_sigkill_of_the_server(endless_config: Path, tmp_path: Path) -> dict[str, Any]:
    """SIGKILL of a processes-runner server caught holding payload blocks: checks its two
    workers and the resource tracker exit, the tracker unlinks the semaphores and blocks, and
    the next start-up removes the owner file. Returns what ran and what /dev/shm held before
    the kill, what was left after it and after the next start-up, and how long they took."""
    srv = serve(endless_config, tmp_path / "killed")
    try:
        owner, _ = catch_holding_blocks(srv)
        procs, entries = snapshot(srv, owner)
        workers = [p for p in procs if "spawn_main" in command(p)]
        trackers = [p for p in procs if "resource_tracker" in command(p)]
        assert len(workers) == 2 and len(trackers) == 1, running(procs)
        assert any(n.startswith("sem.mp-") for n in entries), entries
    except BaseException:
        reap(tree(srv.proc.pid))
        raise
    finally:
        srv.kill()
    killed = time.monotonic()
    # However the server dies, its workers exit, and so the resource tracker.
    try:
        assert wait_until(lambda: not running(procs), 10), running(procs)
        gone_s = time.monotonic() - killed
        survivors = len(running(procs))
    finally:
        reap(procs)
    assert f"process {srv.proc.pid} that ran it is gone" in srv.output()
    # The tracker unlinked the semaphores and the registered blocks on its way out; only the
    # owner file (the tracker does not know it) waits for the next start-up.
    owner_file = f"{OWNER_PREFIX}{owner}"
    assert any(n.startswith(BLOCK_PREFIX) for n in entries), entries
    left = lambda: (entries | named(owner)) & set(os.listdir(SHM))  # noqa: E731
    assert wait_until(lambda: left() == {owner_file}, 10), left()
    after_kill = sorted(left())
    nxt = serve(endless_config, tmp_path / "next", runner="threads")
    try:
        after_start = sorted(left())
        assert not after_start, after_start
    finally:
        nxt.terminate()
    return {
        "workers": len(workers),
        "trackers": len(trackers),
        "entries": sorted(entries),
        "processes_left": survivors,
        "gone_s": gone_s,
        "left_after_kill": after_kill,
        "left_after_start": after_start,
    }


def run_sweep_of_a_killed_tree(endless_config: Path, tmp_path: Path) -> dict[str, Any]:
    """A processes-runner tree killed all at once (the tracker first, so nothing cleans up)
    while another server runs, SIGSTOPped holding blocks: checks the next start-up removes
    every entry of the dead tree, keeps every one of the live server, and the live server
    then serves lane 0 as ``zephon dump`` does. Returns the entries dead and live, what was
    left of the dead ones after the sweep, and the live one's batches compared."""
    live = serve(endless_config, tmp_path / "live")
    dead = sweeper = None
    dead_procs: dict[int, int] = {}
    try:
        dead = serve(endless_config, tmp_path / "dead")
        dead_owner, _ = catch_holding_blocks(dead)
        dead_procs, dead_entries = snapshot(dead, dead_owner)
        # Kill the whole tree at once, the tracker first: nothing is left to clean up.
        for pid in sorted(dead_procs, key=lambda p: "resource_tracker" not in command(p)):
            os.kill(pid, signal.SIGKILL)
        dead.kill()
        assert wait_until(lambda: not running(dead_procs), 10), running(dead_procs)
        blocks = {n for n in dead_entries if n.startswith(BLOCK_PREFIX)}
        semaphores = {n for n in dead_entries if n.startswith("sem.mp-")}
        assert blocks and semaphores, dead_entries
        assert dead_entries <= set(os.listdir(SHM)), "left behind, before any sweep"
        # A live server, even one that is stopped, keeps everything during the sweep.
        live_owner, next_seq = catch_holding_blocks(live)
        _, live_entries = snapshot(live, live_owner)
        sweeper = serve(endless_config, tmp_path / "sweeper", runner="threads")
        on_disk = set(os.listdir(SHM))
        figures = {
            "dead_processes": len(dead_procs),
            "dead_entries": sorted(dead_entries),
            "dead_left": sorted(dead_entries & on_disk),
            "live_entries": sorted(live_entries),
            "live_kept": sorted(live_entries & on_disk),
        }
        assert not dead_entries & on_disk, dead_entries & on_disk
        assert live_entries <= on_disk, live_entries - on_disk
        assert "owner file(s) left in /dev/shm by processes that died" in sweeper.output()
        os.kill(live.proc.pid, signal.SIGCONT)
        batches, _ = read_lane(live.stub(), 0, start_seq=next_seq, count=5)
        expected = dump_digests(endless_config, next_seq + 5, lanes="0")[0][next_seq:]
        assert [b.chain_digest.hex() for b in batches] == expected
        figures["live_batches_checked"] = len(batches)
    finally:
        os.kill(live.proc.pid, signal.SIGCONT)
        if dead is not None:
            reap(tree(dead.proc.pid))
            dead.kill()
        reap(dead_procs)
        if sweeper is not None:
            sweeper.terminate()
        code = live.terminate()
    assert code == 0, live.output()[-3000:]
    return figures
