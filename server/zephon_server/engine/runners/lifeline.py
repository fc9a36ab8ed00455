"""A lifeline from a process to its spawn workers: the workers exit when that process dies.

A processes-runner worker waits for tasks on a multiprocessing queue whose pipe it holds both
ends of, so it never notices that the process feeding it is gone: a server killed with
SIGKILL used to leave its workers running with parent pid 1, and through them
multiprocessing's resource tracker (which exits only once every process holding its pipe
has), with the shared memory both kept.

The owning process makes one pipe (:func:`lifeline`, on first use) and keeps its write end
for as long as it lives; every worker gets the read end and watches it from a daemon thread
(:func:`watch`). Nothing else holds the write end: it is close-on-exec, never passed to a
worker, and closed in a child made by ``fork``. So the read end reaches end-of-file exactly
when the owning process has exited, however it exited, and also when it died before the
worker started watching (no race to close). The worker then exits at once.

Not ``prctl(PR_SET_PDEATHSIG)``: Linux sends that signal when the *thread* that started the
child exits, and a process pool starts its workers from whichever thread submits (a step's
driver thread, which ends at the end of a stream while its last tasks still run). A watcher
thread needs the interpreter lock, so a worker inside a long native call that holds it exits
when that call returns.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from multiprocessing.connection import Connection

#: Exit status of a worker whose owning process is gone (nobody is left to read it).
ORPHAN_EXIT = 1

_lock = threading.Lock()
_pipe: tuple[Connection, Connection] | None = None  # (read end, write end) of this process


def lifeline() -> Connection:
    """The read end to hand to worker processes; the pipe is made once per process."""
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = multiprocessing.Pipe(duplex=False)
            os.register_at_fork(after_in_child=_forget)
        return _pipe[0]


def _forget() -> None:
    """In a child made by ``fork``: drop the parent's pipe (the child must not keep the
    parent's workers alive) so that the child makes its own if it needs one."""
    global _pipe
    if _pipe is not None:
        for end in _pipe:
            end.close()
        _pipe = None


def watch(reader: Connection, owner_pid: int) -> None:
    """Worker side: exit this process as soon as the owning process (``owner_pid``) is gone."""
    threading.Thread(
        target=_wait, args=(reader, owner_pid), name="zephon-lifeline", daemon=True
    ).start()


def _wait(reader: Connection, owner_pid: int) -> None:
    fd = reader.fileno()
    while True:
        try:
            if not os.read(fd, 1):
                break  # end-of-file: the write end is closed, the owner has exited
        except OSError:
            break
    message = f"zephon worker {os.getpid()}: process {owner_pid} that ran it is gone; exiting\n"
    try:
        os.write(2, message.encode())
    except OSError:
        pass
    os._exit(ORPHAN_EXIT)
