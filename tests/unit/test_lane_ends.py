"""end_of_data (issue 22, section 4): the lanes' frontier and the in-process cut.

With ``shortest`` every lane of a finite stream ends where the shortest lane ends; the longer
lanes' last batches are cut (counted, their documents closed by the lane's end). These tests
pin the frontier's rules on synthetic batches, then check real runs: the cut streams are the
prefixes of the ``longest`` streams, every document is still closed once, resumes at any
position give the same ends, and the default leaves the fingerprint alone.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import replace

import pytest

from tests.support.builders import make_pipeline
from zephon_server.engine.checkpoint import CheckpointError
from zephon_server.engine.config import parse_config
from zephon_server.engine.errors import ConfigError
from zephon_server.engine.execution import ExecutionConfig
from zephon_server.engine.lane_ends import (
    CUT_REASON,
    DELIVER,
    END,
    WAIT,
    LaneEnds,
    applies,
    check_served,
)
from zephon_server.engine.numbered_batch import NumberedBatch
from zephon_server.engine.pipeline import Pipeline, fingerprint_document
from zephon_server.engine.records import DocRef, LaneEnd, SampleBatch, SampleMeta

ZERO = bytes(32)


def batch(lane: int, seq: int, doc_row: int | None = None) -> NumberedBatch:
    """A numbered batch of one row closing document ``doc_row`` (chain = lane, seq)."""
    closes = () if doc_row is None else (DocRef(0, 0, doc_row),)
    b = SampleBatch(lane, {}, (SampleMeta(lane, (seq, 0), 0, None, closes),))
    numbered = NumberedBatch.number(b, seq, bytes(32))
    return dataclasses.replace(numbered, chain_digest=bytes([lane, seq]) * 16)


def frontier(lanes: int = 3) -> LaneEnds:
    return LaneEnds("shortest", {lane: (0, ZERO) for lane in range(lanes)})


def test_a_seq_goes_out_once_every_lane_has_produced_it():
    ends = frontier()
    for seq in range(3):
        ends.add(batch(0, seq))
    ends.add(batch(1, 0))
    assert ends.status(0) == WAIT and ends.lagging(0) == [2]
    ends.add(batch(2, 0))
    assert ends.status(0) == DELIVER and ends.status(1) == WAIT
    assert ends.lagging(1) == [1, 2]


def test_the_end_is_final_once_every_lane_reached_the_shortest_end():
    ends = frontier()
    for seq in range(4):
        ends.add(batch(0, seq, doc_row=seq))
    ends.add(batch(1, 0))
    ends.add(batch(1, 1))
    ends.finish(1, 2, [SampleMeta(1, (9, 0), 0, None, (DocRef(0, 1, 7),), tombstone="empty")])
    ends.add(batch(2, 0))
    # Lane 1 ended at 2: lane 2 could still end at 1, so a reader at 1 waits for lane 2.
    assert ends.bound == 2 and ends.end is None
    assert ends.status(1) == WAIT and ends.lagging(1) == [2]
    assert ends.status(2) == WAIT and ends.lagging(5) == [2]  # only what makes the end final
    ends.add(batch(2, 1))
    assert ends.end == 2 and ends.status(1) == DELIVER and ends.status(2) == END
    assert ends.add(batch(2, 2)) is False  # past the final end: cut
    # Lane 0's end needs its cut batches (seqs 2, 3) produced and the lane ended.
    assert ends.end_of(0) is None
    ends.finish(0, 4, [])
    item = ends.end_of(0)
    assert item is not None and item.next_seq == 2 and item.chain == bytes([0, 1]) * 16
    assert [m.closes for m in item.tombstones] == [(DocRef(0, 0, 2),), (DocRef(0, 0, 3),)]
    assert {m.tombstone for m in item.tombstones} == {CUT_REASON}
    # The shortest lane keeps its own tail tombstones.
    item1 = ends.end_of(1)
    assert item1 is not None and item1.next_seq == 2 and item1.chain == bytes([1, 1]) * 16
    assert [m.tombstone for m in item1.tombstones] == ["empty"]
    assert ends.cut() == {0: 2, 1: 0, 2: 1}


def test_longest_never_gates():
    ends = LaneEnds("longest", {0: (0, ZERO), 1: (0, ZERO)})
    ends.add(batch(0, 5))
    ends.finish(1, 0, [])
    assert ends.status(5) == DELIVER and ends.end is None and ends.cut() == {0: 0, 1: 0}


def test_a_lane_without_batches_ends_every_lane_at_its_start():
    ends = LaneEnds("shortest", {0: (3, b"c" * 32), 1: (3, b"d" * 32)})
    ends.finish(0, 3, [])
    ends.add(batch(1, 3))
    assert ends.end == 3 and ends.status(3) == END
    item = ends.end_of(0)
    assert item is not None and item.next_seq == 3 and item.chain == b"c" * 32


def test_the_setting_is_validated_and_read_from_yaml(corpus_dir, corpus_specs):
    with pytest.raises(ConfigError, match=r"end_of_data: must be one of \['shortest', 'longest'\]"):
        Pipeline(corpus_specs, end_of_data="shorter")
    config = {
        "end_of_data": "longest",
        "datasets": [{"name": "web", "path": str(corpus_dir / "web"), "weight": 1.0}],
        "pipeline": [{"tokenize": {}}, {"batch": {"microbatch_size": 2}}],
    }
    pipeline, _ = parse_config(config)
    assert pipeline.end_of_data == "longest"
    config["end_of_data"] = "sometimes"
    with pytest.raises(ConfigError, match="end_of_data"):
        parse_config(config)


def test_only_longest_enters_the_fingerprint(corpus_specs):
    def doc(**kwargs):
        pipe = Pipeline(corpus_specs, lanes=4, **kwargs).tokenize().batch(microbatch_size=4)
        plan = pipe.plan()
        return fingerprint_document(pipe, plan.datasets), plan.fingerprint

    default, fp_default = doc()
    longest, fp_longest = doc(end_of_data="longest")
    assert "end_of_data" not in default  # existing pipelines keep their fingerprint
    assert longest["end_of_data"] == "longest" and fp_longest != fp_default


def test_the_cut_needs_every_lane_and_a_finite_stream(corpus_specs, tmp_path):
    pipe = make_pipeline(corpus_specs, lanes=4)
    assert applies(pipe, range(4)) and not applies(pipe, [0, 1])
    with pytest.raises(ConfigError, match=r"serve all lanes \(drop --lanes\), or set end_of_data"):
        check_served(pipe, [0, 1])
    check_served(pipe, None)
    check_served(pipe, [3, 2, 1, 0])
    check_served(pipe, [0, 9])  # a lane that does not exist is the hub's to name
    endless = Pipeline([replace(s, exhaustion="repeat") for s in corpus_specs], lanes=4)
    assert not applies(endless, range(4))
    check_served(endless, [0, 1])


def test_explain_prints_the_setting_and_what_it_means(corpus_specs):
    def explain(specs, **kwargs):
        pipe = Pipeline(specs, lanes=4, **kwargs).tokenize().batch(microbatch_size=4)
        lines = pipe.explain().splitlines()
        assert lines[1].startswith("execution: ")  # the setting follows the execution line
        return lines[2]

    assert explain(corpus_specs) == (
        "end_of_data: shortest (every lane ends at the seq where the shortest lane ends, so "
        "every data-parallel rank takes the same number of steps; the longer lanes' later "
        "batches are cut)"
    )
    assert explain(corpus_specs, end_of_data="longest") == (
        "end_of_data: longest (each lane runs to its own end; ranks may take different "
        "numbers of steps)"
    )
    endless = [replace(s, exhaustion="repeat") for s in corpus_specs]
    assert explain(endless) == (
        "end_of_data: shortest (not applied: a dataset repeats, so the lanes never end)"
    )


# -- real runs --------------------------------------------------------------------------------


def lanes_of(run) -> tuple[dict[int, list[bytes]], Counter, list[int]]:
    """Per-lane chain digests, documents closed (rows, tombstones, lane ends), lane ends."""
    chains: dict[int, list[bytes]] = {lane: [] for lane in run.lanes}
    closed: Counter = Counter()
    ended = []
    for item in run:
        if isinstance(item, NumberedBatch):
            assert item.seq == run.logs[item.lane_id].start.next_seq + len(chains[item.lane_id])
            chains[item.lane_id].append(item.chain_digest)
            closed.update(item.closes())
        elif isinstance(item, LaneEnd):
            assert item.lane_id not in ended
            ended.append(item.lane_id)
    for log in run.logs.values():
        for meta in log.tail_tombstones:
            closed.update(meta.closes)
    return chains, closed, ended


def stateful(specs, end_of_data: str) -> Pipeline:
    pipe = Pipeline(
        specs, seed=5, lanes=4, chunk_size=16, flush_every_k_chunks=2, end_of_data=end_of_data
    )
    pipe.decode_text().tokenize(tokenizer="byte").pack_flat(max_length=96)
    return pipe.shuffle(buffer_size=8).batch(microbatch_size=3)


@pytest.fixture(scope="module")
def both(corpus_specs):
    """Inline runs of the same pipeline with ``longest`` and ``shortest``."""
    out = {}
    for policy in ("longest", "shortest"):
        run = stateful(corpus_specs, policy).run(ExecutionConfig(runner="inline"))
        out[policy] = (*lanes_of(run), run.stats())
    return out


def test_shortest_ends_every_lane_at_the_shortest_lanes_end(both):
    longest, _, _, _ = both["longest"]
    shortest, _, ended, stats = both["shortest"]
    end = min(len(v) for v in longest.values())
    assert len({len(v) for v in longest.values()}) > 1  # the lanes really differ
    assert {lane: len(v) for lane, v in shortest.items()} == dict.fromkeys(longest, end)
    assert shortest == {lane: v[:end] for lane, v in longest.items()}  # prefixes, same digests
    assert sorted(ended) == [0, 1, 2, 3]
    cut = {lane: len(v) - end for lane, v in longest.items()}
    produced = {lane: len(v) for lane, v in longest.items()}  # cut batches included
    assert stats["end_of_data"] == {
        "policy": "shortest",
        "end": end,
        "cut": cut,
        "produced": produced,
    }


def test_every_document_is_still_closed_once(both, corpus_specs):
    _, closed_longest, _, _ = both["longest"]
    _, closed, _, _ = both["shortest"]
    assert set(closed.values()) == {1} and closed.keys() == closed_longest.keys()


@pytest.mark.parametrize("workers", [1, 3])
def test_runners_and_workers_give_the_same_cut(both, corpus_specs, workers):
    run = stateful(corpus_specs, "shortest").run(ExecutionConfig(runner="threads", workers=workers))
    chains, _, _ = lanes_of(run)
    assert chains == both["shortest"][0]


def test_a_resume_at_any_positions_ends_at_the_same_seq(both, corpus_specs):
    shortest = both["shortest"][0]
    end = len(shortest[0])
    pipe = stateful(corpus_specs, "shortest")
    run = pipe.run(ExecutionConfig(runner="inline"))
    list(run)
    for cut in ({0: 0, 1: 3, 2: end - 1, 3: end}, dict.fromkeys(range(4), end // 2)):
        resumed = pipe.run(ExecutionConfig(runner="threads", workers=2), resume=run.checkpoint(cut))
        chains, _, ended = lanes_of(resumed)
        assert sorted(ended) == [0, 1, 2, 3]
        assert chains == {lane: v[cut[lane] :] for lane, v in shortest.items()}
        assert resumed.stats()["end_of_data"]["end"] == end


def test_a_checkpoint_past_the_common_end_is_refused(both, corpus_specs):
    # The lane that produced furthest could be saved at a cut batch; resumed, it ended later
    # than the others.
    longest = both["longest"][0]
    end = len(both["shortest"][0][0])
    lane = max(longest, key=lambda n: len(longest[n]))
    run = stateful(corpus_specs, "shortest").run(ExecutionConfig(runner="inline"))
    list(run)
    with pytest.raises(CheckpointError, match=rf"lane {lane}: position {end + 1} is past the "):
        run.checkpoint({lane: end + 1})
    assert run.checkpoint({lane: end}).lanes[lane].next_seq == end  # the end itself is fine


def test_a_lane_resumed_past_the_common_end_ends_where_it_is(caplog):
    caplog.set_level("WARNING", "zephon_server.engine.lane_ends")
    """A checkpoint of a run that ended lanes later (``longest``, or an older server)."""
    ends = LaneEnds("shortest", {0: (2, b"a" * 32), 1: (7, b"b" * 32)})
    ends.finish(0, 2, [])
    ends.add(batch(1, 7))
    assert ends.end == 2 and ends.status(7) == END
    item = ends.end_of(1)
    assert item is not None and (item.next_seq, item.chain) == (7, b"b" * 32)
    assert "past the common end 2" in caplog.text


def test_an_end_before_any_batch_is_said_loudly_and_once(caplog):
    # A corpus with fewer chunks than lanes: one lane ends at its start, so no lane delivers.
    ends = frontier(2)
    ends.add(batch(0, 0))
    ends.finish(1, 0, ())
    ends.finish(0, 1, ())
    with caplog.at_level("INFO", logger="zephon_server.engine.lane_ends"):
        assert ends.end_of(0) is not None and ends.end_of(1) is not None
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "end_of_data: longest" in warnings[0].getMessage()
