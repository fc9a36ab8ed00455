"""Faults: SIGKILL of the server at random points, SIGKILL during a checkpoint write, network
faults through a TCP fault proxy, a killed worker process, SIGTERM drain.

Every scenario checks the trainer's ledger against an uninterrupted in-process reference run:
each (lane, seq) delivered exactly once, per-lane chain digests equal ``zephon dump``'s, and
every document of the finite corpus closed exactly once (``batch.closed``). The scenario
functions return their figures so ``tools/reliability_report.py`` can reuse them.

``ZEPHON_RELIABILITY_TIER=long`` runs more kill points and a larger corpus.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.scenarios.faults import (
    KillPoint,
    assert_exact_counts,
    exact_config,
    kill_writer,
    reference_run,
    run_drain_scenario,
    run_kill_scenario,
    run_network_scenario,
    run_worker_kill_scenario,
)
from zephon_testing.servers import ServerProcess, dump_digests

TIER = os.environ.get("ZEPHON_RELIABILITY_TIER", "ci")
LONG = TIER == "long"
KILL_EXAMPLES = 25 if LONG else 5
MAX_KILLS = 5 if LONG else 2


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fault_setup(tmp_path_factory, corpus_dir):
    """The exact-ledger config (a larger corpus in the long tier), its reference and dump."""
    work = tmp_path_factory.mktemp("faults")
    corpus = corpus_dir
    if LONG:
        from zephon_server.engine.corpus import write_sample_corpus

        corpus = work / "corpus"
        write_sample_corpus(corpus, docs_per_dataset=600, seed=11)
    cfg = exact_config(work / "pipeline.yaml", corpus)
    ref = reference_run(cfg)
    ref.check_covers_corpus()
    dumped = dump_digests(cfg, 100_000)
    assert dumped == ref.chains  # the reference is what `zephon dump` prints
    return cfg, ref, work


# --------------------------------------------------------------------------------------------
# SIGKILL of the server at random points, restart with --resume latest
# --------------------------------------------------------------------------------------------


def kill_points(total: int):
    point = st.builds(
        KillPoint,
        after_batches=st.integers(1, total - 1),
        delay_ms=st.integers(0, 40),
        during_checkpoint=st.booleans(),
    )
    return st.lists(point, min_size=1, max_size=MAX_KILLS, unique_by=lambda p: p.after_batches)


@pytest.mark.service
@pytest.mark.timeout(600 if LONG else 150)
def test_sigkill_at_random_points_then_resume_latest_is_exact(fault_setup, tmp_path_factory):
    cfg, ref, _ = fault_setup
    survived = []

    @settings(
        max_examples=KILL_EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: each example starts servers
        suppress_health_check=list(HealthCheck),
    )
    @given(kills=kill_points(ref.batches))
    def scenario(kills):
        work = tmp_path_factory.mktemp("kill")
        figures = run_kill_scenario(cfg, ref, work, kills)
        assert figures["kills"] == len(kills)
        assert_exact_counts(figures)
        survived.append(figures)

    scenario()
    assert sum(f["kills"] for f in survived) >= KILL_EXAMPLES


@pytest.mark.service
@pytest.mark.timeout(120)
def test_checkpoint_right_after_a_restart_waits_for_production(fault_setup, tmp_path):
    """A trainer's positions are usually ahead of the checkpoint a restarted server resumed
    from; a Checkpoint at those positions must wait for the new run to regenerate them, not
    fail with "not produced yet" (the processes runner makes the first batches slow)."""
    from zephon_testing.servers import read_lane

    cfg, ref, _ = fault_setup
    state = tmp_path / "state"
    base = ["--config", str(cfg), "--state-dir", str(state)]
    srv = ServerProcess(base, tmp_path)
    try:
        stub = srv.stub()
        for lane in range(4):
            read_lane(stub, lane, 0, 3)
        stub.Checkpoint(
            pb.CheckpointRequest(positions=[pb.LanePosition(lane=x, next_seq=3) for x in range(4)]),
            timeout=30,
        )
    finally:
        assert srv.terminate() == 0
    srv = ServerProcess([*base, "--resume", "latest", "--runner", "processes"], tmp_path)
    try:
        reply = srv.stub().Checkpoint(
            pb.CheckpointRequest(
                positions=[pb.LanePosition(lane=x, next_seq=9) for x in range(4)], tag="ahead"
            ),
            timeout=60,
        )
        assert {p.lane: p.next_seq for p in reply.positions} == dict.fromkeys(range(4), 9)
    finally:
        assert srv.terminate() == 0
    srv = ServerProcess([*base, "--resume", reply.checkpoint_id], tmp_path)
    try:
        for lane in range(4):
            rest, _ = read_lane(srv.stub(), lane, 9)
            assert [b.chain_digest.hex() for b in rest] == ref.chains[lane][9:]
    finally:
        assert srv.terminate() == 0


# --------------------------------------------------------------------------------------------
# SIGKILL during a checkpoint write
# --------------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["overwrite", "save"])
@pytest.mark.parametrize("stage", ["data-fsync", "rename", "dir-fsync"])
def test_sigkill_inside_write_atomic_leaves_old_or_new(tmp_path, mode, stage):
    figures = kill_writer(tmp_path, mode, 0.0, stage)
    if stage == "dir-fsync":  # the rename happened: the new checkpoint is there, complete
        assert figures["latest"] == "new-and-longer" and figures["stray_temp_files"] == 0
    else:  # killed before the rename: the old one is intact, the temp file was cleaned
        assert figures["latest"] == "old" and figures["stray_temp_files"] == 1


@pytest.mark.timeout(180)
def test_sigkill_at_random_times_during_checkpoint_writes(tmp_path):
    outcomes: Counter = Counter()

    @settings(
        max_examples=25 if LONG else 8,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(mode=st.sampled_from(["overwrite", "save"]), delay_ms=st.integers(0, 300))
    def scenario(mode, delay_ms):
        figures = kill_writer(tmp_path, mode, delay_ms / 1000)
        outcomes[(mode, figures["latest"], figures["stray_temp_files"] > 0)] += 1

    scenario()
    assert sum(outcomes.values()) >= (25 if LONG else 8)


# --------------------------------------------------------------------------------------------
# Network faults through the TCP fault proxy
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "fault", ["latency", "bandwidth", "reset", "blackhole", "blackhole-default-keepalive"]
)
def test_network_faults_reconnect_and_continue_exactly(fault_setup, tmp_path, fault):
    """Latency, throttling, resets and black holes; the last one with the client's shipped
    keepalive options (10 s ping, 5 s ping timeout) rather than the test's fast ones."""
    cfg, ref, _ = fault_setup
    figures = run_network_scenario(cfg, ref, tmp_path, fault)
    assert_exact_counts(figures)
    assert figures["batches"] == ref.batches
    if fault == "reset":
        assert figures["resets"] >= 1 and figures["connections"] >= 2, figures
    if fault.startswith("blackhole"):
        # Keepalive found the dead peer; a new connection continued.
        limit = 5 if fault == "blackhole" else 20
        assert figures["connections"] >= 2, figures
        assert figures["detect_s"] and figures["detect_s"][0] < limit, figures


# --------------------------------------------------------------------------------------------
# A killed worker process of the processes runner
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.processes
@pytest.mark.timeout(150)
@pytest.mark.parametrize("recovery", ["restart", "resume"])
def test_killed_worker_fails_streams_clearly_then_resume_is_exact(fault_setup, tmp_path, recovery):
    cfg, ref, _ = fault_setup
    figures = run_worker_kill_scenario(cfg, ref, tmp_path, recovery)
    assert figures["health_recovered"] == "SERVING", figures
    assert figures["status"] == "INTERNAL", figures
    message = figures["message"]
    assert "pipeline failed" in message and "worker process died" in message, message
    assert f"pid {figures['victim']} exit code -9" in message, message
    assert "Traceback" not in message
    assert figures["fail_s"] < 10, figures
    assert figures["health_after"] == "NOT_SERVING", figures
    assert_exact_counts(figures)
    assert figures["batches"] >= ref.batches


# --------------------------------------------------------------------------------------------
# SIGTERM drain
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.timeout(60)
def test_sigterm_drains_not_serving_at_once_streams_end_cleanly_exit_zero(fault_setup, tmp_path):
    cfg, _, _ = fault_setup
    grace = 5.0
    figures = run_drain_scenario(cfg, tmp_path, grace)
    assert figures["exit_code"] == 0, figures["log"][-3000:]
    assert figures["exit_s"] < grace + 2, figures
    assert figures["not_serving_s"] is not None and figures["not_serving_s"] < 1.0, figures
    assert len(figures["streams"]) == 4, figures
    for lane, (code, details, at, got) in figures["streams"].items():
        assert code == "UNAVAILABLE" and "draining" in details, (lane, code, details)
        assert at < grace + 1 and got >= 2, (lane, at, got)
