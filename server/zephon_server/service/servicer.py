"""The ``zephon.v1.DataService`` servicer: GetInfo, StreamBatches, Checkpoint, Resume.

A thin adapter over :class:`~zephon_server.delivery.hub.LaneHub`. ``StreamBatches`` reads the
first client message (``OpenLane``), then serves the lane in seq order while a helper thread
reads acknowledgements; at most ``window`` batches are sent beyond the last acknowledgement,
so a slow consumer is held back without holding back other lanes. A client on the same host
gets the tensor bytes through a shared-memory ring (:mod:`.ring`).

Every request is checked against :mod:`.limits` before it reaches the hub; requests that do
not decode never get here (:mod:`.malformed` answers them).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

from .. import __version__
from ..delivery.hub import EndOfLane, HubClosed, LaneHub, ReplayLimit
from ..delivery.ring import DEFAULT_MAX_MIB, Ring, ring_size
from ..engine.checkpoint import CheckpointNotSaved, ResumeState
from .encoding import encode_batches
from .errors import InvalidRequest, abort
from .limits import RequestLimits
from .metrics import ServiceMetrics
from .ratelimit import RateLimitedLog
from .wire import end_response

log = logging.getLogger(__name__)

WINDOW = 16
MAX_BATCHES_PER_MESSAGE = 16
"""The most batches the server puts in one message, whatever the client asks (the window
bounds it too)."""
GROUP_MAX_BYTES = 16 << 20
"""A group takes no further batch past this many bytes of tensor data (a lone batch may be
larger), far below gRPC's message limits on both sides."""
LINGER = 0.015
"""Seconds a stream waits, after its first message, for more batches to group with a ready
one (``--linger-ms``). The engine makes a lane's batches in bursts (a chunk's worth within a
few milliseconds); sending the first of a burst alone and the rest after it cost one more
gRPC message on both sides for nothing."""


class Draining(HubClosed):
    """The server is draining (SIGTERM): new streams are refused, open ones end."""


class DataService(pb_grpc.DataServiceServicer):
    """Serves a :class:`LaneHub` over gRPC."""

    def __init__(
        self,
        hub: LaneHub,
        *,
        metrics: ServiceMetrics,
        max_streams: int = 256,
        window: int = WINDOW,
        linger: float = LINGER,
        ring_mib: int = DEFAULT_MAX_MIB,
    ) -> None:
        self.hub = hub
        self.metrics = metrics
        self.max_streams = max_streams
        self.window = window
        self.linger = linger
        self.ring_mib = ring_mib  # the largest shared-memory ring a stream gets; 0: none
        self.limits = RequestLimits(
            num_lanes=hub.num_lanes, served=tuple(hub.lanes), num_datasets=len(hub.plan.datasets)
        )
        self.reports = RateLimitedLog(log)
        self.draining = threading.Event()
        self._lock = threading.Lock()
        self._streams = 0
        self._ids = itertools.count()
        self._named: dict[tuple[int, str], tuple[str, _AckState]] = {}  # (lane, name) -> stream

    @property
    def active_streams(self) -> int:
        return self._streams

    # -- unary ------------------------------------------------------------------------------

    def GetInfo(
        self, request: pb.GetInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetInfoResponse:
        hub = self.hub
        tokenizers = [op for op in hub.plan.ops if op.op_name == "tokenize"]
        store = hub.store
        return pb.GetInfoResponse(
            num_lanes=hub.num_lanes,
            fingerprint=hub.fingerprint,
            plan=hub.plan.explain(),
            acknowledged=[
                pb.LanePosition(lane=lane, next_seq=seq) for lane, seq in hub.positions().items()
            ],
            checkpoint_ids=store.ids() if store is not None else [],
            version=__version__,
            served_lanes=hub.lanes,
            tensor_names=_tensor_names(hub),
            tokenizer=getattr(tokenizers[-1], "tokenizer_spec", "") if tokenizers else "",
            flush_every_k_chunks=hub.plan.pipeline.flush_every_k_chunks,
        )

    def Checkpoint(
        self, request: pb.CheckpointRequest, context: grpc.ServicerContext
    ) -> pb.CheckpointResponse:
        start = time.monotonic()
        try:
            positions = self.limits.check_checkpoint(request)
            cid, data, state = self.hub.checkpoint(positions, tag=request.tag)
        except Exception as exc:
            if isinstance(exc, CheckpointNotSaved):
                self.reports.warning(type(exc).__name__, "checkpoint refused: %s", exc)
            abort(context, exc)
        self.metrics.checkpoint_done(time.monotonic() - start, len(data))
        log.info(
            "checkpoint %s at %s (%d bytes)", cid or "(not persisted)", state.positions(), len(data)
        )
        return pb.CheckpointResponse(
            checkpoint_id=cid,
            state=data,
            positions=[pb.LanePosition(lane=k, next_seq=v) for k, v in state.positions().items()],
        )

    def Resume(self, request: pb.ResumeRequest, context: grpc.ServicerContext) -> pb.ResumeResponse:
        kind = request.WhichOneof("source")
        if kind is None:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "ResumeRequest needs checkpoint_id or state"
            )
        try:
            self.limits.check_resume(request, kind)
            if kind == "checkpoint_id":
                if self.hub.store is None:
                    raise_not_found(request.checkpoint_id)
                assert self.hub.store is not None
                state = self.hub.store.load(request.checkpoint_id)
                source = request.checkpoint_id
            else:
                state = ResumeState.decode(request.state, self.hub.checkpoint_key)
                source = "bytes"
            positions = self.hub.resume(state, source=source)
        except Exception as exc:
            abort(context, exc)
        log.info("resumed from %s at %s", source, positions)
        return pb.ResumeResponse(
            positions=[pb.LanePosition(lane=k, next_seq=v) for k, v in positions.items()],
            fingerprint=self.hub.fingerprint,
        )

    # -- streaming --------------------------------------------------------------------------

    def StreamBatches(
        self, request_iterator: Iterator[pb.StreamBatchesRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.StreamBatchesResponse | bytes]:
        if self.draining.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "server is draining; retry elsewhere")
        with self._lock:
            if self._streams >= self.max_streams:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"stream limit reached ({self.max_streams} open streams); "
                    "close streams or raise --max-streams",
                )
            self._streams += 1
        try:
            yield from self._stream(request_iterator, context)
        finally:
            with self._lock:
                self._streams -= 1

    def _stream(
        self, requests: Iterator[pb.StreamBatchesRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.StreamBatchesResponse | bytes]:
        first = next(requests, None)
        if first is None or first.WhichOneof("kind") != "open":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first StreamBatches message must be OpenLane(lane, start_seq)",
            )
        assert first is not None
        try:
            self.limits.check_open(first.open)
        except InvalidRequest as exc:
            abort(context, exc)
        lane, start = first.open.lane, first.open.start_seq
        name = first.open.consumer
        per_message = min(max(first.open.max_batches_per_message, 1), MAX_BATCHES_PER_MESSAGE)
        consumer = f"{name or context.peer()}#{next(self._ids)}"
        acked = _AckState(start)
        if name:
            # A named consumer reopening a lane is the same reader reconnecting: its older
            # stream (e.g. on a dead connection that keepalive has not closed yet) must not
            # hold the lane back, nor make the new start "not yet reachable".
            with self._lock:
                previous = self._named.get((lane, name))
                self._named[(lane, name)] = (consumer, acked)
            if previous is not None:
                old_consumer, old_acked = previous
                old_acked.fail(
                    f"superseded: consumer {name!r} opened lane {lane} again on another "
                    "stream (consumers of one lane need distinct names)",
                    grpc.StatusCode.ABORTED,
                )
                self.hub.close_consumer(lane, old_consumer)
        try:
            stream = self.hub.open(lane, consumer, start)
        except ReplayLimit as exc:  # too many lanes regenerating at once: try again later
            self._forget(lane, name, consumer)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Exception as exc:
            self._forget(lane, name, consumer)
            abort(context, exc)

        def release() -> None:
            # On cancellation gRPC calls this while the serving thread may be blocked inside
            # the hub waiting for a batch: closing the consumer wakes it and ends the stream.
            acked.close()
            self.hub.close_consumer(lane, consumer)

        if not context.add_callback(release):
            release()  # the call already ended
        reader = threading.Thread(
            target=self._read_acks,
            name=f"zephon-acks-{lane}",
            args=(requests, lane, consumer, acked, context),
            daemon=True,
        )
        reader.start()
        self.metrics.stream_opened()
        sent = start
        failure: BaseException | None = None
        offer_ring = first.open.shared_memory and self.ring_mib > 0
        try:
            for item in stream:
                if isinstance(item, EndOfLane):
                    acked.sent = max(acked.sent, item.next_seq)
                    yield end_response(item.next_seq, item.chain, item.tombstones)
                    # Keep the call open until the client acknowledged the tail (or left), so
                    # the final acknowledgements are recorded.
                    acked.wait_below(item.next_seq, context, self.draining)
                    return
                if not acked.wait_below(sent - self.window + 1, context, self.draining):
                    break
                if acked.error is not None or self.draining.is_set():
                    break
                if offer_ring:  # sized for the send window's batches, once their size is known
                    offer_ring = False
                    in_flight = self.window + 2 * per_message
                    size = ring_size(item.nbytes, in_flight, self.ring_mib)
                    acked.ring = Ring.create(lane, size)
                    if acked.ring is not None:
                        ring = acked.ring
                        yield pb.StreamBatchesResponse(
                            ring=pb.RingOffer(path=str(ring.path), size=ring.size, nonce=ring.nonce)
                        )
                group = [item]
                # Batches already produced join this message, as many as the client takes
                # and the send window allows (seq s needs acks up to s - window + 1); after
                # the first message the stream lingers a little for the rest of a burst.
                room = min(per_message, acked.value + self.window - item.seq) - 1
                if room > 0:
                    linger = self.linger if sent > start else 0.0
                    group += stream.ready(room, GROUP_MAX_BYTES - item.nbytes, linger)
                acked.sent = group[-1].seq + 1  # before the client can see (and ack) them
                offsets = None if acked.ring is None else acked.ring.place(group, acked.value)
                message = encode_batches(group, offsets)
                yield self.metrics.sent(message, group, in_ring=offsets is not None)
                sent = group[-1].seq + 1
        except Exception as exc:
            failure = exc
        finally:
            acked.close()
            if acked.ring is not None:
                acked.ring.close()
            self.hub.close_consumer(lane, consumer)
            self._forget(lane, name, consumer)
            self.metrics.stream_closed()
        # context.abort raises, so it is called outside the try block above.
        if acked.error is not None:
            context.abort(acked.code, acked.error)
        if self.draining.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "server is draining; reconnect later")
        if failure is not None:
            abort(context, failure)

    def _forget(self, lane: int, name: str, consumer: str) -> None:
        with self._lock:
            entry = self._named.get((lane, name))
            if entry is not None and entry[0] == consumer:
                del self._named[(lane, name)]

    def _read_acks(
        self,
        requests: Iterator[pb.StreamBatchesRequest],
        lane: int,
        consumer: str,
        acked: _AckState,
        context: grpc.ServicerContext,
    ) -> None:
        try:
            for msg in requests:
                kind = msg.WhichOneof("kind")
                if kind == "ring":
                    ring = acked.ring
                    problem = _ring_reply_problem(msg.ring)
                    if problem:
                        acked.fail(problem)
                    elif ring is None or ring.answered:
                        acked.fail(
                            "RingReply without a RingOffer to answer: send one only after "
                            "the server offered a ring, and only once"
                        )
                    else:
                        ring.answer(msg.ring.accepted, msg.ring.reason)
                        continue
                elif kind != "ack":
                    acked.fail(
                        "after OpenLane only Ack messages are allowed on a stream (and one "
                        "RingReply answering a RingOffer)"
                    )
                elif msg.ack.next_seq > acked.sent:
                    # Acknowledging unsent batches would let the lane run unboundedly ahead.
                    sent = (
                        f"sent seqs {acked.start}..{acked.sent - 1}"
                        if acked.sent > acked.start
                        else f"sent nothing yet (opened at seq {acked.start})"
                    )
                    acked.fail(
                        f"Ack(next_seq={msg.ack.next_seq}) acknowledges batches not sent yet: "
                        f"this stream {sent}; acknowledge only batches received"
                    )
                if acked.error is not None:
                    self.hub.close_consumer(lane, consumer)  # wakes a stream waiting in the hub
                    return
                self.hub.ack(lane, consumer, msg.ack.next_seq)
                acked.update(msg.ack.next_seq)
        except grpc.RpcError:
            pass
        except Exception:
            # e.g. a message that did not decode (the interceptor aborted the call): end the
            # stream, which may be waiting in the hub for the lane's next batch.
            log.debug("ack reader for lane %d ended", lane, exc_info=True)
            self.hub.close_consumer(lane, consumer)
        finally:
            acked.close()


class _AckState:
    """Highest acknowledged next_seq of one stream, with waiting for the send window."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.sent = start  # one past the last seq handed to gRPC
        self.value = start
        self.error: str | None = None
        self.code = grpc.StatusCode.INVALID_ARGUMENT
        self.closed = False
        self.ring: Ring | None = None  # the shared-memory ring offered to the client, if any
        self._cond = threading.Condition()

    def update(self, next_seq: int) -> None:
        with self._cond:
            if next_seq > self.value:
                self.value = next_seq
                self._cond.notify_all()

    def fail(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        with self._cond:
            if self.error is None:
                self.error = message
                self.code = code
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait_below(
        self, needed: int, context: grpc.ServicerContext, draining: threading.Event
    ) -> bool:
        """Wait until acks reach ``needed`` (the window has room); False if the stream ended."""
        with self._cond:
            while self.value < needed and self.error is None:
                if self.closed or not context.is_active() or draining.is_set():
                    return False
                self._cond.wait(0.2)
            return context.is_active()


def serialize_stream_response(response: pb.StreamBatchesResponse | bytes) -> bytes:
    """``StreamBatches``' response serializer: batches arrive already encoded (bytes)."""
    if isinstance(response, bytes):
        return response
    return response.SerializeToString()


def add_to_server(service: DataService, server: grpc.Server) -> None:
    """Register ``service`` like the generated ``add_DataServiceServicer_to_server``, except
    that ``StreamBatches`` responses may be pre-encoded bytes (see :mod:`.encoding`)."""
    unary: dict[str, tuple[Any, Any]] = {  # method -> (request, response) message classes
        "GetInfo": (pb.GetInfoRequest, pb.GetInfoResponse),
        "Checkpoint": (pb.CheckpointRequest, pb.CheckpointResponse),
        "Resume": (pb.ResumeRequest, pb.ResumeResponse),
    }
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(service, name),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        for name, (request, response) in unary.items()
    }
    handlers["StreamBatches"] = grpc.stream_stream_rpc_method_handler(
        service.StreamBatches,
        request_deserializer=pb.StreamBatchesRequest.FromString,
        response_serializer=serialize_stream_response,
    )
    described = pb.DESCRIPTOR.services_by_name["DataService"]
    if set(handlers) != set(described.methods_by_name):  # an RPC added to the proto only
        raise RuntimeError(f"DataService handlers {sorted(handlers)} do not match the proto")
    name = described.full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):  # grpcio >= 1.63
        server.add_registered_method_handlers(name, handlers)


def raise_not_found(checkpoint_id: str) -> Any:
    from ..engine.checkpoint import UnknownCheckpoint

    raise UnknownCheckpoint(
        f"unknown checkpoint id {checkpoint_id!r}: this server has no --state-dir"
    )


def _ring_reply_problem(reply: pb.RingReply) -> str:
    """Why a RingReply is refused ('' when it is fine)."""
    try:
        RequestLimits.check_ring_reply(reply)
    except InvalidRequest as exc:
        return str(exc)
    return ""


def _tensor_names(hub: LaneHub) -> list[str]:
    names = {"input_ids", "padding_mask"}
    for op in hub.plan.ops:
        if op.op_name in ("pack_flat", "pack_sequences"):
            names |= {"positions", "segment_ids"}
    return sorted(names)
