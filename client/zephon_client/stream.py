"""One ``StreamBatches`` call per lane: a reader thread that decodes and verifies batches."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

from .errors import ZephonClientError
from .wire import ChainMismatch, DecodedBatch, content_digest, decode_batch
from .wire import verify as verify_batch

logger = logging.getLogger(__name__)

BACKOFF_INITIAL = 0.1
BACKOFF_MAX = 2.0

# --------------------------------------------------------------------------------------------
# One StreamBatches call
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Item:
    """What a lane's reader thread hands to the consumer."""

    kind: str  # "batch" | "end" | "error" | "closed" (call ended without EndOfStream)
    batch: DecodedBatch | None = None
    end: pb.EndOfStream | None = None
    error: BaseException | None = None


class _Cancelled(Exception):
    """Put in a lane's queue when the client cancels the call."""


class LaneStream:
    """One ``StreamBatches`` call reading ``lane`` from ``start_seq`` (internal building block).

    A daemon thread reads the responses, checks their seqs, decodes them and (when
    ``verify``) checks their digests against ``previous_chain`` (``None``: unknown, so only
    the content digest is checked and the first batch's chain becomes the base), and puts
    :class:`_Item` objects in a queue of ``prefetch`` slots. :meth:`ack` sends an
    ``Ack``; :meth:`close` cancels the call and joins the thread.
    """

    def __init__(
        self,
        stub: pb_grpc.DataServiceStub,
        *,
        address: str,
        lane: int,
        start_seq: int,
        consumer: str,
        previous_chain: bytes | None,
        verify: bool,
        metadata: Sequence[tuple[str, str]] = (),
        prefetch: int = 4,
    ) -> None:
        self.address = address
        self.lane = lane
        self.start_seq = start_seq
        self.received = 0
        self._verify = verify
        self._previous_chain = previous_chain
        self._requests: queue.SimpleQueue[pb.StreamBatchesRequest | None] = queue.SimpleQueue()
        # Bounded: when the consumer lags, the reader stops reading and HTTP/2 flow control
        # holds the server back (besides its ack window), so memory stays small.
        self._items: queue.Queue[_Item] = queue.Queue(maxsize=max(1, prefetch))
        self._done = threading.Event()
        self._cancelled = threading.Event()
        self._drained = threading.Event()
        self._requests.put(
            pb.StreamBatchesRequest(
                open=pb.OpenLane(lane=lane, start_seq=start_seq, consumer=consumer)
            )
        )
        self._call = stub.StreamBatches(self._request_iterator(), metadata=tuple(metadata))
        self._thread = threading.Thread(target=self._read, name=f"zephon-lane-{lane}", daemon=True)
        self._thread.start()

    def get(self, timeout: float | None = None) -> _Item:
        """The next item (blocks; raises ``queue.Empty`` after ``timeout``)."""
        return self._items.get(timeout=timeout)

    def ack(self, next_seq: int) -> None:
        """Acknowledge every batch with seq < ``next_seq`` (no-op once the call is over)."""
        if not self._done.is_set():
            self._requests.put(pb.StreamBatchesRequest(ack=pb.Ack(next_seq=next_seq)))

    def cancel(self) -> None:
        """Cancel the call without waiting (idempotent)."""
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        self._call.cancel()
        self._requests.put(None)
        with contextlib.suppress(queue.Full):  # only a wake-up for a consumer blocked in get()
            self._items.put_nowait(_Item("error", error=_Cancelled()))

    def close(self, timeout: float = 1.0, *, flush: bool = False) -> None:
        """Cancel the call and join the reader thread (up to ``timeout`` seconds).

        ``flush`` first ends the request stream and waits (up to ``timeout / 4``) until the
        acks already queued were handed to gRPC, so the last ack is not lost to the cancel.
        """
        if flush and not self._cancelled.is_set():
            self._requests.put(None)
            self._drained.wait(timeout / 4)
            # Let the server see the acks and end the call itself (it waits for them after
            # EndOfStream) rather than racing them with a cancel.
            self._done.wait(timeout / 2)
        self.cancel()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the reader thread to finish."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _request_iterator(self) -> Iterator[pb.StreamBatchesRequest]:
        try:
            while True:
                request = self._requests.get()
                if request is None:
                    return
                yield request
        finally:
            self._drained.set()

    def _put(self, item: _Item) -> None:
        """Queue ``item``, waiting for room unless the call gets cancelled."""
        while not self._cancelled.is_set():
            try:
                self._items.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _read(self) -> None:
        expected = self.start_seq
        chain = self._previous_chain
        ended = False
        try:
            for response in self._call:
                kind = response.WhichOneof("kind")
                if kind == "batch" and not ended:
                    msg = response.batch
                    if msg.lane != self.lane or msg.seq != expected:
                        raise ZephonClientError(
                            None,
                            f"protocol error: expected lane {self.lane} seq {expected}, "
                            f"received lane {msg.lane} seq {msg.seq}",
                            lane=self.lane,
                            address=self.address,
                        )
                    batch = decode_batch(msg)
                    if self._verify:
                        if chain is None:
                            content = content_digest(batch.tensors)
                            if content != batch.digest:
                                raise ChainMismatch(
                                    batch.lane, batch.seq, "content digest", content, batch.digest
                                )
                        else:
                            verify_batch(batch, chain)
                    chain = batch.chain_digest
                    expected += 1
                    self.received += 1
                    self._put(_Item("batch", batch=batch))
                elif kind == "end" and not ended:
                    end = response.end
                    if end.next_seq != expected:
                        raise ZephonClientError(
                            None,
                            f"protocol error: EndOfStream at next_seq {end.next_seq}, "
                            f"expected {expected}",
                            lane=self.lane,
                            address=self.address,
                        )
                    if self._verify and chain is not None and end.chain_digest != chain:
                        raise ChainMismatch(
                            self.lane,
                            end.next_seq,
                            "end-of-stream chain digest",
                            chain,
                            end.chain_digest,
                        )
                    ended = True
                    self._put(_Item("end", end=end))
                elif ended:
                    pass  # nothing may follow EndOfStream; the lane already left the rotation
                else:
                    raise ZephonClientError(
                        None,
                        "protocol error: empty StreamBatchesResponse",
                        lane=self.lane,
                        address=self.address,
                    )
            if not ended:
                self._put(_Item("closed"))
        except grpc.RpcError as error:
            if not ended:
                self._put(_Item("error", error=error))
        except Exception as error:  # decode/verify/protocol errors reach the consumer in order
            self._call.cancel()
            self._put(_Item("error", error=error))
        finally:
            self._done.set()
            self._requests.put(None)


def _retryable(item: _Item, stream: LaneStream) -> bool:
    if item.kind == "closed":
        return True
    error = item.error
    if not isinstance(error, grpc.RpcError):
        return False
    code = error.code() if callable(getattr(error, "code", None)) else None  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    return stream.received > 0 and code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED)


def _describe(item: _Item) -> tuple[grpc.StatusCode | None, str]:
    if item.kind == "closed":
        return grpc.StatusCode.UNAVAILABLE, "the server ended the call without EndOfStream"
    error = item.error
    if isinstance(error, grpc.RpcError):
        code = error.code() if callable(getattr(error, "code", None)) else None  # type: ignore[attr-defined]
        details = error.details() if callable(getattr(error, "details", None)) else None  # type: ignore[attr-defined]
        return code, details or str(error)
    return None, str(error)
