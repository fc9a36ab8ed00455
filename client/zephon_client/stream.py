"""One ``StreamBatches`` call per lane, read on the client's I/O loop: decode and verify."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

from . import io_loop
from .errors import ZephonClientError
from .identity import PipelineIdentity
from .ring import open_ring, reply
from .wire import ChainMismatch, DecodedBatch, chain_digest, content_digest, decode_batch
from .wire import verify as verify_batch

logger = logging.getLogger(__name__)

BACKOFF_INITIAL = 0.1
BACKOFF_MAX = 2.0

ACK_EVERY = 4
"""A lane's Ack goes out once this many consumed batches are unacknowledged..."""
ACK_INTERVAL = 0.5
"""...or this many seconds after the previous one (an I/O-loop timer sends it)."""

BATCHES_PER_MESSAGE = 8
"""Default ``OpenLane.max_batches_per_message``: the server may put up to this many ready
batches in one message (a ``BatchGroup``); each still reaches the consumer alone."""

# --------------------------------------------------------------------------------------------
# One StreamBatches call
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Item:
    """What a lane's reader hands to the consumer."""

    kind: str  # "batch" | "end" | "error" | "closed" (call ended without EndOfStream)
    batch: DecodedBatch | None = None
    end: pb.EndOfStream | None = None
    error: BaseException | None = None


class _Cancelled(Exception):
    """Put in a lane's mailbox when the client cancels the call."""


class LaneStream:
    """One ``StreamBatches`` call reading ``lane`` from ``start_seq`` (internal building block).

    A coroutine on the client's I/O loop (:mod:`~zephon_client.io_loop`) reads the
    responses, checks their seqs, decodes them and (when ``verify``) checks their digests
    against ``previous_chain`` (``None``: unknown, so only the content digest is checked and
    the first batch's chain becomes the base), and hands :class:`_Item` objects to the
    consumer through a mailbox of ``prefetch`` slots. With ``shared_memory`` it accepts the
    server's shared-memory ring when it can map it (:mod:`~zephon_client.ring`). ``stub`` is
    a ``grpc.aio`` stub made on that loop.

    With ``expect``, the call first asks the server's ``GetInfo`` (deadline ``info_timeout``)
    and fails with :class:`~zephon_client.errors.PipelineMismatch` unless it reports that
    pipeline (:mod:`~zephon_client.identity`). Whatever ``verify`` says, the call's first batch
    (or EndOfStream) must continue ``previous_chain`` when it is known: one 64-byte hash per
    call, which a stream of another pipeline cannot pass.

    :meth:`ack` acknowledges (coalesced, see there); :meth:`leave` ends the call politely
    (pending Ack sent first); :meth:`close` cancels it and waits for the coroutine to finish.
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
        batches_per_message: int = BATCHES_PER_MESSAGE,
        shared_memory: bool = True,
        expect: PipelineIdentity | None = None,
        info_timeout: float | None = None,
    ) -> None:
        self.address = address
        self.lane = lane
        self.start_seq = start_seq
        self.received = 0
        self._verify = verify
        self._expect = expect
        self._info_timeout = info_timeout
        self._previous_chain = previous_chain
        self._metadata = tuple(metadata)
        self._open = pb.StreamBatchesRequest(
            open=pb.OpenLane(
                lane=lane,
                start_seq=start_seq,
                consumer=consumer,
                max_batches_per_message=batches_per_message,
                shared_memory=shared_memory,
            )
        )
        self._ring: Any = None  # the server's shared-memory ring, once mapped
        self._per_message = max(batches_per_message, 1)
        self._expected = start_seq
        self._chain = previous_chain
        # Bounded: when the consumer lags, the reader stops reading and HTTP/2 flow control
        # holds the server back (besides its ack window), so memory stays small.
        self._items: io_loop.Mailbox[_Item] = io_loop.Mailbox(prefetch)
        self._requests: asyncio.Queue[pb.StreamBatchesRequest | None] = asyncio.Queue()
        self._call: Any = None
        self._task: asyncio.Task[None] | None = None
        self._done = threading.Event()
        self._cancelled = threading.Event()
        # Acks (on the I/O loop): wanted = consumed so far, sent = queued for gRPC.
        self._ack_wanted = self._ack_sent = start_seq
        self._ack_sent_at = float("-inf")
        self._ack_timer: asyncio.TimerHandle | None = None
        io_loop.submit(self._read(stub))

    def get(self, timeout: float | None = None) -> _Item:
        """The next item (blocks; raises ``queue.Empty`` after ``timeout``)."""
        return self._items.get(timeout=timeout)

    def ack(self, next_seq: int) -> None:
        """Acknowledge every batch with seq < ``next_seq`` (no-op once the call is over).

        Acks are coalesced: one goes out once :data:`ACK_EVERY` consumed batches are
        unacknowledged or :data:`ACK_INTERVAL` seconds after the previous one, so at high batch
        rates the server's acknowledged position trails by at most that much (a slow trainer
        acks every batch). :meth:`leave` and ``close(flush=True)`` send the rest.
        """
        if not self._done.is_set():
            io_loop.call(self._ack, next_seq)

    def leave(self) -> bool:
        """Send the pending Ack, end the request stream and drop further batches, so the
        call ends soon on its own (:meth:`join` waits for it) with every Ack read by the
        server. :meth:`close` (or :meth:`cancel`) still ends it if it does not. False when
        the call is already over or cancelled (nothing to send)."""
        if self._done.is_set() or self._cancelled.is_set():
            return False
        self._items.discard()
        io_loop.call(self._end_requests)
        return True

    def _ack(self, next_seq: int) -> None:
        if next_seq <= self._ack_wanted:
            return
        self._ack_wanted = next_seq
        now = io_loop.loop().time()
        if next_seq - self._ack_sent >= ACK_EVERY or now - self._ack_sent_at >= ACK_INTERVAL:
            self._send_ack()
        elif self._ack_timer is None:
            self._ack_timer = io_loop.loop().call_at(
                self._ack_sent_at + ACK_INTERVAL, self._send_ack
            )

    def _send_ack(self) -> int:
        """Queue an Ack for everything consumed (on the I/O loop); returns its next_seq."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if self._ack_wanted > self._ack_sent:
            self._ack_sent = self._ack_wanted
            self._ack_sent_at = io_loop.loop().time()
            self._requests.put_nowait(pb.StreamBatchesRequest(ack=pb.Ack(next_seq=self._ack_sent)))
        return self._ack_sent

    def _end_requests(self) -> None:
        self._send_ack()
        self._requests.put_nowait(None)

    def cancel(self) -> None:
        """Cancel the call without waiting (idempotent)."""
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        io_loop.call(self._cancel_call)
        # Only a wake-up for a consumer blocked in get().
        self._items.put_nowait(_Item("error", error=_Cancelled()))

    def close(self, timeout: float = 1.0, *, flush: bool = False) -> None:
        """Cancel the call and wait for its reader to finish (up to ``timeout`` seconds).

        ``flush`` first leaves politely (:meth:`leave`: the pending Ack goes out, the request
        stream ends) and gives the call up to ``timeout / 2`` to end on its own, so the last
        Ack is not lost to the cancel (the server waits for it after EndOfStream).
        """
        if flush and self.leave():
            self.join(timeout / 2)
        self.cancel()
        self.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the reader to finish."""
        self._done.wait(timeout)

    def _cancel_call(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._task is not None:
            self._task.cancel()  # also when it waits for room in the mailbox

    async def _request_iterator(self) -> AsyncIterator[pb.StreamBatchesRequest]:
        yield self._open
        while True:
            request = await self._requests.get()
            if request is None:
                return
            yield request

    async def _read(self, stub: pb_grpc.DataServiceStub) -> None:
        ended = False
        self._task = asyncio.current_task()
        try:
            if self._expect is not None:
                info = await stub.GetInfo(
                    pb.GetInfoRequest(), metadata=self._metadata, timeout=self._info_timeout
                )
                self._expect.check(info, address=self.address, lane=self.lane)
            self._call = stub.StreamBatches(self._request_iterator(), metadata=self._metadata)
            if self._cancelled.is_set():
                self._call.cancel()
            ended = await self._receive(self._call)
            if not ended:
                self._items.put_nowait(_Item("closed"))
        except asyncio.CancelledError:
            if not ended:
                self._items.put_nowait(_Item("error", error=_Cancelled()))
        except grpc.RpcError as error:
            if not ended:
                self._items.put_nowait(_Item("error", error=error))
        except Exception as error:  # decode/verify/protocol errors reach the consumer in order
            if self._call is not None:
                self._call.cancel()
            self._items.put_nowait(_Item("error", error=error))
        finally:
            if self._ack_timer is not None:
                self._ack_timer.cancel()
                self._ack_timer = None
            if self._ring is not None:  # every batch read from it was copied out
                self._ring.close()
                self._ring = None
            self._done.set()
            self._requests.put_nowait(None)

    async def _receive(self, call: Any) -> bool:
        """Read the call's responses into the mailbox; True once ``EndOfStream`` arrived."""
        self._expected = self.start_seq
        self._chain = self._previous_chain
        ended = False
        async for response in call:
            kind = response.WhichOneof("kind")
            if ended:
                pass  # nothing may follow EndOfStream; the lane already left the rotation
            elif kind == "batch":
                await self._take(response.batch)
            elif kind == "batches":
                group = response.batches.batches
                if not group:
                    raise self._protocol_error("empty BatchGroup")
                if len(group) > self._per_message:
                    raise self._protocol_error(
                        f"BatchGroup of {len(group)} batches; this stream takes at most "
                        f"{self._per_message} per message"
                    )
                for msg in group:
                    await self._take(msg)
            elif kind == "ring":
                if self._ring is not None:
                    raise self._protocol_error("a second RingOffer")
                self._ring, reason = open_ring(response.ring)
                if reason:
                    logger.info(
                        "lane %d: not using the server's shared memory: %s", self.lane, reason
                    )
                self._requests.put_nowait(reply(self._ring, reason))
            elif kind == "end":
                end = response.end
                if end.next_seq != self._expected:
                    raise self._protocol_error(
                        f"EndOfStream at next_seq {end.next_seq}, expected {self._expected}"
                    )
                chain = self._chain
                checked = self._verify or self.received == 0  # the call's first message
                if checked and chain is not None and end.chain_digest != chain:
                    raise ChainMismatch(
                        self.lane,
                        end.next_seq,
                        "end-of-stream chain digest",
                        chain,
                        end.chain_digest,
                    )
                ended = True
                await self._items.put(_Item("end", end=end))
            else:
                raise self._protocol_error("empty StreamBatchesResponse")
        return ended

    async def _take(self, msg: pb.SampleBatch) -> None:
        """Check, decode and verify one batch of the lane, then hand it to the consumer."""
        if msg.lane != self.lane or msg.seq != self._expected:
            raise self._protocol_error(
                f"expected lane {self.lane} seq {self._expected}, "
                f"received lane {msg.lane} seq {msg.seq}"
            )
        batch = decode_batch(msg, self._ring)
        if self._verify:
            if self._chain is None:
                content = content_digest(batch.tensors)
                if content != batch.digest:
                    raise ChainMismatch(
                        batch.lane, batch.seq, "content digest", content, batch.digest
                    )
            else:
                verify_batch(batch, self._chain)
        elif self.received == 0 and self._chain is not None:
            # The seam: the call's first batch must continue the consumed chain.
            linked = chain_digest(self._chain, batch.digest)
            if linked != batch.chain_digest:
                raise ChainMismatch(
                    batch.lane, batch.seq, "chain digest", linked, batch.chain_digest
                )
        self._chain = batch.chain_digest
        self._expected += 1
        self.received += 1
        await self._items.put(_Item("batch", batch=batch))

    def _protocol_error(self, what: str) -> ZephonClientError:
        return ZephonClientError(
            None, f"protocol error: {what}", lane=self.lane, address=self.address
        )


CORE_INTERNAL_DETAILS = "Internal error from Core"
"""The details ``grpc.aio`` gives a call whose request write failed in the client's gRPC core
(the connection broke under it): a transport failure, not a status the server sent."""


def _retryable(item: _Item, stream: LaneStream) -> bool:
    """Whether a lane's failed call should be reopened: transport failures (``UNAVAILABLE``,
    the client core's own ``INTERNAL``) always; ``INTERNAL``/``CANCELLED`` after batches
    arrived (a call broken mid-way). A server's ``INTERNAL`` at open ("pipeline failed") is
    final."""
    if item.kind == "closed":
        return True
    error = item.error
    if not isinstance(error, grpc.RpcError):
        return False
    code, details = _describe(item)
    if code == grpc.StatusCode.UNAVAILABLE:
        return True
    if code == grpc.StatusCode.INTERNAL and details == CORE_INTERNAL_DETAILS:
        return True  # the client's own transport failed (e.g. writing an Ack on a reset link)
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
