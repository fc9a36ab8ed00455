"""Shared-memory rings: tensor bytes through /dev/shm for clients on the server's host.

Real servers and clients over loopback; the batches must be the dump's (inline runner) whether
their bytes came in the messages, in the ring, or both, on every runner.
"""

from __future__ import annotations

import mmap
import os
import queue
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from zephon_client import DataClient
from zephon_client.ring import open_ring
from zephon_client.wire import CHAIN_SEED, WireError, decode_batch, verify
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.delivery.ring import PREFIX, SHM_DIR, Ring, RingSpace, sweep_stale
from zephon_testing.infra import free_port
from zephon_testing.servers import (
    dump_digests,
    open_request,
    read_lane,
    response_batches,
    server,
    write_config,
)

pytestmark = pytest.mark.service


def ring_files(pid: int) -> list[Path]:
    return sorted(SHM_DIR.glob(f"{PREFIX}{pid}-*"))


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def read_raw(stub, lane: int, answer: pb.RingReply | None, per_message: int = 4, ack_every=1):
    """Read a lane to its end with a raw stub that asks for a ring; ``answer`` is what it
    replies to the offer (``None``: accept if it can map the file); it acknowledges once
    ``ack_every`` batches are unacknowledged. Returns (offer, ring mapping or None,
    [(batch message, decoded batch, from_ring)])."""
    requests: queue.Queue = queue.Queue()
    first = open_request(lane, 0, "raw", per_message)
    first.open.shared_memory = True
    requests.put(first)
    out, offer, ring, acked = [], None, None, 0
    call = stub.StreamBatches(iter(requests.get, None), timeout=120)
    try:
        for resp in call:
            kind = resp.WhichOneof("kind")
            if kind == "ring":
                offer = resp.ring
                if answer is None:
                    ring, reason = open_ring(offer)
                    assert ring is not None, reason
                    answer = pb.RingReply(accepted=True)
                requests.put(pb.StreamBatchesRequest(ring=answer))
                continue
            if kind == "end":
                break
            for msg in response_batches(resp):
                in_ring = msg.tensors[0].HasField("ring_offset")
                out.append((msg, decode_batch(msg, ring), in_ring))
            if out[-1][0].seq + 1 - acked >= ack_every:
                acked = out[-1][0].seq + 1
                requests.put(pb.StreamBatchesRequest(ack=pb.Ack(next_seq=acked)))
    finally:
        requests.put(None)
        call.cancel()
    return offer, ring, out


def checked_chain(decoded) -> list[str]:
    previous = CHAIN_SEED
    for batch in decoded:
        verify(batch, previous)
        previous = batch.chain_digest
    return [b.chain_digest.hex() for b in decoded]


# -- the ring's space ------------------------------------------------------------------------


def test_ring_space_wraps_and_frees_in_order():
    space = RingSpace(100, start=10)
    assert space.allocate(40, end_seq=2) == 10
    assert space.allocate(40, end_seq=4) == 50
    assert space.allocate(20, end_seq=5) is None  # [90, 100) is too short, [10, ...) is held
    space.release(2)  # the first region's batches are acknowledged
    assert space.allocate(30, end_seq=6) == 10  # wrapped to the start
    assert space.allocate(15, end_seq=7) is None  # [40, 50) holds only 10
    assert space.allocate(10, end_seq=7) == 40
    space.release(7)
    assert space.in_use == 0
    assert space.allocate(91, end_seq=8) is None  # larger than the ring
    assert space.allocate(90, end_seq=8) == 10


def test_ring_space_never_hands_out_held_bytes():
    """Random allocations and acknowledgements: no region overlaps one still held, and every
    region lies inside the usable part of the ring."""
    rng = random.Random(5)
    space = RingSpace(1000, start=16)
    held: list[tuple[int, int, int]] = []  # (end_seq, start, end)
    seq = acked = 0
    for _ in range(5000):
        if rng.random() < 0.6:
            n = rng.randint(1, 300)
            seq += rng.randint(1, 3)
            offset = space.allocate(n, seq)
            if offset is not None:
                assert offset >= 16 and offset + n <= 1000
                assert all(offset + n <= s or e <= offset for _, s, e in held), (offset, n, held)
                held.append((seq, offset, offset + n))
        else:
            acked = rng.randint(acked, seq)
            space.release(acked)
            held = [h for h in held if h[0] > acked]
        assert space.in_use == sum(e - s for _, s, e in held)


def shm_free() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def test_a_declined_ring_gives_its_memory_back_at_once():
    """The pages are reserved when the ring is made (a full /dev/shm fails there, not with
    SIGBUS later) and returned on a decline, before the stream ends."""
    before = shm_free()
    ring = Ring.create(0, 64 << 20)
    assert ring is not None
    assert before - shm_free() >= 60 << 20
    ring.answer(False, "test")
    assert not ring.path.exists() and before - shm_free() < 4 << 20
    assert ring.place([], 0) is None  # never used once declined
    ring.close()  # and closing again is harmless


def test_rings_leave_half_of_dev_shm_to_others(monkeypatch, caplog):
    """Unit test of the room check (a 64 MB /dev/shm, as Docker gives, faked by statvfs)."""
    real = os.statvfs

    def small(path, free_mb):
        st = real(path)
        blocks = (64 << 20) // st.f_frsize
        free = (free_mb << 20) // st.f_frsize
        return os.statvfs_result((*st[:2], blocks, free, free, *st[5:]))

    monkeypatch.setattr(os, "statvfs", lambda path: small(path, 40))
    ring = Ring.create(1, 7 << 20)  # 40 - 7 >= 32 MB stay free
    assert ring is not None
    ring.close()
    monkeypatch.setattr(os, "statvfs", lambda path: small(path, 36))
    with caplog.at_level("INFO", logger="zephon_server.delivery.ring"):
        assert Ring.create(1, 7 << 20) is None
    assert "--shm-size" in caplog.text and "half" in caplog.text


# -- the client's side ------------------------------------------------------------------------


def test_the_client_declines_what_is_not_a_ring_of_this_host(tmp_path):
    other = tmp_path / "zephon-ring-1-0-x"
    other.write_bytes(b"n" * 4096)
    ring, reason = open_ring(pb.RingOffer(path=str(other), size=4096, nonce=b"n" * 16))
    assert ring is None and "not a ring file" in reason
    ring, reason = open_ring(pb.RingOffer(path="/dev/shm/zephon-ring-0-0-gone", size=4096))
    assert ring is None and "cannot open" in reason
    path = SHM_DIR / f"{PREFIX}{os.getpid()}-9-test"
    path.write_bytes(b"x" * 4096)
    try:
        ring, reason = open_ring(pb.RingOffer(path=str(path), size=4096, nonce=b"y" * 16))
        assert ring is None and "nonce" in reason
        ring, reason = open_ring(pb.RingOffer(path=str(path), size=8192, nonce=b"x" * 16))
        assert ring is None and "smaller" in reason
        ring, reason = open_ring(pb.RingOffer(path=str(path), size=4096, nonce=b"x" * 16))
        assert isinstance(ring, mmap.mmap) and reason == ""
        ring.close()
    finally:
        path.unlink()


def test_ring_offsets_decode_to_copies_and_misuse_is_a_wire_error():
    """Unit test of the client's decoding: a tensor at a ring offset becomes a copy of those
    bytes (the region is reused once acknowledged); offsets without a ring, past its end, or
    with data as well are protocol errors naming the tensor."""
    ring = mmap.mmap(-1, 4096)
    values = np.arange(6, dtype="<i4")
    ring[100 : 100 + values.nbytes] = values.tobytes()

    def batch(**fields) -> pb.SampleBatch:
        tensor = pb.Tensor(name="ids", dtype=pb.DTYPE_INT32, shape=[2, 3], **fields)
        return pb.SampleBatch(lane=0, seq=0, tensors=[tensor])

    decoded = decode_batch(batch(ring_offset=100), ring).tensors["ids"]
    assert np.array_equal(decoded, values.reshape(2, 3))
    ring[100:104] = b"\xff" * 4  # the server reusing the region does not touch the batch
    assert decoded[0, 0] == 0
    with pytest.raises(WireError, match="'ids' is in a shared-memory ring, but this stream"):
        decode_batch(batch(ring_offset=100))
    with pytest.raises(WireError, match="beyond the ring's 4096"):
        decode_batch(batch(ring_offset=4090), ring)
    with pytest.raises(WireError, match="both data and ring_offset"):
        decode_batch(batch(ring_offset=100, data=values.tobytes()), ring)
    ring.close()


# -- real servers -----------------------------------------------------------------------------


@pytest.mark.parametrize("runner", ["inline", "threads", "processes"])
def test_a_client_on_the_host_reads_the_same_batches_through_the_ring(
    stream_config, stream_expected, runner, tmp_path
):
    """DataClient (shared memory on by default) against a real server: the ring carried most of
    the tensor bytes, and the batches are the dump's and a message-only client's, byte for
    byte, on every runner."""
    cfg, work = stream_config
    port = free_port()
    workers = "1" if runner == "inline" else "2"
    args = ["--config", str(cfg), "--runner", runner, "--workers", workers]
    with server([*args, "--metrics-port", str(port)], work) as srv:
        with DataClient(srv.address) as client:
            shared = [(b.lane, b.seq, dict(b.tensors), b.chain_digest) for b in client]
        ring_bytes = metric(port, "zephon_ring_bytes_total")
        plain = []  # the same lanes again, with the bytes in the messages (raw stub, seq 0)
        for lane in range(4):
            batches, _ = read_lane(srv.stub(), lane, per_message=4)
            plain += [
                (b.lane, b.seq, dict(b.tensors), b.chain_digest) for b in map(decode_batch, batches)
            ]
        plain.sort(key=lambda b: (b[1], b[0]))  # the client's round-robin order
        assert metric(port, "zephon_ring_bytes_total") == ring_bytes  # none for that reader
        assert ring_files(srv.proc.pid) == []  # unlinked once the client answered
    tensor_bytes = sum(a.nbytes for *_, tensors, _ in shared for a in tensors.values())
    assert tensor_bytes / 2 < ring_bytes <= tensor_bytes
    assert len(shared) == len(plain) == sum(len(v) for v in stream_expected.values())
    for (lane, seq, tensors, chain), (lane2, seq2, tensors2, chain2) in zip(shared, plain):
        assert (lane, seq, chain) == (lane2, seq2, chain2)
        assert chain.hex() == stream_expected[lane][seq]
        assert tensors.keys() == tensors2.keys()
        for name, arr in tensors.items():
            assert arr.dtype == tensors2[name].dtype and np.array_equal(arr, tensors2[name])


def test_the_raw_protocol_offer_accept_unlink(stream_config, stream_expected):
    """Asked for shared memory, the server offers a 0600 file under /dev/shm starting with the
    nonce, unlinks it on the reply, then sends offsets instead of bytes."""
    cfg, work = stream_config
    with server(["--config", str(cfg)], work) as srv:
        offer, ring, out = read_raw(srv.stub(), 1, None)
        assert offer is not None and offer.path.startswith(f"/dev/shm/{PREFIX}{srv.proc.pid}-1-")
        assert ring is not None and len(ring) == offer.size and ring[:16] == offer.nonce
        assert not Path(offer.path).exists()
        assert checked_chain([d for _, d, _ in out]) == stream_expected[1]
        # Messages went in full until the reply arrived, then all through the (ample) ring.
        kinds = [in_ring for *_, in_ring in out]
        first = kinds.index(True)
        assert all(kinds[first:]) and first < len(kinds) / 2, kinds
        for msg, _, in_ring in out:
            if in_ring:
                assert all(not t.data and t.HasField("ring_offset") for t in msg.tensors)
        ring.close()
        assert ring_files(srv.proc.pid) == []


def test_a_declined_ring_leaves_the_bytes_in_the_messages(stream_config, stream_expected):
    cfg, work = stream_config
    with server(["--config", str(cfg)], work) as srv:
        forged = "another host\n2026-12-03 21:00:00,000 ERROR zephon.serve: FORGED"
        reply = pb.RingReply(accepted=False, reason=forged)
        offer, ring, out = read_raw(srv.stub(), 2, reply)
        assert offer is not None and ring is None
        assert not any(in_ring for *_, in_ring in out)
        assert checked_chain([d for _, d, _ in out]) == stream_expected[2]
        assert not Path(offer.path).exists()
        # The client's reason is logged quoted: it cannot forge a line of the server's log.
        assert "declined the shared-memory ring: 'another host\\n2026-12-03" in srv.output()
        assert not any(line.startswith("2026-12-03 21:00") for line in srv.output().splitlines())


def test_no_offer_with_shm_ring_mib_0_and_a_reply_without_offer_is_refused(
    stream_config, stream_expected
):
    cfg, work = stream_config
    with server(["--config", str(cfg), "--shm-ring-mib", "0"], work) as srv:
        offer, _, out = read_raw(srv.stub(), 0, None)
        assert offer is None and not any(in_ring for *_, in_ring in out)
        assert checked_chain([d for _, d, _ in out]) == stream_expected[0]
        requests = [
            open_request(0),
            pb.StreamBatchesRequest(ring=pb.RingReply(accepted=True)),
        ]
        with pytest.raises(grpc.RpcError) as err:
            for _ in srv.stub().StreamBatches(iter(requests), timeout=60):
                time.sleep(0.05)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "RingReply without a RingOffer" in err.value.details()


def test_a_ring_too_small_for_the_window_mixes_both_ways_with_the_same_batches(
    tmp_path, corpus_dir
):
    """A 1 MiB ring, ~106 KB batches and a reader that acknowledges every 12 batches (the server
    sends up to 16 beyond the last ack): the ring fills before an acknowledgement frees it, so
    some batches go through the ring and the rest in full; the lane is still the dump's."""
    ops = [{"pack_flat": {"max_length": 4096}}, {"shuffle": {"buffer_size": 4}}]
    cfg = write_config(tmp_path / "big.yaml", corpus_dir, lanes=1, batch=2, extra_ops=ops)
    expected = dump_digests(cfg, 1000)
    assert len(expected[0]) >= 26  # 16 before the first ack, then more than the ring holds
    args = ["--config", str(cfg), "--shm-ring-mib", "1", "--max-ahead", "1000"]
    with server(args, tmp_path) as srv:
        # Every batch produced before reading: the window and the ring decide, not how fast
        # the pipeline keeps up with the reader (a loaded machine sent all through the ring).
        deadline = time.monotonic() + 60
        while "pipeline finished" not in srv.output():
            assert time.monotonic() < deadline, srv.output()
            time.sleep(0.05)
        offer, _, out = read_raw(srv.stub(), 0, None, per_message=1, ack_every=12)
        assert offer is not None and offer.size == 1 << 20
        assert checked_chain([d for _, d, _ in out]) == expected[0]
        # What holds however fast the acks come back (the client acks every 12th batch, the
        # server sends at most 16 beyond the last ack, ~9 batches fit in the ring): batches
        # 12-23 all go before the ack of 23 could free anything, so at least 3 of them find
        # the ring full and go in full; batch 16 waits for the ack of 11, which freed the ring
        # of batches 0-11, so it goes through the ring. (Asserting both kinds among 16
        # onwards, as this test did, failed about one run in six: later acks can free the
        # ring in time for every later batch.)
        kinds = [in_ring for *_, in_ring in out]
        seen = "".join("R" if k else "F" for k in kinds)  # the message: R ring, F in full
        assert "R" in seen[:12], seen  # the ring, accepted at the start, is used
        assert seen[16] == "R" and seen[12:24].count("F") >= 3, seen


def test_a_dead_servers_ring_files_are_removed(stream_config):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(dead.stdout)
    stale = SHM_DIR / f"{PREFIX}{pid}-3-abcdef"
    stale.write_bytes(b"x")
    mine = SHM_DIR / f"{PREFIX}{os.getpid()}-3-abcdef"  # a live process's file stays
    mine.write_bytes(b"x")
    try:
        assert sweep_stale() >= 1
        assert not stale.exists() and mine.exists()
        stale.write_bytes(b"x")
        cfg, work = stream_config
        with server(["--config", str(cfg)], work):
            assert not stale.exists()  # the server sweeps at start-up
    finally:
        stale.unlink(missing_ok=True)
        mine.unlink()
