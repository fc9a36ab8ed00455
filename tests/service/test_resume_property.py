"""Successive resumes equal the uninterrupted stream: a slow hermetic property test (over a
second of CPU, so not in the unit tier; see tests/README.md)."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.unit.test_resume_property import build, consume, segment
from zephon_server.engine.checkpoint import ResumeState
from zephon_server.engine.execution import ExecutionConfig


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunk_size=st.integers(2, 9),
    k=st.integers(1, 3),
    lanes=st.integers(1, 3),
    algorithm=st.sampled_from(["streaming", "block", "block_warmup"]),
    segments=st.lists(segment, min_size=1, max_size=3),
)
@example(chunk_size=5, k=1, lanes=2, algorithm="block", segments=[(1, "threads", 2)])
@example(
    chunk_size=2,
    k=3,
    lanes=1,
    algorithm="streaming",
    segments=[(0, "inline", 1), (3, "threads", 3)],
)
def test_successive_resumes_equal_the_uninterrupted_stream(
    chunk_size, k, lanes, algorithm, segments
):
    pipe = build(chunk_size, k, lanes, algorithm)
    want = consume(pipe.run(ExecutionConfig(runner="inline")), None)
    got: dict[int, list] = {lane: [] for lane in range(lanes)}
    state = None
    for take, runner, workers in segments:
        run = pipe.run(ExecutionConfig(runner=runner, workers=workers), resume=state)
        part = consume(run, take)
        for lane, chains in part.items():
            got[lane].extend(chains)
        state = ResumeState.decode(
            run.checkpoint(
                {lane: run.logs[lane].start.next_seq + len(part[lane]) for lane in run.lanes}
            ).encode()
        )
        run.close()
    rest = consume(pipe.run(ExecutionConfig(runner="threads", workers=2), resume=state), None)
    for lane, chains in rest.items():
        got[lane].extend(chains)
    assert got == want
