"""A task that cannot be handed to a pool fails the run in its turn instead of stalling it.

The reorder buffer hands results on in order of the places reserved for them; an item whose
submission raised used to leave its place empty and put its error at a later place, which the
collector never reached: the run waited for ever, silently (a spawned worker pool that cannot
start its processes did exactly this).
"""

from __future__ import annotations

import threading

import pytest

from tests.support.builders import make_pipeline
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.runners.threads import ThreadsRunner


class PoolWontStart(RuntimeError):
    pass


def run_in_thread(pipe, execution, seconds=60):
    """The run's outcome (an exception, or the number of batches), or None while it runs."""
    outcome: list[object] = []

    def consume():
        try:
            outcome.append(sum(1 for _ in pipe.run(execution).batches()))
        except BaseException as exc:  # the outcome under test
            outcome.append(exc)

    worker = threading.Thread(target=consume, daemon=True)
    worker.start()
    worker.join(seconds)
    return outcome[0] if outcome else None


@pytest.mark.parametrize("failing_call", [1, 3])
def test_a_submission_that_raises_fails_the_run_with_its_error(
    corpus_specs, monkeypatch, failing_call
):
    calls = []
    submit = ThreadsRunner.submit

    def flaky_submit(self, task):
        calls.append(task)
        if len(calls) == failing_call:
            raise PoolWontStart("cannot start the workers")
        return submit(self, task)

    monkeypatch.setattr(ThreadsRunner, "submit", flaky_submit)
    pipe = make_pipeline(corpus_specs).batch(microbatch_size=4)
    outcome = run_in_thread(pipe, ExecutionConfig(runner="threads", workers=2))
    assert isinstance(outcome, PoolWontStart), f"the run did not fail with the error: {outcome!r}"


def test_without_the_failure_the_same_run_ends(corpus_specs):
    pipe = make_pipeline(corpus_specs).batch(microbatch_size=4)
    outcome = run_in_thread(pipe, ExecutionConfig(runner="threads", workers=2))
    assert isinstance(outcome, int) and outcome > 0
