"""DataClient unit tests against a fake DataService served by a real ``grpc.server``
(:mod:`tests.support.fake_data_service`): order, rank mapping, state dicts, reconnects,
chain and pipeline checks, acks, closing, ``tail`` and the torch adapter.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time

import grpc
import numpy as np
import pytest

from tests.support.fake_data_service import (
    FINGERPRINT,
    LENGTH,
    WINDOW,
    FakeService,
    client,
    fake,
    ids,
    round_robin,
    row_text,
    serve,
    wait_for,
)
from zephon_client import (
    ChainMismatch,
    DataClient,
    PipelineMismatch,
    ZephonClientError,
    merge_state_dicts,
)
from zephon_client.options import checkpoint_positions
from zephon_client.stream import (
    ACK_INTERVAL,
    BATCHES_PER_MESSAGE,
)
from zephon_client.tail import byte_decode, tail

pytestmark = [pytest.mark.service, pytest.mark.timeout(20)]

# --------------------------------------------------------------------------------------------
# iteration order and mapping
# --------------------------------------------------------------------------------------------


def test_strict_round_robin_over_two_lanes_and_acks():
    lengths = {0: 20, 1: 18, 2: 3, 3: 3}  # longer than the window: needs acks to finish
    with fake(lengths) as (service, address), client(address, rank=0, world_size=2) as c:
        assert c.lanes == [0, 1]
        batches = list(c)
        assert ids(batches) == round_robin({0: 20, 1: 18})
        assert ids(batches)[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]
        assert c.positions == {0: 20, 1: 18}
        first = batches[0]
        expected = service.data[0][0]
        assert first.tensors["input_ids"].dtype == np.int32
        assert first.tensors["input_ids"].shape == (2, LENGTH)
        assert byte_decode(first.tensors["input_ids"][0][first.tensors["padding_mask"][0]]) == (
            row_text(0, 0, 0)
        )
        assert first.digest == expected.digest and first.chain_digest == expected.chain_digest
        assert first.rows[1][0].row == 1 and first.closed[0].shard == 0
        # the server ends the call after EndOfStream, so the last acks may arrive too late
        assert wait_for(lambda: service.acks.get((0, "rank0"), 0) >= 20 - WINDOW)
        assert wait_for(lambda: service.acks.get((1, "rank0"), 0) >= 18 - WINDOW)
        assert {(lane, start) for lane, start, _ in service.opens} == {(0, 0), (1, 0)}


def test_a_lane_that_ends_leaves_the_rotation():
    with fake({0: 1, 1: 4, 2: 0}) as (_, address), client(address) as c:
        assert ids(c) == [(0, 0), (1, 0), (1, 1), (1, 2), (1, 3)]
        assert c.positions == {0: 1, 1: 4, 2: 0}


@pytest.mark.parametrize(
    ("rank", "world", "dp", "interleaved", "lanes"),
    [
        (1, 2, None, False, [2, 3]),
        (1, 2, None, True, [1, 3]),
        (3, 4, 2, False, [2, 3]),
        (2, 4, 2, True, [1, 3]),
        (0, 1, None, False, [0, 1, 2, 3]),
    ],
)
def test_rank_to_lanes_mapping(rank, world, dp, interleaved, lanes):
    lengths = dict.fromkeys(range(4), 2)
    with (
        fake(lengths) as (service, address),
        client(
            address,
            rank=rank,
            world_size=world,
            data_parallel_size=dp,
            interleaved=interleaved,
        ) as c,
    ):
        assert c.lanes == lanes and c.num_lanes == 4 and c.fingerprint == FINGERPRINT
        assert ids(c) == round_robin({lane: 2 for lane in lanes})
        assert {consumer for _, _, consumer in service.opens} == {f"rank{rank}"}


def test_mapping_errors_are_value_errors():
    with fake(dict.fromkeys(range(4), 1)) as (_, address):
        with pytest.raises(ValueError, match="does not divide num_lanes=4"):
            client(address, rank=0, world_size=3)
        with pytest.raises(ValueError, match="rank must be in"):
            client(address, rank=2, world_size=2)


# --------------------------------------------------------------------------------------------
# state_dict and resuming
# --------------------------------------------------------------------------------------------


def take(iterator, n: int) -> list:
    return [next(iterator) for _ in range(n)]


def test_state_dict_round_trip_resumes_exactly():
    lengths = {0: 6, 1: 6}
    with fake(lengths) as (_, address):
        with client(address, consumer="reference") as ref:
            reference = ids(ref)
        with client(address) as a:
            it = iter(a)
            got = take(it, 3)
            # the third batch is yielded but not consumed until the next is asked for
            assert a.positions == {0: 1, 1: 1}
            unconsumed = json.loads(json.dumps(a.state_dict()))
            a.mark_consumed()
            state = a.state_dict()
            assert state["version"] == 1 and state["fingerprint"] == FINGERPRINT
            assert state["positions"] == {0: 2, 1: 1}
            assert state["chains"][0] == got[2].chain_digest.hex()
            saved = json.loads(json.dumps(state))  # string keys after JSON
        with client(address, consumer="b") as b:
            b.load_state_dict(saved)
            assert b.positions == {0: 2, 1: 1}
            assert ids(got) + ids(b) == reference
        with client(address, consumer="c") as c:
            c.load_state_dict(unconsumed)
            assert ids(got[:2]) + ids(c) == reference


def test_load_state_dict_checks_fingerprint_lanes_and_chain():
    with fake({0: 4, 1: 4}) as (_, address), client(address) as c:
        it = iter(c)
        take(it, 2)
        c.mark_consumed()
        state = c.state_dict()
        with pytest.raises(ZephonClientError, match="another pipeline") as info:
            c.load_state_dict({**state, "fingerprint": "0ther"})
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(ValueError, match=r"no position for lanes \[1\]"):
            c.load_state_dict({**state, "positions": {0: 1}})
        with pytest.raises(ValueError, match="version"):
            c.load_state_dict({**state, "version": 2})
        forged = {**state, "chains": {0: "ab" * 32, 1: state["chains"][1]}}
        with client(address, consumer="forged") as d:
            d.load_state_dict(forged)
            with pytest.raises(ChainMismatch) as mismatch:
                list(d)
            assert (mismatch.value.lane, mismatch.value.seq) == (0, 1)


def test_resume_with_a_different_number_of_ranks_from_merged_states():
    lengths = dict.fromkeys(range(4), 5)
    with fake(lengths) as (_, address):
        states, seen = [], []
        for rank in range(2):
            with client(address, rank=rank, world_size=2) as c:
                batches = take(iter(c), 3 + rank)
                c.mark_consumed()
                seen += ids(batches)
                states.append(c.state_dict())
        merged = merge_state_dicts(states)
        assert merged["positions"] == {0: 2, 1: 1, 2: 2, 3: 2}
        with client(address, consumer="solo") as solo:
            solo.load_state_dict(merged)
            rest = ids(solo)
        assert rest == round_robin(lengths, merged["positions"])
        assert rest[0] == (1, 1)  # the lagging lane comes first
        assert sorted(seen + rest) == sorted((lane, s) for lane in range(4) for s in range(5))
        with pytest.raises(ValueError, match="disagree"):
            merge_state_dicts([states[0], {**states[0], "positions": {0: 9, 1: 1}}])


def test_load_state_dict_mid_iteration_restarts_the_streams():
    with fake({0: 5, 1: 5}) as (service, address), client(address) as c:
        it = iter(c)
        take(it, 3)
        c.load_state_dict({"version": 1, "fingerprint": FINGERPRINT, "positions": {0: 4, 1: 0}})
        assert ids(it) == round_robin({0: 5, 1: 5}, {0: 4, 1: 0})
        assert (0, 4, "rank0") in service.opens


# --------------------------------------------------------------------------------------------
# reconnecting and verification
# --------------------------------------------------------------------------------------------


def test_unavailable_mid_stream_reconnects_without_loss_or_duplicates():
    lengths = {0: 7, 1: 7}
    with fake(lengths) as (service, address), client(address) as c:
        service.fail_after[0] = 3
        assert ids(c) == round_robin(lengths)
        assert [(lane, s) for lane, s, _ in service.opens if lane == 0] == [(0, 0), (0, 3)]


def test_server_restart_on_the_same_port_is_survived():
    lengths = {0: 6, 1: 6}
    service = FakeService(lengths)
    holder: dict[str, contextlib.ExitStack] = {}
    stack = contextlib.ExitStack()
    address = stack.enter_context(serve(service))
    port = int(address.rsplit(":", 1)[1])
    try:
        with client(address) as c:
            it = iter(c)
            got = take(it, 3)
            stack.close()  # the server goes away

            def restart() -> None:
                time.sleep(0.3)
                again = contextlib.ExitStack()
                again.enter_context(serve(FakeService(lengths), port))
                holder["server"] = again

            threading.Thread(target=restart, daemon=True).start()
            got += list(it)
            assert ids(got) == round_robin(lengths)
    finally:
        if "server" in holder:
            holder["server"].close()


@pytest.mark.parametrize("verify", [True, False])
def test_a_forked_stream_after_reconnect_raises_chain_mismatch(verify):
    """The first batch after a reconnection must continue the consumed chain, also without
    ``verify`` (one hash of two digests per call)."""
    with fake({0: 6, 1: 6}) as (service, address), client(address, verify=verify) as c:
        service.fail_after[0] = 2
        service.fork_on_fail = True
        got = []
        with pytest.raises(ChainMismatch) as info:
            for batch in c:
                got.append(batch)
        assert (info.value.lane, info.value.seq) == (0, 2)
        assert ids(got) == round_robin({0: 6, 1: 6})[:4]


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("change", ["fingerprint", "lanes"])
def test_a_server_restarted_with_another_pipeline_stops_the_client(verify, change):
    """The restarted server sends the very same batches (only its GetInfo differs), so only
    the check on reconnection can tell; the client must not go on with another pipeline.
    The lanes are longer than the fake's send window, so they cannot end before the swap."""
    lengths = {0: 3 * WINDOW, 1: 3 * WINDOW}
    swapped = (
        {"fingerprint": "5ca1ab1e"} if change == "fingerprint" else {"num_lanes": 4}
    )  # lanes 0 and 1 still served: only the lane count differs
    stack = contextlib.ExitStack()
    address = stack.enter_context(serve(FakeService(lengths)))
    port = int(address.rsplit(":", 1)[1])
    again = contextlib.ExitStack()
    try:
        with client(address, verify=verify) as c:
            it = iter(c)
            got = take(it, 3)
            stack.close()  # the server goes away; another pipeline comes up on its port
            again.enter_context(serve(FakeService(lengths, **swapped), port))
            with pytest.raises(PipelineMismatch) as info:
                got += list(it)
            assert ids(got) == round_robin(lengths)[: len(got)]
            err = info.value
            assert err.code == grpc.StatusCode.FAILED_PRECONDITION
            assert err.address == address
            assert (err.expected_fingerprint, err.expected_lanes) == (FINGERPRINT, 2)
            found = ("5ca1ab1e", 2) if change == "fingerprint" else (FINGERPRINT, 4)
            assert (err.found_fingerprint, err.found_lanes) == found
            assert "now serves another pipeline" in str(err)
            assert "Restart the trainer from a checkpoint" in str(err)
            with pytest.raises(PipelineMismatch):
                c.checkpoint()  # it would not resume this client's stream
    finally:
        again.close()


def test_a_wrong_chain_digest_raises_chain_mismatch_in_order():
    with fake({0: 5, 1: 5}) as (service, address):
        service.corrupt.add((1, 2))
        with client(address) as c:
            got = []
            with pytest.raises(ChainMismatch, match="lane 1 seq 2: chain digest"):
                for batch in c:
                    got.append(batch)
            assert ids(got) == round_robin({0: 5, 1: 5})[:5]
        with client(address, consumer="trusting", verify=False) as c:
            assert len(list(c)) == 10


def test_batch_groups_reach_the_consumer_one_by_one():
    with fake({0: 7, 1: 5}) as (service, address), client(address) as c:
        service.group = 3
        assert ids(list(c)) == round_robin({0: 7, 1: 5})
        assert service.per_message_asked == [BATCHES_PER_MESSAGE] * 2
    with fake({0: 4, 1: 3}) as (service, address), client(address, batches_per_message=1) as c:
        service.group = 3
        assert ids(list(c)) == round_robin({0: 4, 1: 3})
        assert service.per_message_asked == [1, 1]  # the fake then sends one per message
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="batches_per_message must be"):
            DataClient("127.0.0.1:1", batches_per_message=bad)


@pytest.mark.parametrize(
    ("argument", "bad", "message"),
    [
        ("prefetch", 0, r"prefetch must be at least 1 \(decoded batches kept per lane\), got 0"),
        ("prefetch", -1, "prefetch must be at least 1"),
        ("prefetch", "4", "prefetch must be an integer, got '4'"),
        ("reconnect_timeout", -1, "reconnect_timeout must be >= 0 seconds, got -1"),
        ("reconnect_timeout", float("nan"), "reconnect_timeout must be a number of seconds"),
        ("rpc_timeout", 0, "rpc_timeout must be > 0 seconds, got 0"),
        ("rpc_timeout", "30", r"rpc_timeout must be a number of seconds or None \(no limit\)"),
    ],
)
def test_numeric_arguments_are_checked_at_construction(argument, bad, message):
    with pytest.raises(ValueError, match=message):
        DataClient("127.0.0.1:1", **{argument: bad})


def test_checkpoint_positions_are_checked_before_any_call():
    with fake({0: 3, 1: 3}) as (_, address), client(address) as c:
        with pytest.raises(ValueError, match=r"lane 0: the position must be at least 0"):
            c.checkpoint(positions={0: -1})
        with pytest.raises(ValueError, match=r"checkpoint positions: a lane must be an integer"):
            c.checkpoint(positions={"zero": 1})
    # A state_dict's positions after a JSON round trip (string lanes) are accepted, as before.
    assert checkpoint_positions({"0": 1, 2: 3}) == {0: 1, 2: 3}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("empty", "protocol error: empty BatchGroup"),
        ("oversized", f"BatchGroup of 9 batches; this stream takes at most {BATCHES_PER_MESSAGE}"),
        ("gap", "protocol error: expected lane 0 seq 1, received lane 0 seq 2"),
    ],
)
def test_a_bad_batch_group_is_a_protocol_error(bad, message):
    with fake({0: 12}) as (service, address), client(address) as c:
        service.bad_group = bad
        with pytest.raises(ZephonClientError, match=message):
            list(c)


def test_out_of_range_raises_with_the_servers_message():
    with fake({0: 3}) as (service, address), client(address) as c:
        service.out_of_range = "lane 0: seq 0 is no longer reachable; available [10, 20)"
        with pytest.raises(ZephonClientError, match=r"available \[10, 20\)") as info:
            list(c)
        assert info.value.code == grpc.StatusCode.OUT_OF_RANGE and info.value.lane == 0


def test_reconnecting_gives_up_after_reconnect_timeout():
    with fake({0: 3}) as (service, address), client(address, reconnect_timeout=0.5) as c:
        service.always_unavailable = True
        started = time.monotonic()
        with pytest.raises(ZephonClientError, match="gave up reconnecting") as info:
            list(c)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        assert 0.4 < time.monotonic() - started < 3.0
        assert len(service.opens) >= 3  # backoff 0.1, 0.2, ...


def test_a_stream_whose_server_is_gone_gives_up_naming_the_cause():
    stack = contextlib.ExitStack()
    address = stack.enter_context(serve(FakeService({0: 5000})))  # never all buffered
    with client(address, reconnect_timeout=0.5, prefetch=1) as c:
        it = iter(c)
        take(it, 2)
        stack.close()  # the server goes away and nothing listens there any more
        with pytest.raises(ZephonClientError, match="gave up reconnecting") as info:
            list(it)
    assert f"nothing listens at {address}" in str(info.value)


# --------------------------------------------------------------------------------------------
# several servers, auth, checkpoints
# --------------------------------------------------------------------------------------------


def test_two_servers_serving_disjoint_lanes_are_routed():
    with (
        fake({0: 3, 1: 3}, num_lanes=4) as (a, addr_a),
        fake({2: 3, 3: 3}, num_lanes=4) as (b, addr_b),
        client([addr_a, addr_b]) as c,
    ):
        assert c.routes == {0: addr_a, 1: addr_a, 2: addr_b, 3: addr_b}
        assert ids(c) == round_robin(dict.fromkeys(range(4), 3))
        assert {lane for lane, _, _ in a.opens} == {0, 1}
        assert {lane for lane, _, _ in b.opens} == {2, 3}


def test_servers_must_agree_and_cover_the_lanes():
    with (
        fake({0: 1, 1: 1}, num_lanes=4) as (_, addr_a),
        fake({2: 1, 3: 1}, num_lanes=4, fingerprint="other") as (_, addr_b),
        fake({3: 1}, num_lanes=4) as (_, addr_c),
    ):
        with pytest.raises(ZephonClientError, match="different pipelines"):
            client([addr_a, addr_b])
        with pytest.raises(ZephonClientError, match="lane 2 of rank 0 is served by none"):
            client([addr_a, addr_c])
        with client([addr_a, addr_c], rank=0, world_size=2) as c:  # lanes 0, 1 only
            assert c.routes == {0: addr_a, 1: addr_a}


def test_auth_token_from_argument_or_environment(monkeypatch):
    with fake({0: 2}, token="s3cret") as (_, address):
        monkeypatch.delenv("ZEPHON_AUTH_TOKEN", raising=False)
        with pytest.raises(ZephonClientError) as info:
            client(address)
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        with client(address, auth_token="s3cret") as c:
            assert len(list(c)) == 2
        monkeypatch.setenv("ZEPHON_AUTH_TOKEN", "s3cret")
        with client(address, consumer="env") as c:
            assert len(list(c)) == 2


def test_checkpoint_and_resume_call_the_rpcs():
    with fake({0: 6, 1: 6}) as (service, address), client(address) as c:
        it = iter(c)
        take(it, 3)
        c.mark_consumed()
        info = c.checkpoint(tag="step3")
        sent = service.checkpoint_requests[-1]
        assert sent.tag == "step3"
        assert {p.lane: p.next_seq for p in sent.positions} == {0: 2, 1: 1}
        assert info.id == "ckpt-1" and info.state == b"STATEstep3"
        assert info.positions == {0: 2, 1: 1} and info.address == address
        explicit = c.checkpoint(positions={0: 5})
        assert {p.lane: p.next_seq for p in service.checkpoint_requests[-1].positions} == {0: 5}
        assert explicit.id == "ckpt-2"

        service.resume_positions = {0: 4, 1: 3}
        assert c.resume("ckpt-1") == {0: 4, 1: 3}
        assert c.positions == {0: 4, 1: 3}
        assert "chains" not in c.state_dict() or c.state_dict()["chains"] == {}
        # the open iteration restarts at the resumed positions; chains restart from there
        rest = list(it)
        assert ids(rest) == round_robin({0: 6, 1: 6}, {0: 4, 1: 3})
        assert c.state_dict()["chains"][0] == service.data[0][5].chain_digest.hex()

        service.resume_positions = {0: 1, 1: 1}
        c.resume(state=info.state)
        assert ids(c)[:2] == [(0, 1), (1, 1)]
        with pytest.raises(ZephonClientError, match="no checkpoint nope") as err:
            c.resume("nope")
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ValueError, match="exactly one"):
            c.resume()


# --------------------------------------------------------------------------------------------
# acknowledgements
# --------------------------------------------------------------------------------------------


def test_acks_are_coalesced_at_high_rates_and_close_sends_the_rest():
    with fake({0: 200}) as (service, address):  # still streaming: the fake ends at the end
        c = client(address)
        it = iter(c)
        assert len(take(it, 31)) == 31  # 30 consumed, the 31st is pending
        assert c.positions == {0: 30}
        assert wait_for(lambda: service.acks.get((0, "rank0"), 0) >= 28)
        assert service.acks[0, "rank0"] <= 30
        assert service.ack_messages <= 30 // 2  # coalesced: not one Ack per batch
        c.close()
        # Closing sends what was consumed: a new client would start exactly after it.
        assert wait_for(lambda: service.acks[0, "rank0"] == 30, timeout=1.0)


def test_a_pending_ack_goes_out_after_the_interval_without_more_consumption():
    with fake({0: 200}) as (service, address), client(address) as c:
        it = iter(c)
        take(it, 3)  # batches 0 and 1 consumed: ack 1 went out at once, ack 2 waits
        assert wait_for(lambda: service.acks.get((0, "rank0")) == 2, timeout=3 * ACK_INTERVAL)


# --------------------------------------------------------------------------------------------
# shutdown
# --------------------------------------------------------------------------------------------


def test_close_is_prompt_while_iteration_is_blocked():
    with fake({0: 5, 1: 5}) as (service, address):
        service.stall.add(1)
        c = client(address)
        it = iter(c)
        assert ids(take(it, 1)) == [(0, 0)]
        finished = threading.Event()
        outcome: list[object] = []

        def consume() -> None:
            outcome.extend(it)  # blocks on lane 1, which never sends
            finished.set()

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        time.sleep(0.2)
        started = time.monotonic()
        c.close()
        assert time.monotonic() - started < 1.0
        assert finished.wait(1.0)
        assert outcome == []
        assert wait_for(lambda: service.active == 0, timeout=1.0)  # every call cancelled
        c.close()  # idempotent
        with pytest.raises(ZephonClientError, match="closed"):
            iter(c)
        # Every call after close says so (not gRPC's "Cannot invoke RPC on closed channel").
        for call in (c.get_info, c.checkpoint, lambda: c.load_state_dict(c.state_dict())):
            with pytest.raises(ZephonClientError, match="the client is closed"):
                call()


def test_context_manager_closes_an_abandoned_iteration():
    with fake({0: 40, 1: 40}) as (service, address):
        with client(address) as c:
            it = iter(c)
            take(it, 5)
            assert service.active == 2
        assert wait_for(lambda: service.active == 0, timeout=1.0)
        assert list(it) == []


def test_a_new_iteration_supersedes_the_previous_one():
    with fake({0: 4, 1: 4}) as (_, address), client(address) as c:
        first = iter(c)
        take(first, 2)  # (0, 0) consumed, (1, 0) pending
        second = iter(c)
        assert ids(second) == round_robin({0: 4, 1: 4}, {0: 1, 1: 0})
        with pytest.raises(ZephonClientError, match="superseded"):
            next(first)


# --------------------------------------------------------------------------------------------
# tail and torch
# --------------------------------------------------------------------------------------------


def test_tail_prints_headers_and_decoded_rows_and_acks_only_what_it_read():
    with fake({0: 30, 1: 2}) as (service, address):
        out = io.StringIO()
        # more than the window: only possible if tail acknowledges what it printed
        assert tail(address, 0, WINDOW + 2, start_seq=1, out=out) == WINDOW + 2
        text = out.getvalue()
        assert "lane 0 seq 1  rows=2" in text and "input_ids[2, 24]:int32" in text
        assert f"row 1: {row_text(0, 1, 1)!r}" in text and f"lane 0 seq {WINDOW + 2}" in text
        assert f"seq {WINDOW + 3}" not in text and "<258>" not in text
        consumer = next(c for lane, s, c in service.opens if c.startswith("tail-"))
        assert consumer.startswith("tail-")
        time.sleep(0.05)
        assert 3 <= service.acks[0, consumer] <= WINDOW + 3  # never beyond what it printed
        out = io.StringIO()
        assert tail(address, 1, None, out=out, decode=False) == 2
        assert "row 0" not in out.getvalue()
        assert "lane 1: end of stream at seq 2" in out.getvalue()
        with pytest.raises(ZephonClientError, match="not reachable") as info:
            tail(address, 1, 1, start_seq=9, out=io.StringIO())
        assert info.value.code == grpc.StatusCode.OUT_OF_RANGE


def test_torch_adapter_yields_tensors():
    torch = pytest.importorskip("torch")
    from zephon_client.torch import ZephonIterableDataset

    with fake({0: 3, 1: 3}) as (_, address):
        dataset = ZephonIterableDataset(lambda: client(address), with_meta=True)
        items = list(torch.utils.data.DataLoader(dataset, batch_size=None))
        assert [(i["lane"], i["seq"]) for i in items] == round_robin({0: 3, 1: 3})
        assert items[0]["input_ids"].dtype == torch.int32
        assert dataset.state_dict()["positions"] == {0: 3, 1: 3}
