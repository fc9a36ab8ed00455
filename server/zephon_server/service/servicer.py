"""The ``zephon.v1.DataService`` servicer: GetInfo, StreamBatches, Checkpoint, Resume.

A thin adapter over the delivery layer (:mod:`zephon_server.delivery`): ``StreamBatches``
checks the first client message (``OpenLane``), opens a
:class:`~zephon_server.delivery.streams.LaneStream`, feeds it the client's later messages from
a helper thread, and encodes what its message planner yields (:mod:`.encoding`). Every
decision about what a message carries is the planner's.

Every request is checked against :mod:`.limits` before it reaches the hub; requests that do
not decode never get here (:mod:`.malformed` answers them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

from .. import __version__
from ..delivery.hub import LaneHub, ReplayLimit
from ..delivery.message_planner import (
    LINGER,
    WINDOW,
    Batches,
    Message,
    MessagePolicy,
    RingOffered,
)
from ..delivery.ring import DEFAULT_MAX_MIB
from ..delivery.streams import LaneStream, Streams
from ..engine.checkpoint import CheckpointNotSaved, ResumeState
from .encoding import encode_batches
from .errors import InvalidRequest, abort
from .limits import RequestLimits
from .metrics import ServiceMetrics
from .ratelimit import RateLimitedLog
from .wire import end_response

log = logging.getLogger(__name__)

__all__ = ["LINGER", "WINDOW", "DataService", "add_to_server", "serialize_stream_response"]

_ONLY_ACKS = (
    "after OpenLane only Ack messages are allowed on a stream (and one RingReply answering a "
    "RingOffer)"
)


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
        self.streams = Streams(hub, MessagePolicy(window, linger, ring_mib), max_streams)
        self.ring_mib = ring_mib  # the largest shared-memory ring a stream gets; 0: none
        self.limits = RequestLimits(
            num_lanes=hub.num_lanes, served=tuple(hub.lanes), num_datasets=len(hub.plan.datasets)
        )
        self.reports = RateLimitedLog(log)
        self.draining = self.streams.draining

    @property
    def active_streams(self) -> int:
        return self.streams.active

    # -- unary ------------------------------------------------------------------------------

    def GetInfo(
        self, request: pb.GetInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetInfoResponse:
        try:
            self.limits.check_info(request)
        except InvalidRequest as exc:
            abort(context, exc)
        hub = self.hub
        tokenizers = [op for op in hub.plan.ops if op.op_name in ("tokenize", "render_chat")]
        store = hub.store
        return pb.GetInfoResponse(
            num_lanes=hub.num_lanes,
            fingerprint=hub.fingerprint,
            plan=hub.plan.explain(),
            acknowledged=_positions(hub.positions(request.consumer)),
            checkpoint_ids=store.ids() if store is not None else [],
            version=__version__,
            served_lanes=hub.lanes,
            tensor_names=_tensor_names(hub),
            tokenizer=getattr(tokenizers[-1], "tokenizer_spec", "") if tokenizers else "",
            flush_every_k_chunks=hub.plan.pipeline.flush_every_k_chunks,
            end_of_data=hub.plan.pipeline.end_of_data,
            common_end_seq=hub.common_end(),  # None (unset) until every lane's end is known
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
            checkpoint_id=cid, state=data, positions=_positions(state.positions())
        )

    def Resume(self, request: pb.ResumeRequest, context: grpc.ServicerContext) -> pb.ResumeResponse:
        kind = request.WhichOneof("source")
        if kind is None:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "ResumeRequest needs checkpoint_id or state"
            )
        try:
            self.limits.check_resume(request, kind)
            state, source = self._resume_state(request, kind)
            positions = self.hub.resume(state, source=source)
        except Exception as exc:
            abort(context, exc)
        log.info("resumed from %s at %s", source, positions)
        return pb.ResumeResponse(positions=_positions(positions), fingerprint=self.hub.fingerprint)

    def _resume_state(self, request: pb.ResumeRequest, kind: str) -> tuple[ResumeState, str]:
        """The checkpoint a Resume names (from the store) or carries, and how to log it."""
        if kind == "checkpoint_id":
            if self.hub.store is None:
                raise_not_found(request.checkpoint_id)
            assert self.hub.store is not None
            return self.hub.store.load(request.checkpoint_id), request.checkpoint_id
        return ResumeState.decode(request.state, self.hub.checkpoint_key), "bytes"

    # -- streaming --------------------------------------------------------------------------

    def StreamBatches(
        self, request_iterator: Iterator[pb.StreamBatchesRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.StreamBatchesResponse | bytes]:
        if self.draining.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "server is draining; retry elsewhere")
        if not self.streams.admit():
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"stream limit reached ({self.streams.max_streams} open streams); "
                "close streams or raise --max-streams",
            )
        try:
            yield from self._stream(request_iterator, context)
        finally:
            self.streams.leave()

    def _stream(
        self, requests: Iterator[pb.StreamBatchesRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.StreamBatchesResponse | bytes]:
        stream = self._open(requests, context)
        if not context.add_callback(stream.release):
            stream.release()  # the call already ended
        threading.Thread(
            target=self._read_acks,
            name=f"zephon-acks-{stream.lane}",
            args=(requests, stream),
            daemon=True,
        ).start()
        self.metrics.stream_opened()
        try:
            for message in stream.messages(context.is_active):
                yield self._encode(message)
        except Exception as exc:
            stream.failure = exc
        finally:
            stream.close()
            self.metrics.stream_closed()
        self._end(stream, context)  # context.abort raises: outside the try block above

    def _open(
        self, requests: Iterator[pb.StreamBatchesRequest], context: grpc.ServicerContext
    ) -> LaneStream:
        """The stream the first message (``OpenLane``) asks for, or the call aborted."""
        first = next(requests, None)
        if first is None or first.WhichOneof("kind") != "open":
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first StreamBatches message must be OpenLane(lane, start_seq)",
            )
        assert first is not None
        opening = first.open
        try:
            self.limits.check_open(opening)
            return self.streams.open(
                opening.lane,
                opening.start_seq,
                name=opening.consumer,
                peer=context.peer(),
                per_message=opening.max_batches_per_message,
                shared_memory=opening.shared_memory,
            )
        except ReplayLimit as exc:  # too many lanes regenerating at once: try again later
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Exception as exc:
            abort(context, exc)
        raise AssertionError("unreachable: context.abort raises")

    def _encode(self, message: Message) -> pb.StreamBatchesResponse | bytes:
        """The response for one planned message (batches are encoded by hand)."""
        if isinstance(message, Batches):
            data = encode_batches(message.batches, message.ring_offsets)
            in_ring = message.ring_offsets is not None
            return self.metrics.sent(data, message.batches, in_ring=in_ring)
        if isinstance(message, RingOffered):
            ring = message.ring
            offer = pb.RingOffer(path=str(ring.path), size=ring.size, nonce=ring.nonce)
            return pb.StreamBatchesResponse(ring=offer)
        end = message.end
        return end_response(end.next_seq, end.chain, end.tombstones)

    def _end(self, stream: LaneStream, context: grpc.ServicerContext) -> None:
        """End the call with the status the stream's outcome calls for (OK when none)."""
        acks = stream.acks
        if acks.error is not None:
            code = grpc.StatusCode.ABORTED if acks.superseded else grpc.StatusCode.INVALID_ARGUMENT
            context.abort(code, acks.error)
        if self.draining.is_set():
            context.abort(grpc.StatusCode.UNAVAILABLE, "server is draining; reconnect later")
        if stream.failure is not None:
            abort(context, stream.failure)

    def _read_acks(self, requests: Iterator[pb.StreamBatchesRequest], stream: LaneStream) -> None:
        """Feed the client's messages after ``OpenLane`` to the stream (its own thread)."""
        try:
            for msg in requests:
                kind = msg.WhichOneof("kind")
                if kind == "ack":
                    going = stream.receive_ack(msg.ack.next_seq)
                elif kind == "ring":
                    reply = msg.ring
                    problem = _ring_reply_problem(reply)
                    going = stream.receive_ring_reply(reply.accepted, reply.reason, problem)
                else:
                    going = stream.reject(_ONLY_ACKS)
                if not going:
                    return
        except grpc.RpcError:
            pass
        except Exception:
            # e.g. a message that did not decode (the interceptor aborted the call)
            stream.abandon()
        finally:
            stream.acks.close()


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


def _positions(positions: dict[int, int]) -> list[pb.LanePosition]:
    return [pb.LanePosition(lane=lane, next_seq=seq) for lane, seq in positions.items()]


def _tensor_names(hub: LaneHub) -> list[str]:
    names = {"input_ids", "padding_mask"}
    for op in hub.plan.ops:
        names.update(op.output_tensors())
    return sorted(names)
