"""The processes runner: spawn workers, shared-memory handles, crashes named, no leaks."""

from __future__ import annotations

import os
import time

import pytest

from conftest import make_pipeline
from zephon_server.engine import shm
from zephon_server.engine.errors import ContractError, WorkerError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.ops.accumulators import CountingAccumulator
from zephon_server.engine.ops.base import Operator, OpTraits

pytestmark = pytest.mark.processes


class CrashOnce(Operator):
    """Kills its worker process when it meets a given cursor."""

    op_name = "crash_once"

    def process_many(self, elems):
        if any(e.meta.cursor == (2, 5) for e in elems):
            os._exit(3)
        return elems


def test_crashed_worker_fails_the_run_naming_operator_and_exit_code(corpus_specs):
    pipe = make_pipeline(corpus_specs).apply(CrashOnce()).batch(microbatch_size=4)
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        list(pipe.run(ExecutionConfig(runner="processes", workers=2)))
    assert time.monotonic() - start < 60
    message = str(info.value)
    assert "crash_once" in message
    assert "exit code 3" in message
    assert shm.live_blocks() == 0


class LengthCounter(Operator):
    """A custom stateful operator whose accumulator reads payload lengths."""

    op_name = "length_counter"

    def __init__(self, declare: bool, **kwargs):
        super().__init__(**kwargs)
        self.declare = declare

    def traits(self):
        return OpTraits(preserves_cursor_order=True, fusable=False)

    def accumulator(self, *, deterministic, ctx):
        declare = self.declare

        class Reading(CountingAccumulator):
            reads_payload = declare

            def push_many(self, elems):
                for e in elems:
                    if not e.meta.tombstone:
                        assert len(e.payload["input_ids"]) >= 0
                return super().push_many(elems)

        return Reading(8)

    def process_many(self, elems):
        return elems


def test_undeclared_payload_access_raises_a_clear_error(corpus_specs):
    pipe = make_pipeline(corpus_specs).apply(LengthCounter(False)).batch(microbatch_size=4)
    with pytest.raises(ContractError, match="reads_payload = True"):
        list(pipe.run(ExecutionConfig(runner="processes", workers=1)))


def test_declared_payload_access_gets_resolved_arrays_and_matches_inline(corpus_specs):
    def chains(ex):
        pipe = make_pipeline(corpus_specs).apply(LengthCounter(True)).batch(microbatch_size=4)
        return [(b.lane_id, b.seq, b.chain_digest) for b in pipe.run(ex).batches()]

    before = {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}
    assert chains(ExecutionConfig(runner="processes", workers=2)) == chains(
        ExecutionConfig(runner="inline")
    )
    assert shm.live_blocks() == 0
    # Only this run's blocks matter (other processes on the machine may own some).
    leftovers = {n for n in os.listdir("/dev/shm") if n.startswith("psm_")} - before
    assert leftovers == set()
