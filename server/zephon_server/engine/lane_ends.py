"""Where the lanes of a finite stream end: ``end_of_data: shortest | longest``.

A finite stream (every dataset ``exhaustion: stop``) ends its lanes at different seqs, so a
data-parallel rank would run out before the others and leave them hanging in a collective.
With ``shortest`` (the default) every lane ends at the seq where the shortest lane ended,
``E = min(natural end of each lane)``; the batches of a lane at seqs ``>= E`` are *cut*:
counted, never delivered, and the documents they close are closed by the lane's end instead
(reason ``end_of_data``), so every document is still closed exactly once. ``longest`` keeps
every lane to its own end.

The cut is a pure function of the per-lane streams, so it is the same whatever the runner,
the number of ranks or the resumes. It can only be known once the lanes are produced, which
is what :class:`LaneEnds`, the *frontier*, keeps track of:

* seq ``s`` may be delivered (on any lane) once **every** lane has produced ``s``, or is
  *promised* more than ``s`` batches (:meth:`LaneEnds.promise`, a sound lower bound of its
  batch count: :mod:`.lane_promises`): no lane can then end at or before ``s``;
* a reader at ``s`` has reached the end once some lane ended at ``n <= s`` and every lane has
  produced ``n`` or ended (the end ``E`` is then *final*);
* otherwise it waits, and :meth:`LaneEnds.lagging` names the lanes it waits for (the hub
  counts them as demand so that its producer never waits on a full lane while they lag).

A lane's end item (next seq ``E``, the chain after batch ``E - 1``, the documents the cut
closes plus the lane's own tail tombstones) is ready once ``E`` is final and the lane ended:
the cut batches must be produced to close their documents, which the hub does without
keeping them. Memory: per lane, the chains and metas of the batches not yet below the
frontier (the lanes' skew), nothing else.

Plain data, not thread-safe: the hub guards it with its lock; :func:`deliver` uses it from the
single thread iterating a run.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .numbered_batch import NumberedBatch
from .records import LaneEnd, SampleMeta

log = logging.getLogger(__name__)

SHORTEST = "shortest"
LONGEST = "longest"
#: The binding values of the top-level ``end_of_data`` key; the first is the default.
END_OF_DATA_POLICIES = (SHORTEST, LONGEST)
DEFAULT_END_OF_DATA = SHORTEST
#: Tombstone reason of a document closed by the cut (its rows were in cut batches).
CUT_REASON = "end_of_data"

#: :meth:`LaneEnds.status` answers.
DELIVER, WAIT, END = "deliver", "wait", "end"


def check_end_of_data(value: Any) -> str:
    """Validate the ``end_of_data`` setting (raises :class:`ConfigError` naming the key)."""
    if value not in END_OF_DATA_POLICIES:
        raise ConfigError(
            f"end_of_data: must be one of {list(END_OF_DATA_POLICIES)} (shortest: every lane "
            f"ends where the shortest lane ends, so every rank takes the same number of steps), "
            f"got {value!r}"
        )
    return str(value)


@dataclass(frozen=True)
class LaneEndItem:
    """A lane's end under ``shortest``: ``next_seq`` (the common end), the chain after the
    lane's last delivered batch, and the tombstones closing what the cut and the lane's tail
    dropped."""

    next_seq: int
    chain: bytes
    tombstones: tuple[SampleMeta, ...]


class _Lane:
    """One lane's part of the frontier (see :class:`LaneEnds`)."""

    __slots__ = ("base", "entries", "natural", "produced", "promised", "tail")

    def __init__(self, next_seq: int, chain: bytes) -> None:
        self.produced = next_seq
        self.promised = next_seq  # a lower bound of where the lane ends (>= produced once known)
        self.base = (next_seq, chain)  # (seq, chain before it): the oldest chain still known
        # (seq, chain after it, rows, tombstones) of the batches the cut may still concern
        self.entries: deque[tuple[int, bytes, tuple[SampleMeta, ...], tuple[SampleMeta, ...]]]
        self.entries = deque()
        self.natural: int | None = None  # where the lane ended by itself
        self.tail: tuple[SampleMeta, ...] = ()  # its own tombstones after its last batch


class LaneEnds:
    """The frontier of a set of lanes under an ``end_of_data`` policy (module docstring).

    ``starts``: lane -> (next seq the run starts the lane at, chain before it).
    """

    def __init__(self, policy: str, starts: Mapping[int, tuple[int, bytes]]) -> None:
        self.policy = check_end_of_data(policy)
        if not starts:
            raise ConfigError("end_of_data: a frontier needs at least one lane")
        self._lanes = {lane: _Lane(seq, chain) for lane, (seq, chain) in sorted(starts.items())}
        self._starts = {lane: seq for lane, (seq, _) in starts.items()}
        self._announced = False

    def _announce(self, end: int) -> None:
        """Say once where the lanes end, and loudly when that is before any batch."""
        if self._announced:
            return
        self._announced = True
        natural = {lane: st.natural for lane, st in self._lanes.items() if st.natural is not None}
        first = min(natural, key=lambda lane: natural[lane])
        if end <= min(self._starts.values()):
            log.warning(
                "end_of_data: shortest: lane %d ended at seq %d, so no lane delivers anything "
                "more (a corpus too small for its lanes: fewer chunks than lanes? or every "
                "record skipped: see the skipped records counted by reason); use "
                "end_of_data: longest, a smaller chunk_size or fewer lanes",
                first,
                end,
            )
        else:
            log.info("end_of_data: shortest: every lane ends at seq %d (lane %d)", end, first)

    @property
    def cutting(self) -> bool:
        """Whether lanes end together (``shortest``)."""
        return self.policy == SHORTEST

    # -- what the producer reports -----------------------------------------------------------

    def add(self, batch: NumberedBatch) -> bool:
        """Lane ``batch.lane_id`` produced ``batch`` (numbered); False when it is past the
        final end (cut: count it, do not deliver it)."""
        st = self._lanes[batch.lane_id]
        st.produced = batch.seq + 1
        if not self.cutting:
            return True
        # Only rows that close a document matter to the end (a huge document's rows but its
        # last close nothing): what a cut tail costs stays small.
        closing = tuple(meta for meta in batch.rows if meta.closes)
        st.entries.append((batch.seq, batch.chain_digest, closing, batch.tombstones))
        self._prune()
        end = self.end
        return end is None or batch.seq < end

    def finish(self, lane: int, next_seq: int, tombstones: Iterable[SampleMeta]) -> None:
        """``lane`` ended by itself at ``next_seq``, with ``tombstones`` after its last batch."""
        st = self._lanes[lane]
        if next_seq < st.promised:  # readers may have been given batches past this end
            raise RuntimeError(
                f"end_of_data: lane {lane} ended at seq {next_seq} but was promised "
                f"{st.promised} batches (lane_promises counted records that did not all reach "
                "a batch): a bug, please report it; end_of_data: longest avoids the promise"
            )
        st.produced = next_seq
        st.natural = next_seq
        st.tail = tuple(tombstones)

    def promise(self, lane: int, batches: int) -> None:
        """``lane`` will produce batches up to seq ``batches`` (exclusive) at least: a lower
        bound of its end from :class:`.lane_promises.LanePromises`."""
        st = self._lanes[lane]
        if batches > st.promised:
            st.promised = batches

    def promises(self) -> dict[int, int]:
        """Lane -> the batch count promised to it so far (0: nothing promised yet)."""
        return {lane: st.promised for lane, st in self._lanes.items()}

    # -- the frontier ------------------------------------------------------------------------

    @property
    def frontier(self) -> int:
        """Every seq below it is produced, or promised, on every lane (ended lanes count
        their end): no lane ends before it."""
        return min(max(st.produced, st.promised) for st in self._lanes.values())

    @property
    def bound(self) -> int | None:
        """The smallest natural end seen so far (the common end is at most this), or None."""
        ends = [st.natural for st in self._lanes.values() if st.natural is not None]
        return min(ends) if ends else None

    @property
    def end(self) -> int | None:
        """The common end once it is final (``shortest``), else None."""
        bound = self.bound
        if not self.cutting or bound is None:
            return None
        if all(st.natural is not None or st.produced >= bound for st in self._lanes.values()):
            return bound
        return None

    def status(self, seq: int) -> str:
        """For a reader at ``seq`` (any lane): DELIVER its batch, END the lane, or WAIT."""
        if not self.cutting:
            return DELIVER
        bound = self.bound
        if bound is None or seq < bound:
            if self.frontier > seq:
                return DELIVER
            return WAIT
        return END if self.end is not None else WAIT

    def lagging(self, seq: int) -> list[int]:
        """The lanes a reader at ``seq`` waits for: not ended, and not yet past ``seq``
        (produced or promised); at or past the smallest natural end, the lanes that have not
        produced up to it, which makes the end final (a promise does not: the end item needs
        the batches themselves)."""
        bound = self.bound
        lanes = [(lane, st) for lane, st in self._lanes.items() if st.natural is None]
        if bound is not None and seq >= bound:
            return [lane for lane, st in lanes if st.produced < bound]
        return [lane for lane, st in lanes if max(st.produced, st.promised) <= seq]

    def _prune(self) -> None:
        """Forget what no end can need: the batches below ``frontier - 1`` (the end is at
        least the frontier, promises included; its chain is the one after batch
        ``end - 1``)."""
        keep_from = self.frontier - 1
        for st in self._lanes.values():
            entries = st.entries
            while entries and entries[0][0] < keep_from:
                seq, chain, _, _ = entries.popleft()
                st.base = (seq + 1, chain)

    # -- ends ----------------------------------------------------------------------------------

    def end_of(self, lane: int) -> LaneEndItem | None:
        """``lane``'s end item once the end is final and the lane ended (its cut batches are
        all produced); None before."""
        end = self.end
        st = self._lanes[lane]
        start = self._starts[lane]
        if (
            end is not None and start > end
        ):  # resumed past the common end (a checkpoint of a ``longest`` run)
            log.warning(
                "lane %d: resumed at seq %d, past the common end %d of end_of_data: shortest "
                "(the checkpoint comes from a run that ended lanes later); the lane ends at "
                "its resume position",
                lane,
                start,
                end,
            )
            return LaneEndItem(start, self._lanes[lane].base[1], ())
        if end is None or st.natural is None:
            return None
        self._announce(end)
        closes: list[SampleMeta] = []
        chain = st.base[1] if st.base[0] == end else None
        for seq, after, rows, tombstones in st.entries:
            if seq == end - 1:
                chain = after
            if seq >= end:
                closes.extend(meta.as_tombstone(CUT_REASON) for meta in rows)
                closes.extend(tombstones)
        assert chain is not None, f"lane {lane}: chain at seq {end} was pruned"
        return LaneEndItem(end, chain, (*closes, *st.tail))

    def cut(self) -> dict[int, int]:
        """Lane -> batches produced at or past the final end (so far; all 0 before the end
        is final). Only what this run produced: a resumed run counts from its positions."""
        end = self.end
        return {
            lane: 0 if end is None else max(0, st.produced - max(end, self._starts[lane]))
            for lane, st in self._lanes.items()
        }

    def stats(self) -> dict[str, Any]:
        """The policy, the common end (None until final), the batches cut per lane and the
        batches each lane produced (absolute seq, cut ones included)."""
        produced = {lane: st.produced for lane, st in self._lanes.items()}
        return {"policy": self.policy, "end": self.end, "cut": self.cut(), "produced": produced}


def deliver(
    items: Iterable[NumberedBatch | LaneEnd], ends: LaneEnds, logs: Mapping[int, Any]
) -> Iterator[NumberedBatch | LaneEnd]:
    """A run's items with the end applied, for consumers in the run's process (``PipelineRun``
    iteration, ``zephon dump``): batches are held until the frontier passes them, cut ones are
    dropped, and a lane's :class:`LaneEnd` comes once its end item is ready; the documents the
    cut closes are put before the lane's ``tail_tombstones`` in ``logs``.

    Holds, per lane, the batches produced beyond the slowest lane (the lanes' skew).
    """
    held: dict[int, deque[NumberedBatch]] = {lane: deque() for lane in logs}
    ended: list[int] = []  # lanes that ended by themselves, LaneEnd not given yet
    iterator = iter(items)
    try:
        for item in iterator:
            if type(item) is NumberedBatch:
                if ends.add(item):
                    held[item.lane_id].append(item)
            elif type(item) is LaneEnd:
                log_ = logs[item.lane_id]
                ends.finish(item.lane_id, log_.next_seq, log_.tail_tombstones)
                ended.append(item.lane_id)
            yield from _release(ends, held, ended, logs)
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()  # the run's own clean-up (its runners' threads) runs now


def _release(
    ends: LaneEnds,
    held: dict[int, deque[NumberedBatch]],
    ended: list[int],
    logs: Mapping[int, Any],
) -> Iterator[NumberedBatch | LaneEnd]:
    """What the frontier lets out now (see :func:`deliver`)."""
    for queue in held.values():
        while queue and ends.status(queue[0].seq) == DELIVER:
            yield queue.popleft()
    if ends.end is None:
        return
    for queue in held.values():
        queue.clear()  # past the end: cut (``ends.cut()`` counts them)
    for lane in list(ended):
        item = ends.end_of(lane)
        if item is None:
            continue
        ended.remove(lane)
        logs[lane].tail_tombstones[:] = list(item.tombstones)
        yield LaneEnd(lane)


def finite(pipeline: Any) -> bool:
    """Whether ``pipeline``'s lanes end: every dataset has ``exhaustion: stop`` (one that
    repeats keeps every lane going forever, and there is no end to agree on)."""
    return all(spec.exhaustion == "stop" for spec in pipeline.datasets)


def describe(pipeline: Any) -> str:
    """One line for ``zephon explain``: the pipeline's ``end_of_data`` and what it does here."""
    policy = pipeline.end_of_data
    if not finite(pipeline):
        meaning = "not applied: a dataset repeats, so the lanes never end"
    elif policy == SHORTEST:
        meaning = (
            "every lane ends at the seq where the shortest lane ends, so every data-parallel "
            "rank takes the same number of steps; the longer lanes' later batches are cut"
        )
    else:
        meaning = "each lane runs to its own end; ranks may take different numbers of steps"
    return f"end_of_data: {policy} ({meaning})"


def applies(pipeline: Any, lanes: Sequence[int]) -> bool:
    """Whether a consumer of ``lanes`` of ``pipeline`` applies the common end: ``shortest``,
    a finite stream, and every lane (a subset cannot know the others' ends)."""
    return (
        pipeline.end_of_data == SHORTEST
        and sorted(lanes) == list(range(pipeline.lanes))
        and finite(pipeline)
    )


def check_served(pipeline: Any, lanes: Sequence[int] | None) -> None:
    """Refuse a server of some lanes (``--lanes``) of a finite ``shortest`` stream: the common
    end needs every lane's length, which a lane-sharded server never sees, so its ranks would
    end at different seqs (:class:`ConfigError` naming both fixes)."""
    if pipeline.end_of_data != SHORTEST or not finite(pipeline) or lanes is None:
        return
    if any(not 0 <= lane < pipeline.lanes for lane in lanes):
        return  # a lane that does not exist: the hub names it, the first thing to fix
    if sorted(set(lanes)) == list(range(pipeline.lanes)):
        return
    raise ConfigError(
        f"end_of_data: shortest needs every lane in one server (the common end is the "
        f"shortest of all {pipeline.lanes} lanes), but this server serves lanes {sorted(lanes)} of "
        "a finite stream (every dataset has exhaustion: stop); serve all lanes (drop "
        "--lanes), or set end_of_data: longest (each lane ends at its own end)"
    )
