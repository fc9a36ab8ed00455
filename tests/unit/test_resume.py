"""Exact resume: restore at every step, stalls and cross-epoch batches, elastic ranks."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.builders import lane_chains
from zephon_server.engine.checkpoint import ResumeState
from zephon_server.engine.corpus import sample_corpus_specs, write_sample_corpus
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline

SHUFFLES = ["streaming", "block", "block_warmup"]


@pytest.fixture(scope="module")
def small_specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume-corpus")
    write_sample_corpus(root, docs_per_dataset=40, seed=3, mean_words=30)
    return sample_corpus_specs(root)


def stateful(
    specs, algorithm="streaming", *, lanes=2, chunk_size=8, k=2, batch=3, end_of_data="shortest"
):
    pipe = Pipeline(
        specs,
        seed=11,
        lanes=lanes,
        chunk_size=chunk_size,
        flush_every_k_chunks=k,
        end_of_data=end_of_data,
    )
    pipe.decode_text().tokenize(tokenizer="byte")
    pipe.ensure_mixture(buffer_size=16)
    pipe.pack_flat(max_length=96, algorithm="best_fit")
    pipe.shuffle(buffer_size=6, algorithm=algorithm, warmup_size=2)
    return pipe.batch(microbatch_size=batch)


per_lane = lane_chains


def cross_epoch(batch, k):
    return len({m.chunk_id // k for m in batch.rows}) > 1


def test_resume_after_stalled_sentinel_and_cross_epoch_batch(small_specs):
    # No stateful operators: 5 records per chunk, sentinel every chunk, batches of 3.
    pipe = Pipeline(small_specs, seed=2, lanes=2, chunk_size=5, flush_every_k_chunks=1)
    pipe.decode_text().tokenize().batch(microbatch_size=3)
    run = pipe.run(ExecutionConfig(runner="inline"))
    batches = [b for b in run if isinstance(b, NumberedBatch)]
    lane0 = [b for b in batches if b.lane_id == 0]
    cuts = [b.seq + 1 for b in lane0 if cross_epoch(b, 1)]
    assert cuts, "expected cross-epoch batches"
    for cut in [*cuts, cuts[0] - 1]:
        state = run.checkpoint({0: cut})
        assert state.lanes[0].boundary_chunk == lane0[cut - 1].rows[-1].chunk_id
        resumed = [
            b.chain_digest
            for b in pipe.run(ExecutionConfig(runner="threads"), resume=state).batches()
        ]
        assert resumed == [b.chain_digest for b in lane0[cut:]]
        assert resumed[0] != lane0[0].chain_digest


def test_replay_is_bounded_and_counted(small_specs):
    k = 2
    pipe = stateful(small_specs, k=k)
    run = pipe.run(ExecutionConfig(runner="inline"))
    lane0 = [b for b in run.batches() if b.lane_id == 0]
    cut = len(lane0) // 2
    state = run.checkpoint({0: cut})
    lane_state = state.lanes[0]
    assert lane_state.replay_cursor[0] - lane_state.boundary_chunk < k
    # Everything the filter may drop comes from the K chunks of the cut's epoch.
    epoch = range(lane_state.boundary_chunk, lane_state.boundary_chunk + k)
    bound = sum(1 for b in lane0 for m in (*b.rows, *b.tombstones) if m.chunk_id in epoch)
    resumed = pipe.run(ExecutionConfig(runner="inline"), lanes=[0], resume=state)
    list(resumed)
    replayed = resumed.stats()["replayed"]
    assert 0 < replayed <= bound


def lanes_for(rank, world, num_lanes):
    per = num_lanes // world
    return list(range(rank * per, (rank + 1) * per))


def test_elastic_4_to_2_to_8_ranks(small_specs):
    # Each rank runs its own lanes in-process; such a run cannot know the other lanes' ends, so
    # every lane runs to its own end (end_of_data across ranks: test_lane_ends_service.py).
    pipe = stateful(small_specs, lanes=8, chunk_size=4, k=2, batch=2, end_of_data="longest")
    full_run = pipe.run(ExecutionConfig(runner="inline"))
    full: dict[int, list] = {lane: [] for lane in range(8)}
    for b in full_run.batches():
        full[b.lane_id].append(b.chain_digest)
    assert all(len(v) >= 3 for v in full.values())

    got: dict[int, list] = {lane: [] for lane in range(8)}
    closed: Counter = Counter()
    state = None
    for world, take in ((4, 1), (2, 1), (8, None)):
        states = []
        for rank in range(world):
            lanes = lanes_for(rank, world, 8)
            run = pipe.run(ExecutionConfig(runner="threads", workers=2), lanes=lanes, resume=state)
            counts = dict.fromkeys(lanes, 0)
            for item in run:
                if not isinstance(item, NumberedBatch):
                    continue
                if take is not None and counts[item.lane_id] >= take:
                    continue  # not consumed: produced ahead of the trainer
                counts[item.lane_id] += 1
                got[item.lane_id].append(item.chain_digest)
                closed.update(item.closes())
                if take is not None and all(c >= take for c in counts.values()):
                    break
            if take is None:
                for log in run.logs.values():
                    for meta in log.tail_tombstones:
                        closed.update(meta.closes)
            states.append(
                run.checkpoint(
                    {lane: run.logs[lane].start.next_seq + counts[lane] for lane in lanes}
                )
            )
            run.close()
        state = ResumeState.merge(states)
    assert got == full
    assert set(closed.values()) == {1}
    assert len(closed) == sum(d.num_rows for d in full_run.plan.datasets)


def test_state_is_small_whatever_the_chunk_size(small_specs):
    sizes = []
    for chunk_size in (4, 64, 1024):
        # With chunks of 1024 every document is in lane 1's only chunk and lane 0 makes no
        # batch: end_of_data shortest would end both lanes at 0.
        pipe = stateful(small_specs, lanes=2, chunk_size=chunk_size, end_of_data="longest")
        run = pipe.run(ExecutionConfig(runner="inline"))
        per_lane(run, limit=1)
        state = run.checkpoint()
        assert any(st.replay_cursor for st in state.lanes.values())
        sizes.append(len(state.encode()) / len(state.lanes))
    assert max(sizes) <= 1024, sizes
