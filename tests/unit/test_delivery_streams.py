"""Delivery-layer streams without a server: the message policy, the send window's
acknowledgement checks, and how a stream answers its consumer's messages.

The hub is a recording stand-in here (these are unit tests of ``delivery/streams.py`` and
``delivery/acks.py``); ``test_hub.py`` runs the planner on a real hub, and the service tests
run it behind gRPC.
"""

from __future__ import annotations

import threading

import pytest

from zephon_server.delivery.acks import AckWindow
from zephon_server.delivery.message_planner import MessagePolicy
from zephon_server.delivery.streams import Streams
from zephon_server.engine.errors import ConfigError


class RecordingHub:
    """What a stream asks of the hub: open, ack, close_consumer."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def open(self, lane, consumer, start):
        self.calls.append(("open", lane, consumer, start))
        return iter(())

    def ack(self, lane, consumer, next_seq):
        self.calls.append(("ack", lane, consumer, next_seq))

    def close_consumer(self, lane, consumer):
        self.calls.append(("close", lane, consumer))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window", 0),
        ("max_batches", -1),
        ("group_max_bytes", True),
        ("linger", 2.0),
        ("ring_mib", -1),
    ],
)
def test_message_policy_names_the_bad_field(field, value):
    with pytest.raises(ConfigError, match=rf"MessagePolicy\.{field} must be"):
        MessagePolicy(**{field: value})


def test_batches_per_message_are_what_the_consumer_takes_within_the_servers_maximum():
    policy = MessagePolicy(max_batches=16)
    assert [policy.per_message(n) for n in (0, 1, 8, 16, 1000)] == [1, 1, 8, 16, 16]


def test_acks_of_unsent_batches_are_refused_with_what_was_sent():
    acks = AckWindow(5)
    assert "sent nothing yet (opened at seq 5)" in acks.unsent_problem(6)
    acks.sent = 9
    assert acks.unsent_problem(9) == ""
    assert "this stream sent seqs 5..8" in acks.unsent_problem(10)


def test_the_window_waits_for_acks_and_stops_when_the_stream_ends():
    acks, draining = AckWindow(0), threading.Event()
    threading.Timer(0.1, acks.update, (3,)).start()
    assert acks.wait_for(3, lambda: True, draining)
    threading.Timer(0.1, acks.close).start()
    assert not acks.wait_for(10, lambda: True, draining)
    assert not AckWindow(0).wait_for(1, lambda: False, draining)


def test_a_stream_forwards_acks_and_fails_on_an_ack_of_unsent_batches():
    hub = RecordingHub()
    stream = Streams(hub, MessagePolicy()).open(  # type: ignore[arg-type]
        2, 0, name="", peer="ipv4:1", per_message=1, shared_memory=False
    )
    stream.acks.sent = 4
    assert stream.receive_ack(3)
    assert hub.calls[-1] == ("ack", 2, stream.consumer, 3) and stream.acks.value == 3
    assert not stream.receive_ack(7)
    assert "Ack(next_seq=7) acknowledges batches not sent yet" in (stream.acks.error or "")
    assert hub.calls[-1] == ("close", 2, stream.consumer)


def test_a_ring_reply_without_an_offer_fails_the_stream():
    hub = RecordingHub()
    stream = Streams(hub, MessagePolicy()).open(  # type: ignore[arg-type]
        0, 0, name="", peer="p", per_message=1, shared_memory=True
    )
    assert not stream.receive_ring_reply(True, "")
    assert "RingReply without a RingOffer" in (stream.acks.error or "")


def test_a_named_consumer_reopening_a_lane_supersedes_its_older_stream():
    hub = RecordingHub()
    streams = Streams(hub, MessagePolicy())  # type: ignore[arg-type]
    old = streams.open(1, 0, name="rank0", peer="p", per_message=1, shared_memory=False)
    new = streams.open(1, 4, name="rank0", peer="p", per_message=1, shared_memory=False)
    assert old.acks.superseded and "superseded: consumer 'rank0' opened lane 1 again" in (
        old.acks.error or ""
    )
    assert ("close", 1, old.consumer) in hub.calls and new.acks.error is None
    old.close()  # the old stream's end must not forget the new one's name
    newer = streams.open(1, 4, name="rank0", peer="p", per_message=1, shared_memory=False)
    assert new.acks.superseded and newer.acks.error is None


def test_the_stream_limit_counts_open_streams():
    streams = Streams(RecordingHub(), MessagePolicy(), max_streams=2)  # type: ignore[arg-type]
    assert streams.admit() and streams.admit() and not streams.admit()
    assert streams.active == 2
    streams.leave()
    assert streams.admit()
