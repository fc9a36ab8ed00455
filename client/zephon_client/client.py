"""The trainer-side client: stream a rank's lanes from Zephon servers as numpy batches.

A :class:`DataClient` for ``(rank, world_size)`` asks every server for its ``GetInfo``, picks
the rank's lanes with :func:`~zephon_client.mapping.lanes_for_rank` and opens one
``StreamBatches`` call per lane. The calls run on one background I/O thread
(:mod:`~zephon_client.io_loop`, shared by the clients of a process), which decodes (and
verifies) each lane's batches into a small bounded queue (``prefetch``). Iterating the
client yields :class:`Batch` objects in strict round-robin over the rank's lanes in lane
order; a lane that ends drops out of the rotation and iteration stops when every lane has
ended.

Consumption and positions
    A yielded batch counts as *consumed* when the caller asks for the next one (or calls
    :meth:`DataClient.mark_consumed`). Consuming a batch advances the lane's position
    (``next_seq``) and chain digest and acknowledges it to the server (``Ack(seq + 1)``), which
    lets the server send more (it sends at most its window beyond the last acknowledgement).
    Acks are coalesced: each lane sends one once 4 consumed batches are unacknowledged or
    0.5 s after its previous one, and :meth:`DataClient.close` (or leaving the loop early)
    sends the rest, so the server's acknowledged positions trail a fast consumer by at most
    that much.

Resuming
    :meth:`DataClient.state_dict` holds every lane's position and chain digest;
    :meth:`DataClient.load_state_dict` makes the next iteration open the lanes there and check
    that the stream continues the saved chain. When the number of ranks changes between runs
    (the lane count never does), save the state_dict of *every* rank and load their union
    (:func:`merge_state_dicts`) into each new rank, or use a server checkpoint
    (:meth:`DataClient.checkpoint` / :meth:`DataClient.resume`). Without a loaded state a
    client starts each lane at the server's acknowledged position (0 on a fresh server). A
    rank with tensor/pipeline-parallel peers (``data_parallel_size`` below ``world_size``)
    starts instead where its consumer name last acknowledged in the server's current run, or,
    on a lane that name never read there, where that run started (0, or the position the
    server resumed at): a peer that connects after its group started reads the batches the
    others read, not from where they are.

Rotation start
    The rotation starts at the lane with the smallest position (lowest lane on ties) and then
    cycles in lane order, so a client resumed from positions saved mid-cycle yields the same
    sequence as the uninterrupted run.

Reconnecting
    When a call fails with ``UNAVAILABLE`` (or the client's own gRPC core reports
    ``INTERNAL`` because the connection broke under a write, or the call breaks mid-way with
    ``INTERNAL``/``CANCELLED``, or ends without ``EndOfStream``), the client reopens the lane
    at its consumed position with exponential backoff (0.1 s doubling to 2 s) for up to
    ``reconnect_timeout`` seconds; the first batch after the gap must chain from the last
    consumed chain digest. Other status codes raise
    :class:`~zephon_client.errors.ZephonClientError` with the server's message.

Same pipeline or stop
    Every stream the client opens (the first and each reconnection) first asks the server's
    ``GetInfo`` and raises :class:`~zephon_client.errors.PipelineMismatch` when the server now
    serves another pipeline (fingerprint or lane count differs from the construction's), and
    each stream's first batch must continue the lane's consumed chain digest; both hold with
    ``verify=False`` too (see :mod:`~zephon_client.identity`). :meth:`DataClient.checkpoint`
    checks the same before asking for a checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from zephon_proto.v1 import data_service_pb2 as pb

from .channel import DEFAULT_CHANNEL_OPTIONS, Endpoint, TLSConfig, auth_metadata
from .connect_hint import diagnose
from .errors import ZephonClientError
from .identity import PipelineIdentity
from .iteration import Iteration, PendingBatch
from .mapping import lanes_for_rank
from .options import checkpoint_positions, consumer_name, seconds, whole_number
from .servers import check_same_pipeline, route, server_addresses
from .state import STATE_VERSION, parse_state
from .stream import (
    BACKOFF_INITIAL,
    BACKOFF_MAX,
    BATCHES_PER_MESSAGE,
    LaneStream,
    _describe,
    _Item,
    _retryable,
)
from .unary import call_unary
from .wire import CHAIN_SEED, DecodedBatch, LaneEnd, decode_end

logger = logging.getLogger(__name__)

Batch = DecodedBatch
"""A decoded lane batch: ``lane``, ``seq``, ``tensors`` (name → read-only numpy array),
``rows`` (row sources), ``closed`` (closed documents), ``digest`` and ``chain_digest``."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A server checkpoint: its ``id`` in the server's state directory, its ``state`` bytes
    (usable with :meth:`DataClient.resume` on any server of the pipeline), the ``positions``
    (lane → next_seq) it holds for every lane, and the ``address`` of the server that wrote it.
    """

    id: str
    state: bytes
    positions: dict[int, int]
    address: str = ""


# --------------------------------------------------------------------------------------------
# DataClient
# --------------------------------------------------------------------------------------------


class DataClient:
    """Streams one trainer rank's lanes from one or several Zephon servers.

    ``address`` is ``host:port`` or a sequence of them: with several, every server is asked
    for its ``GetInfo``; they must share the pipeline fingerprint and lane count, and each
    lane is read from the first server that serves it (lane-sharded servers). The rank's
    lanes come from :func:`~zephon_client.mapping.lanes_for_rank` with ``rank``,
    ``world_size``, ``data_parallel_size`` (default ``world_size``) and ``interleaved``.

    ``consumer`` names this reader to the server (default ``"rank<rank>"``); peers that read
    the same lanes must use distinct names. ``verify`` checks every batch's content and chain
    digests (:class:`~zephon_client.wire.ChainMismatch` on a mismatch); with or without it,
    a server that now serves another pipeline raises
    :class:`~zephon_client.errors.PipelineMismatch` when a stream is (re)opened. ``auth_token``
    (default: ``$ZEPHON_AUTH_TOKEN``) is sent as ``authorization: Bearer <token>``; ``tls``
    makes the channels TLS/mTLS. ``reconnect_timeout`` bounds how long ``UNAVAILABLE`` is
    retried (streams and unary calls); ``rpc_timeout`` is the deadline of unary calls;
    ``prefetch`` is how many decoded batches each lane's reader keeps ahead of the consumer.
    ``batches_per_message`` is the most batches the server may send in one message when
    several are ready (fewer messages cost less per batch; 1: one per message, as older
    clients get; each batch reaches the loop alone either way, but until its ``rows`` and
    ``closed`` are read it keeps its whole message in memory). ``shared_memory`` lets a
    server on the same host pass tensor bytes through a shared-memory ring instead of the
    messages (less client CPU per token, measured in docs/decisions.md; a remote server's offer
    is declined and the bytes come in the messages; the batches are the same either way).

    Iterate it (``for batch in client``) to get :class:`Batch` objects; see the module
    documentation for consumption, positions, resuming and reconnecting. Construction calls
    ``GetInfo`` (raising :class:`~zephon_client.errors.ZephonClientError` if a server cannot be
    reached within ``reconnect_timeout``). Use it as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        data_parallel_size: int | None = None,
        interleaved: bool = False,
        consumer: str | None = None,
        verify: bool = True,
        auth_token: str | None = None,
        tls: TLSConfig | None = None,
        reconnect_timeout: float = 60.0,
        rpc_timeout: float | None = 300.0,
        prefetch: int = 4,
        batches_per_message: int = BATCHES_PER_MESSAGE,
        shared_memory: bool = True,
        channel_options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
    ) -> None:
        addresses = server_addresses(address)
        self.rank = rank
        self.world_size = world_size
        self.consumer = consumer_name(consumer if consumer is not None else f"rank{rank}")
        self.verify = verify
        self.reconnect_timeout = seconds("reconnect_timeout", reconnect_timeout)
        self.rpc_timeout = seconds("rpc_timeout", rpc_timeout, allow_none=True, allow_zero=False)
        self.prefetch = whole_number("prefetch", prefetch, 1, "decoded batches kept per lane")
        self.batches_per_message = whole_number(
            "batches_per_message", batches_per_message, 1, "1: one batch per message"
        )
        self.shared_memory = bool(shared_memory)
        self._metadata = auth_metadata(auth_token)
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._epoch = 0
        self._run: Iteration | None = None
        self._pending: PendingBatch | None = None
        self._ends: dict[int, LaneEnd] = {}
        self._endpoints = [Endpoint(a, tls=tls, options=channel_options) for a in addresses]
        try:
            self._connect(data_parallel_size, interleaved)
        except BaseException:
            for endpoint in self._endpoints:
                endpoint.close()
            raise
        self._positions: dict[int, int] = {}
        self._chains: dict[int, bytes | None] = {}
        for lane in self._lanes:
            acknowledged = {p.lane: p.next_seq for p in self._routes[lane].info.acknowledged}
            self._set_position(lane, int(acknowledged.get(lane, 0)), None)
        logger.info(
            "zephon client %s (rank %d of %d): lanes %s of %d from %s, positions %s",
            self.consumer,
            rank,
            world_size,
            self._lanes,
            self._num_lanes,
            ", ".join(addresses),
            self._positions,
        )

    def _connect(self, data_parallel_size: int | None, interleaved: bool) -> None:
        """Ask every server for its info, check they serve one pipeline, and route this
        rank's lanes to the servers that serve them."""
        # A rank with tensor/pipeline-parallel peers (they read the same lanes) asks for its
        # own positions: a peer that connects late must not start where the others are.
        peers = data_parallel_size is not None and self.world_size // data_parallel_size > 1
        request = pb.GetInfoRequest(consumer=self.consumer if peers else "")
        for endpoint in self._endpoints:
            endpoint.info = self._unary(endpoint, "GetInfo", request)
        check_same_pipeline(self._endpoints)
        self._identity = PipelineIdentity.of(self._endpoints[0].info)
        self._num_lanes = self._identity.num_lanes
        self._fingerprint = self._identity.fingerprint
        self._lanes = lanes_for_rank(
            self.rank,
            self.world_size,
            self._num_lanes,
            data_parallel_size=data_parallel_size,
            interleaved=interleaved,
        )
        self._routes = {lane: route(self._endpoints, lane, self.rank) for lane in self._lanes}

    # -- description ---------------------------------------------------------------------------

    @property
    def lanes(self) -> list[int]:
        """This rank's lanes, ascending."""
        return list(self._lanes)

    @property
    def num_lanes(self) -> int:
        """The pipeline's lane count ``L``."""
        return self._num_lanes

    @property
    def fingerprint(self) -> str:
        """The pipeline fingerprint every server reported."""
        return self._fingerprint

    @property
    def addresses(self) -> list[str]:
        """The server addresses, as given."""
        return [e.address for e in self._endpoints]

    @property
    def routes(self) -> dict[int, str]:
        """Lane → address of the server it is read from, for this rank's lanes."""
        return {lane: endpoint.address for lane, endpoint in self._routes.items()}

    @property
    def positions(self) -> dict[int, int]:
        """Lane → next_seq (every batch with a smaller seq consumed), for this rank's lanes."""
        with self._lock:
            return dict(self._positions)

    @property
    def lane_ends(self) -> dict[int, LaneEnd]:
        """Lane → its :class:`~zephon_client.wire.LaneEnd`, for this rank's lanes that have
        ended (an iteration reached their ``EndOfStream``; cleared when positions are set by
        ``load_state_dict`` or ``resume``): the final position and the documents closed after
        the lane's last batch (records dropped since, with the reason), which no batch carries."""
        with self._lock:
            return dict(self._ends)

    def get_info(self, address: str | None = None) -> pb.GetInfoResponse:
        """A fresh ``GetInfo`` answer of the server at ``address`` (default: the first)."""
        return self._unary(self._endpoint(address), "GetInfo", pb.GetInfoRequest())

    def __repr__(self) -> str:
        return (
            f"DataClient(rank={self.rank}, world_size={self.world_size}, lanes={self._lanes}, "
            f"addresses={self.addresses})"
        )

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's resume state as a plain dict.

        ``{"version": 1, "fingerprint": str, "positions": {lane: next_seq},
        "chains": {lane: chain digest hex}}`` (a lane's chain is missing when unknown, right
        after a server-side resume). The batch yielded last is included only once consumed
        (the next batch was asked for, or :meth:`mark_consumed` was called).
        """
        with self._lock:
            return {
                "version": STATE_VERSION,
                "fingerprint": self._fingerprint,
                "positions": dict(self._positions),
                "chains": {
                    lane: chain.hex() for lane, chain in self._chains.items() if chain is not None
                },
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a :meth:`state_dict`, possibly JSON round-tripped).

        ``state`` must hold a position for each of this rank's lanes; extra lanes are ignored,
        so loading the union of every old rank's state (:func:`merge_state_dicts`) resumes
        with a different number of ranks. The next batch of each lane must chain from the
        saved chain digest. A state of another pipeline (different fingerprint) raises
        :class:`~zephon_client.errors.ZephonClientError` (``FAILED_PRECONDITION``). An
        iteration in progress restarts from the loaded positions.
        """
        if self._closed.is_set():
            raise ZephonClientError(None, "the client is closed")
        _version, fingerprint, positions, chains = parse_state(state)
        if fingerprint is not None and fingerprint != self._fingerprint:
            raise ZephonClientError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"state_dict is from another pipeline: its fingerprint is {fingerprint}, "
                f"the server's is {self._fingerprint}",
            )
        missing = [lane for lane in self._lanes if lane not in positions]
        if missing:
            raise ValueError(
                f"state_dict has no position for lanes {missing} of rank {self.rank} (it holds "
                f"lanes {sorted(positions)}); when the number of ranks changes, load the union "
                "of every old rank's state_dict (merge_state_dicts) or resume a server "
                "checkpoint"
            )
        with self._lock:
            for lane in self._lanes:
                self._set_position(lane, positions[lane], chains.get(lane))
            self._restart_iteration()

    def mark_consumed(self) -> None:
        """Count the batch yielded last as consumed now (idempotent).

        Normally a batch is consumed when the next one is asked for; call this after training
        on a batch and before :meth:`state_dict` (or :meth:`checkpoint`) when saving inside
        the loop, so the saved state does not deliver that batch again.
        """
        self._consume_pending()

    # -- server checkpoints ------------------------------------------------------------------------

    def checkpoint(
        self,
        tag: str = "",
        positions: Mapping[int, int] | None = None,
        *,
        address: str | None = None,
    ) -> CheckpointInfo:
        """Ask the server to persist a checkpoint; returns its id, bytes and positions.

        ``positions`` (lane → next_seq) defaults to this client's consumed positions; lanes not
        given take the server's acknowledged positions. With several servers, ``address``
        picks one; without it the positions' lanes must all be served by one server. A server
        that now serves another pipeline raises :class:`~zephon_client.errors.PipelineMismatch`
        (its checkpoint would not resume this stream).
        """
        if positions is None:
            with self._lock:
                wanted = dict(self._positions)
            endpoint = self._checkpoint_endpoint(wanted, address)
            wanted = {lane: seq for lane, seq in wanted.items() if endpoint.serves(lane)}
        else:
            wanted = checkpoint_positions(positions)
            endpoint = self._checkpoint_endpoint(wanted, address)
        info = self._unary(endpoint, "GetInfo", pb.GetInfoRequest())
        self._identity.check(info, address=endpoint.address)
        request = pb.CheckpointRequest(
            positions=[
                pb.LanePosition(lane=lane, next_seq=seq) for lane, seq in sorted(wanted.items())
            ],
            tag=tag,
        )
        response = self._unary(endpoint, "Checkpoint", request)
        info = CheckpointInfo(
            id=response.checkpoint_id,
            state=response.state,
            positions={p.lane: p.next_seq for p in response.positions},
            address=endpoint.address,
        )
        logger.info("checkpoint %s on %s at %s", info.id, endpoint.address, info.positions)
        return info

    def resume(
        self,
        checkpoint_id: str | None = None,
        state: bytes | None = None,
        *,
        address: str | None = None,
    ) -> dict[int, int]:
        """Reset the server(s) to a checkpoint (by id or bytes) and continue from it.

        Calls ``Resume`` on ``address``, or on every server this rank reads from, checks the
        fingerprint, and sets this rank's positions to the checkpoint's; the chain digests are
        unknown after a server resume, so the next batch of each lane becomes the new chain
        base (its seq and content digest are still checked). An iteration in progress
        restarts. Returns the positions of every lane. ``Resume`` resets the whole server:
        with many ranks call it from one, then have the others :meth:`load_state_dict` the
        returned positions (or construct their clients afterwards).
        """
        if (checkpoint_id is None) == (state is None):
            raise ValueError("resume() takes exactly one of checkpoint_id or state")
        if checkpoint_id is not None:
            request = pb.ResumeRequest(checkpoint_id=checkpoint_id)
        else:
            request = pb.ResumeRequest(state=state)
        if address is not None:
            endpoints = [self._endpoint(address)]
        else:
            endpoints = list(dict.fromkeys(self._routes[lane] for lane in self._lanes))
        per_server: dict[str, dict[int, int]] = {}
        merged: dict[int, int] = {}
        for endpoint in endpoints:
            try:
                response = self._unary(endpoint, "Resume", request)
            except ZephonClientError as exc:
                if not per_server:
                    raise
                raise ZephonClientError(  # the others were reset: say so, never half-silent
                    exc.code,
                    f"{exc.message} (already resumed to it: {', '.join(per_server)}; with "
                    "lane-sharded servers, resume each with its own checkpoint and address=)",
                    address=endpoint.address,
                ) from None
            if response.fingerprint and response.fingerprint != self._fingerprint:
                raise ZephonClientError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"resumed pipeline fingerprint {response.fingerprint} differs from "
                    f"{self._fingerprint}",
                    address=endpoint.address,
                )
            positions = {p.lane: p.next_seq for p in response.positions}
            per_server[endpoint.address] = positions
            for lane, seq in positions.items():
                merged.setdefault(lane, seq)
        self._apply_resumed(per_server)
        logger.info("resumed %s: positions %s", checkpoint_id or "from state bytes", merged)
        return merged

    def _apply_resumed(self, per_server: dict[str, dict[int, int]]) -> None:
        """Set the positions of this rank's lanes on the servers that were resumed (each from
        its own answer; a lane of a server not resumed keeps its position), all or none, and
        restart an iteration in progress."""
        found: dict[int, int] = {}
        for lane in self._lanes:
            answer = per_server.get(self._routes[lane].address)
            if answer is None:
                continue  # its server was not reset
            if lane not in answer:
                raise ZephonClientError(
                    None,
                    f"the Resume answer of {self._routes[lane].address} has no position for "
                    f"lane {lane}, which this client reads from it",
                    lane=lane,
                )
            found[lane] = int(answer[lane])
        with self._lock:
            for lane, seq in found.items():
                self._set_position(lane, seq, None)
            self._restart_iteration()

    # -- iteration -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        return self.batches()

    def batches(self) -> Iterator[Batch]:
        """Yield this rank's batches in strict round-robin over its lanes until all end.

        Starting a new iteration supersedes one in progress (which then raises). Breaking out
        leaves the batch yielded last unconsumed (it is delivered again) unless
        :meth:`mark_consumed` was called.
        """
        if self._closed.is_set():
            raise ZephonClientError(None, "the client is closed")
        run = Iteration()
        with self._lock:
            previous = self._run
            if previous is not None:
                previous.superseded = True
                previous.cancel()
            self._run = run
            self._pending = None
        return self._iterate(run)

    def _iterate(self, run: Iteration) -> Iterator[Batch]:
        try:
            while True:
                self._consume_pending(run)
                with self._lock:
                    if self._closed.is_set():
                        return
                    if run.superseded:
                        raise ZephonClientError(
                            None, "this iteration was superseded by a newer one on this client"
                        )
                    if run.epoch != self._epoch:
                        self._start(run)
                if not run.order:
                    return
                lane = run.order[run.index]
                item = self._next_item(run, lane)
                if item is None:
                    continue  # closed, superseded or restarted: the loop head decides
                if item.kind == "end":
                    assert item.end is not None
                    end = decode_end(lane, item.end)
                    logger.info(
                        "lane %d ended at seq %d (%d documents closed after its last batch)",
                        lane,
                        end.next_seq,
                        len(end.closed),
                    )
                    with self._lock:
                        if run.epoch != self._epoch or run.superseded or self._closed.is_set():
                            continue
                        self._ends[lane] = end
                        run.order.pop(run.index)
                        stream = run.streams.pop(lane, None)
                        if run.order:
                            run.index %= len(run.order)
                    if stream is not None:
                        stream.close(flush=True)
                    continue
                assert item.batch is not None
                with self._lock:
                    if run.epoch != self._epoch or run.superseded or self._closed.is_set():
                        continue
                    self._pending = PendingBatch(run.epoch, item.batch, run.streams[lane], run)
                    run.index = (run.index + 1) % len(run.order)
                yield item.batch
        finally:
            with self._lock:
                if self._run is run:
                    self._run = None
            # An abandoned iteration (``break``) sends its pending Acks before its calls are
            # cancelled; a cancelled run (closed, superseded, repositioned) has none to send.
            run.leave(timeout=0.3)
            run.close()

    def _start(self, run: Iteration) -> None:
        """(Re)open every lane of this rank at its position (under the lock)."""
        run.close()
        run.epoch = self._epoch
        lanes = sorted(self._lanes)
        first = min(lanes, key=lambda lane: (self._positions[lane], lane))
        start = lanes.index(first)
        run.order = lanes[start:] + lanes[:start]
        run.index = 0
        for lane in run.order:
            run.streams[lane] = self._open(lane)

    def _open(self, lane: int) -> LaneStream:
        endpoint = self._routes[lane]
        logger.debug(
            "lane %d: opening at seq %d on %s", lane, self._positions[lane], endpoint.address
        )
        return LaneStream(
            endpoint.stream_stub(),
            address=endpoint.address,
            lane=lane,
            start_seq=self._positions[lane],
            consumer=self.consumer,
            previous_chain=self._chains[lane],
            verify=self.verify,
            metadata=self._metadata,
            prefetch=self.prefetch,
            batches_per_message=self.batches_per_message,
            shared_memory=self.shared_memory,
            expect=self._identity,
            info_timeout=self.rpc_timeout,
        )

    def _next_item(self, run: Iteration, lane: int) -> _Item | None:
        """The lane's next batch or end, reconnecting as needed; ``None`` to re-check state."""
        deadline: float | None = None
        delay = BACKOFF_INITIAL
        while True:
            stream = run.streams.get(lane)
            if stream is None:
                return None
            item = stream.get()
            with self._lock:
                if self._closed.is_set() or run.superseded or run.epoch != self._epoch:
                    return None
            if item.kind in ("batch", "end"):
                if deadline is not None:
                    logger.info("lane %d: reconnected to %s", lane, stream.address)
                return item
            code, details = _describe(item)
            if not _retryable(item, stream):
                if isinstance(item.error, grpc.RpcError):
                    raise ZephonClientError.from_rpc_error(
                        item.error, lane=lane, address=stream.address
                    ) from None
                if item.error is not None:
                    raise item.error
                raise ZephonClientError(code, details, lane=lane, address=stream.address)
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.reconnect_timeout
            remaining = deadline - now
            if remaining <= 0:
                why = diagnose(stream.address, self._routes[lane].tls, details or "")
                raise ZephonClientError(
                    code,
                    f"{details} (gave up reconnecting after {self.reconnect_timeout:g} s)"
                    + (f"; {why.hint}" if why is not None else ""),
                    lane=lane,
                    address=stream.address,
                )
            logger.warning(
                "lane %d: stream from %s broke (%s: %s); reopening at seq %d in %.1f s",
                lane,
                stream.address,
                code.name if code is not None else "closed",
                details,
                self._positions[lane],
                min(delay, remaining),
            )
            stream.close()
            if self._closed.wait(min(delay, remaining)):
                return None
            delay = min(delay * 2, BACKOFF_MAX)
            with self._lock:
                if run.superseded or run.epoch != self._epoch or self._closed.is_set():
                    return None
                run.streams[lane] = self._open(lane)

    def _consume_pending(self, run: Iteration | None = None) -> None:
        """Consume the batch yielded last (only if ``run`` yielded it, when given)."""
        with self._lock:
            pending = self._pending
            if pending is None or (run is not None and pending.run is not run):
                return
            self._pending = None
            if pending.epoch != self._epoch:
                return
            batch = pending.batch
            self._positions[batch.lane] = batch.seq + 1
            self._chains[batch.lane] = batch.chain_digest
        pending.stream.ack(batch.seq + 1)

    def _restart_iteration(self) -> None:
        """Positions changed: drop the pending batch and make an iteration reopen (locked)."""
        self._epoch += 1
        self._pending = None
        self._ends.clear()
        if self._run is not None:
            self._run.cancel()

    def _set_position(self, lane: int, next_seq: int, chain: bytes | None) -> None:
        if next_seq < 0:
            raise ValueError(f"lane {lane}: position must be >= 0, got {next_seq}")
        self._positions[lane] = next_seq
        self._chains[lane] = chain if chain is not None else (CHAIN_SEED if next_seq == 0 else None)

    # -- servers ---------------------------------------------------------------------------------

    def _unary(self, endpoint: Endpoint, method: str, request: Any) -> Any:
        """Call a unary RPC, retrying ``UNAVAILABLE`` with backoff for ``reconnect_timeout``
        (:func:`~.unary.call_unary`)."""
        return call_unary(
            endpoint,
            method,
            request,
            timeout=self.rpc_timeout,
            metadata=self._metadata,
            reconnect_timeout=self.reconnect_timeout,
            closed=self._closed,
        )

    def _endpoint(self, address: str | None) -> Endpoint:
        if address is None:
            return self._endpoints[0]
        for endpoint in self._endpoints:
            if endpoint.address == address:
                return endpoint
        raise ValueError(f"unknown server address {address!r}; this client uses {self.addresses}")

    def _checkpoint_endpoint(self, positions: Mapping[int, int], address: str | None) -> Endpoint:
        if address is not None or len(self._endpoints) == 1:
            return self._endpoint(address)
        routes = self._routes
        chosen = {
            (routes[lane] if lane in routes else route(self._endpoints, lane, self.rank)).address
            for lane in positions
        }
        if len(chosen) > 1:
            raise ZephonClientError(
                None,
                f"the checkpoint positions span several servers ({sorted(chosen)}); pass "
                "address= to checkpoint each server",
            )
        return self._endpoint(chosen.pop() if chosen else None)

    # -- shutdown --------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel the streams, wait for their readers (within about a second), close channels.

        Idempotent. An iteration in progress ends (its next step stops).
        """
        if self._closed.is_set():
            return
        with self._lock:
            run = self._run
        if run is not None:
            # What was consumed reaches the server, so a new client starts after it.
            run.leave(timeout=0.3)
        self._closed.set()
        with self._lock:
            run = self._run
            if run is not None:
                run.cancel()
        if run is not None:
            run.close(timeout=0.8)
        for endpoint in self._endpoints:
            endpoint.close()
        logger.debug("zephon client %s closed", self.consumer)

    def __enter__(self) -> DataClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
