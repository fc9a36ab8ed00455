"""Smooth weighted round-robin (SWRR, the nginx algorithm) with memoised orbits.

Each step, every active dataset adds its integer weight to its *current* value; the largest
current wins (ties go to the lowest index) and pays back the sum of the active weights. With a
fixed active set the state evolves deterministically and is eventually periodic, so the
selections along an orbit can be remembered once and replayed as numpy slices.

:class:`Swrr` only knows weights and currents; exhaustion (when a dataset leaves the active
set) is the caller's business: :mod:`.work_source` cuts a run where a dataset runs out and
starts a new run with the smaller active set.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

_ORBIT_PATH_CAP = 1 << 14  # SWRR steps explored per orbit search
_ORBIT_MAX_STATES = 1 << 15  # SWRR states remembered in total


class _Path:
    """A run of SWRR steps from one state: ``sel[i]`` is chosen from state ``cur[i]``.

    ``cur`` has one more entry (the state after the last step). When ``loop >= 0`` the state
    after the last step equals ``cur[loop]``: positions ``loop..len(sel)-1`` form a cycle.
    """

    __slots__ = ("cur", "loop", "sel")

    def __init__(self, sel: np.ndarray, cur: list[tuple[int, ...]], loop: int) -> None:
        self.sel = sel
        self.cur = cur
        self.loop = loop


class Swrr:
    """Smooth weighted round-robin with memoised orbits, so long runs cost numpy time.

    With a fixed active set the SWRR state evolves deterministically and is eventually
    periodic (for weights from a zero state the period is ``sum(w) / gcd(w)``). The first
    time a state is met, its orbit is explored step by step and remembered; later runs from
    any remembered state are vectorised slices of the stored selections. If the orbit is too
    long to remember, runs fall back to the plain step loop.
    """

    def __init__(self, weights: Sequence[int]) -> None:
        self._weights = list(weights)
        self._pos: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[_Path, int]] = {}

    def _steps(self, act: tuple[int, ...], c: list[int], m: int) -> list[int]:
        """Advance currents ``c`` (one per ``act``, in place) by ``m`` steps; the positions in
        ``act`` chosen at each step (the first maximum wins, so ties go to the lowest index)."""
        w = [self._weights[j] for j in act]
        total = sum(w)
        out = [0] * m
        if len(act) > 6:
            add = operator.add
            for i in range(m):
                c[:] = map(add, c, w)
                best = c.index(max(c))
                c[best] -= total
                out[i] = best
            return out
        rest = range(1, len(act))
        for i in range(m):
            best = 0
            best_v = c[0] + w[0]
            c[0] = best_v
            for x in rest:
                v = c[x] + w[x]
                c[x] = v
                if v > best_v:
                    best, best_v = x, v
            c[best] -= total
            out[i] = best
        return out

    def _explore(self, act: tuple[int, ...], cur: tuple[int, ...]) -> tuple[_Path, int] | None:
        if len(self._pos) >= _ORBIT_MAX_STATES:
            return None
        seen: dict[tuple[int, ...], int] = {}
        states: list[tuple[int, ...]] = []
        sel: list[int] = []
        state = cur
        loop = -1
        limit = min(_ORBIT_PATH_CAP, _ORBIT_MAX_STATES - len(self._pos))
        work = list(cur)
        while len(sel) < limit:
            seen[state] = len(states)
            states.append(state)
            sel.append(act[self._steps(act, work, 1)[0]])
            state = tuple(work)
            if state in seen:
                loop = seen[state]
                break
            if (act, state) in self._pos:
                break
        states.append(state)
        path = _Path(np.asarray(sel, dtype=np.int64), states, loop)
        for i, s in enumerate(states[:-1]):
            self._pos[(act, s)] = (path, i)
        return path, 0

    def run(
        self, act: tuple[int, ...], cur: tuple[int, ...], m: int
    ) -> tuple[np.ndarray, tuple[int, ...]]:
        """The next ``m`` selections (dataset indices) from currents ``cur`` (one per ``act``)
        and the currents after them."""
        pieces: list[np.ndarray] = []
        while m > 0:
            hit = self._pos.get((act, cur))
            if hit is None:
                hit = self._explore(act, cur)
                if hit is None:  # orbit too long to remember: plain steps
                    work = list(cur)
                    pieces.append(np.asarray(act, dtype=np.int64)[self._steps(act, work, m)])
                    cur = tuple(work)
                    break
            path, i = hit
            t = len(path.sel)
            if 0 <= path.loop <= i:
                period = t - path.loop
                pos = path.loop + (i - path.loop + np.arange(m + 1)) % period
                pieces.append(path.sel[pos[:-1]])
                cur = path.cur[int(pos[-1])]
                break
            n = min(m, t - i)
            pieces.append(path.sel[i : i + n])
            cur = path.cur[i + n]
            m -= n
        if not pieces:
            return np.empty(0, dtype=np.int64), cur
        sel = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return sel, cur
