"""A progress bar for long command-line jobs (``zephon index``), on stderr, no dependency.

On a terminal it is one line rewritten in place a few times a second; otherwise (a log file,
a CI job) it prints a plain line every ``interval`` seconds, so logs stay readable. Each line
says items and bytes done out of the total, the rate of the bytes actually processed (items
found already done count as done but not in the rate) and the time left at that rate::

    index: 120/1000 shards, 1.2/10.0 GB, 85.3 MB/s, ETA 1m43s
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

TTY_REFRESH = 0.2


def human_bytes(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (powers of 1000, as disks and rates are quoted)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_seconds(s: float) -> str:
    """``103`` -> ``"1m43s"``, ``7300`` -> ``"2h01m"``."""
    n = max(0, round(s))
    if n < 60:
        return f"{n}s"
    if n < 3600:
        return f"{n // 60}m{n % 60:02d}s"
    return f"{n // 3600}h{n % 3600 // 60:02d}m"


class ProgressBar:
    """Progress of ``total`` items of ``total_bytes`` bytes, written to ``stream``.

    Call :meth:`advance` as items finish (from any thread) and :meth:`close` at the end; a
    ticker thread refreshes the line meanwhile (every ``interval`` seconds off a terminal).
    """

    def __init__(
        self,
        label: str,
        unit: str,
        total: int,
        total_bytes: int,
        stream: TextIO,
        *,
        tty: bool,
        interval: float,
    ) -> None:
        self.label = label
        self.unit = unit
        self.total = total
        self.total_bytes = total_bytes
        self.stream = stream
        self.tty = tty
        self.interval = TTY_REFRESH if tty else interval
        self.done = 0
        self.done_bytes = 0
        self.worked_bytes = 0  # bytes actually processed (the rate's numerator)
        self.skipped_bytes = 0
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ProgressBar:
        """Print the first line and start refreshing."""
        self._show()
        if self.interval > 0:
            self._thread = threading.Thread(target=self._tick, name="zephon-progress", daemon=True)
            self._thread.start()
        return self

    def advance(self, nbytes: int, worked: bool) -> None:
        """One item of ``nbytes`` bytes finished; ``worked``: processed now (else skipped)."""
        with self._lock:
            self.done += 1
            self.done_bytes += nbytes
            if worked:
                self.worked_bytes += nbytes
            else:
                self.skipped_bytes += nbytes

    def line(self) -> str:
        """The current progress line."""
        with self._lock:
            done, done_bytes, worked = self.done, self.done_bytes, self.worked_bytes
            todo = self.total_bytes - self.skipped_bytes
        elapsed = max(time.monotonic() - self._start, 1e-9)
        rate = worked / elapsed
        left = todo - worked
        eta = human_seconds(left / rate) if rate > 0 else "?"
        if done >= self.total:
            eta = "0s"
        return (
            f"{self.label}: {done}/{self.total} {self.unit}, {_pair(done_bytes, self.total_bytes)}"
            f", {human_bytes(rate)}/s, ETA {eta}"
        )

    def close(self) -> None:
        """Stop refreshing and print the final line (ending the terminal's line)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._show(final=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._show()

    def _show(self, final: bool = False) -> None:
        text = self.line()
        if self.tty:
            self.stream.write(f"\r{text}\x1b[K" + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _pair(done: int, total: int) -> str:
    """``"1.2/10.0 GB"``: both in the total's unit."""
    unit = human_bytes(total).split()[-1]
    scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
    if unit == "B":
        return f"{done}/{total} B"
    return f"{done / scale:.1f}/{total / scale:.1f} {unit}"
