"""A fake DataService for client tests, served by a real ``grpc.server`` on loopback.

The fake serves synthetic batches with correct digests, honours OpenLane's start_seq, the
ack window and EndOfStream, and can be told to fail once with UNAVAILABLE, to fork the
stream after that failure, to corrupt a chain digest, to answer OUT_OF_RANGE, to stall a
lane, or to require a bearer token.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np

from zephon_client import CHAIN_SEED, DataClient, wire
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

WINDOW = 16
LENGTH = 24
PAD = 258
FINGERPRINT = "f1ee7e57"


# --------------------------------------------------------------------------------------------
# synthetic batches
# --------------------------------------------------------------------------------------------


def row_text(lane: int, seq: int, row: int, salt: int = 0) -> str:
    return f"lane{lane} seq{seq} row{row}" + ("!" * salt)


def make_batch(lane: int, seq: int, previous: bytes, salt: int = 0) -> pb.SampleBatch:
    """Two rows of byte-tokenized text padded with PAD, plus padding_mask."""
    ids = np.full((2, LENGTH), PAD, dtype=np.int32)
    mask = np.zeros((2, LENGTH), dtype=bool)
    rows = []
    for r in range(2):
        data = row_text(lane, seq, r, salt).encode()
        ids[r, : len(data)] = list(data)
        mask[r, : len(data)] = True
        rows.append(
            pb.RowSource(
                segments=[pb.Segment(dataset=0, shard=lane, row=2 * seq + r, length=len(data))]
            )
        )
    tensors = {"input_ids": ids, "padding_mask": mask}
    digest = wire.content_digest(tensors)
    return pb.SampleBatch(
        lane=lane,
        seq=seq,
        tensors=[
            pb.Tensor(name="input_ids", dtype=pb.DTYPE_INT32, shape=ids.shape, data=ids.tobytes()),
            pb.Tensor(
                name="padding_mask", dtype=pb.DTYPE_BOOL, shape=mask.shape, data=mask.tobytes()
            ),
        ],
        rows=rows,
        digest=digest,
        chain_digest=wire.chain_digest(previous, digest),
        closed=[pb.ClosedDocument(dataset=0, shard=lane, row=2 * seq)],
    )


def make_lane(lane: int, count: int, salt: int = 0) -> list[pb.SampleBatch]:
    out: list[pb.SampleBatch] = []
    previous = CHAIN_SEED
    for seq in range(count):
        out.append(make_batch(lane, seq, previous, salt))
        previous = out[-1].chain_digest
    return out


def round_robin(lengths: dict[int, int], start: dict[int, int] | None = None) -> list:
    """The (lane, seq) order a rank reading ``lengths`` lanes must yield."""
    pos = dict(start or dict.fromkeys(lengths, 0))
    lanes = sorted(lengths)
    first = min(lanes, key=lambda lane: (pos[lane], lane))
    order = lanes[lanes.index(first) :] + lanes[: lanes.index(first)]
    out, i = [], 0
    while order:
        lane = order[i]
        if pos[lane] >= lengths[lane]:
            order.pop(i)
            i = i % len(order) if order else 0
            continue
        out.append((lane, pos[lane]))
        pos[lane] += 1
        i = (i + 1) % len(order)
    return out


def ids(batches) -> list[tuple[int, int]]:
    return [(b.lane, b.seq) for b in batches]


# --------------------------------------------------------------------------------------------
# the fake service
# --------------------------------------------------------------------------------------------


class FakeService(pb_grpc.DataServiceServicer):
    def __init__(
        self,
        lengths: dict[int, int],
        *,
        num_lanes: int | None = None,
        fingerprint: str = FINGERPRINT,
        token: str | None = None,
    ) -> None:
        self.lengths = dict(lengths)
        self.num_lanes = num_lanes if num_lanes is not None else len(lengths)
        self.data = {lane: make_lane(lane, n) for lane, n in lengths.items()}
        self.fingerprint = fingerprint
        self.token = token
        self.lock = threading.Lock()
        self.opens: list[tuple[int, int, str]] = []
        self.acks: dict[tuple[int, str], int] = {}
        self.ack_messages = 0
        self.acknowledged: dict[int, int] = {}
        self.fail_after: dict[int, int] = {}  # lane -> abort UNAVAILABLE once after k batches
        self.fork_on_fail = False  # after that failure, serve a different stream
        self.always_unavailable = False
        self.corrupt: set[tuple[int, int]] = set()  # (lane, seq) sent with a wrong chain
        self.out_of_range: str | None = None
        self.stall: set[int] = set()  # lanes that never send
        self.checkpoint_requests: list[pb.CheckpointRequest] = []
        self.resume_positions: dict[int, int] = {}
        self.active = 0  # StreamBatches calls not ended yet (cancelled calls end too)
        self.group = 1  # batches per message for clients that accept that many
        self.bad_group: str | None = None  # "empty", "oversized" or "gap": one bad BatchGroup
        self.per_message_asked: list[int] = []  # OpenLane.max_batches_per_message of each open

    def _auth(self, context: grpc.ServicerContext) -> None:
        if self.token is None:
            return
        metadata = dict(context.invocation_metadata())
        if metadata.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def GetInfo(self, request, context):
        self._auth(context)
        return pb.GetInfoResponse(
            num_lanes=self.num_lanes,
            fingerprint=self.fingerprint,
            plan="fake plan",
            acknowledged=[
                pb.LanePosition(lane=lane, next_seq=self.acknowledged.get(lane, 0))
                for lane in sorted(self.data)
            ],
            served_lanes=sorted(self.data),
            tensor_names=["input_ids", "padding_mask"],
            tokenizer="byte",
            version="fake",
            flush_every_k_chunks=2,
        )

    def StreamBatches(self, request_iterator, context):
        self._auth(context)
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "open":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be OpenLane")
        lane, start, consumer = first.open.lane, first.open.start_seq, first.open.consumer
        if lane not in self.data:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"lane {lane} is not served here")
        with self.lock:
            self.opens.append((lane, start, consumer))
            self.per_message_asked.append(first.open.max_batches_per_message)
            self.active += 1
        group = min(self.group, max(first.open.max_batches_per_message, 1))

        def ended() -> None:
            with self.lock:
                self.active -= 1

        context.add_callback(ended)
        if self.always_unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "server is draining")
        if self.out_of_range is not None:
            context.abort(grpc.StatusCode.OUT_OF_RANGE, self.out_of_range)
        if start > len(self.data[lane]):
            context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"lane {lane}: seq {start} not reachable; available [0, {len(self.data[lane])}]",
            )
        acked = [start]
        cond = threading.Condition()

        def read_acks() -> None:
            with contextlib.suppress(Exception):
                for request in request_iterator:
                    if request.WhichOneof("kind") == "ack":
                        with cond:
                            acked[0] = max(acked[0], request.ack.next_seq)
                            cond.notify_all()
                        with self.lock:
                            self.acks[lane, consumer] = acked[0]
                            self.ack_messages += 1

        threading.Thread(target=read_acks, daemon=True).start()
        seq, sent = start, 0
        while context.is_active():
            if lane in self.stall:
                time.sleep(0.02)
                continue
            batches = self.data[lane]
            if seq >= len(batches):
                chain = batches[seq - 1].chain_digest if seq else CHAIN_SEED
                yield pb.StreamBatchesResponse(end=pb.EndOfStream(next_seq=seq, chain_digest=chain))
                return
            with cond:
                while seq >= acked[0] + WINDOW and context.is_active():
                    cond.wait(0.02)
            with self.lock:
                fail = self.fail_after.get(lane)
                if fail is not None and sent >= fail:
                    del self.fail_after[lane]
                    if self.fork_on_fail:
                        self.data[lane] = make_lane(lane, len(batches), salt=1)
                else:
                    fail = None
            if fail is not None:
                context.abort(grpc.StatusCode.UNAVAILABLE, "server is draining")
            if group > 1 or self.bad_group:
                taken = batches[seq : seq + group]
                if self.bad_group == "empty":
                    taken = []
                elif self.bad_group == "oversized":
                    taken = batches[seq : seq + 9]
                elif self.bad_group == "gap":
                    taken = [batches[seq], batches[seq + 2]]
                yield pb.StreamBatchesResponse(batches=pb.BatchGroup(batches=taken))
                seq += len(taken)
                sent += len(taken)
                continue
            batch = batches[seq]
            if (lane, seq) in self.corrupt:
                batch = pb.SampleBatch.FromString(batch.SerializeToString())
                batch.chain_digest = bytes(32)
            yield pb.StreamBatchesResponse(batch=batch)
            seq += 1
            sent += 1

    def Checkpoint(self, request, context):
        self._auth(context)
        self.checkpoint_requests.append(request)
        positions = dict(self.acknowledged)
        positions.update({p.lane: p.next_seq for p in request.positions})
        return pb.CheckpointResponse(
            checkpoint_id=f"ckpt-{len(self.checkpoint_requests)}",
            state=b"STATE" + request.tag.encode(),
            positions=[
                pb.LanePosition(lane=lane, next_seq=positions.get(lane, 0))
                for lane in sorted(self.data)
            ],
        )

    def Resume(self, request, context):
        self._auth(context)
        if request.WhichOneof("source") == "checkpoint_id" and request.checkpoint_id != "ckpt-1":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no checkpoint {request.checkpoint_id}")
        return pb.ResumeResponse(
            positions=[
                pb.LanePosition(lane=lane, next_seq=self.resume_positions.get(lane, 0))
                for lane in sorted(self.data)
            ],
            fingerprint=self.fingerprint,
        )


SERVER_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
]


@contextlib.contextmanager
def serve(service: FakeService, port: int = 0) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=SERVER_OPTIONS)
    pb_grpc.add_DataServiceServicer_to_server(service, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    assert bound, f"could not bind 127.0.0.1:{port}"
    server.start()
    try:
        yield f"127.0.0.1:{bound}"
    finally:
        server.stop(grace=None)


@contextlib.contextmanager
def fake(lengths: dict[int, int], **kwargs) -> Iterator[tuple[FakeService, str]]:
    service = FakeService(lengths, **kwargs)
    with serve(service) as address:
        yield service, address


def client(address, **kwargs) -> DataClient:
    kwargs.setdefault("reconnect_timeout", 5.0)
    return DataClient(address, **kwargs)


def wait_for(predicate, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
