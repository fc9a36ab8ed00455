"""What delivering one batch over gRPC costs, part by part, in CPU microseconds per batch.

``python -m bench.delivery [--workload bench/results/run/workload.json]`` (``bench.run`` runs it
too, as the child ``python -m bench.measure delivery``) takes the first ``--batches`` batches of
every lane of the benchmark pipeline from the in-process engine and measures, as medians of
``--rounds`` rounds:

* the server's message work, in this process on those batches: encoding the
  ``StreamBatchesResponse`` bytes (``service.encoding.encode_batch_response``: tensors, row
  sources, closed documents), what the service hands gRPC; for reference, also what
  serializing the same message with protobuf costs (the message parsed beforehand: the
  protobuf-built encoder is the tests' oracle, not product code);
* the client's message work, in this process: decoding (``wire.decode_batch``) and verifying
  the content and chain digests (``wire.verify``);
* gRPC transport: a replay server (child process) streams the serialized messages of every
  lane to a bare ``grpc.aio`` client in this process that only receives them and acks them as
  the real client does at high rates (every ``ACK_EVERY``-th batch); CPU of each side per
  message;
* the real :class:`~zephon_client.DataClient` against the same replay server, with and without
  verification: the client's whole CPU per batch (transport, decode, verify, hand-off), and
  the replay server's CPU per batch meanwhile;
* the same DataClient with the batches sent :data:`GROUP` per message (``BatchGroup``, as the
  service sends the batches that are ready together): both sides' CPU per batch.

The replay server does no pipeline work, so none of this is mixed with the tokenizer's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

from .common import RESULTS


def capture(config: str, batches: int) -> tuple[list[Any], dict[int, list[bytes]]]:
    """The engine's first ``batches`` batches per lane, and each lane's serialized responses
    (its ``EndOfStream`` last)."""
    from zephon_proto.v1 import data_service_pb2 as pb
    from zephon_server.engine.run import PipelineRun
    from zephon_server.service.encoding import encode_batch_response

    from .workload import load_plan

    run = PipelineRun(load_plan(config, "threads", 2))
    kept: list[Any] = []
    lanes: dict[int, list[bytes]] = collections.defaultdict(list)
    chains: dict[int, bytes] = {}
    try:
        for batch in run.batches():
            msgs = lanes[batch.lane_id]
            if len(msgs) < batches:
                kept.append(batch)
                msgs.append(encode_batch_response(batch))
                chains[batch.lane_id] = batch.chain_digest
            if len(lanes) == run.plan.pipeline.lanes and all(
                len(m) >= batches for m in lanes.values()
            ):
                break
    finally:
        run.close()
    for lane, msgs in lanes.items():
        end = pb.EndOfStream(next_seq=len(msgs), chain_digest=chains[lane])
        msgs.append(pb.StreamBatchesResponse(end=end).SerializeToString())
    return kept, dict(lanes)


GROUP = 3
"""Batches per message in the grouped replay: what the service achieved on the benchmark
pipeline (``zephon_batches_sent_total / zephon_messages_sent_total`` = 2.98 in a
single-rank run), as the engine finishes a lane's batches in bursts of ~6."""


def grouped(batches: list[Any], size: int) -> dict[int, list[bytes]]:
    """Each lane's batches as ``BatchGroup`` messages of ``size`` (its ``EndOfStream`` last)."""
    from zephon_proto.v1 import data_service_pb2 as pb
    from zephon_server.service.encoding import encode_group_response

    by_lane: dict[int, list[Any]] = collections.defaultdict(list)
    for batch in batches:
        by_lane[batch.lane_id].append(batch)
    out = {}
    for lane, mine in by_lane.items():
        msgs = [encode_group_response(mine[i : i + size]) for i in range(0, len(mine), size)]
        end = pb.EndOfStream(next_seq=len(mine), chain_digest=mine[-1].chain_digest)
        out[lane] = [*msgs, pb.StreamBatchesResponse(end=end).SerializeToString()]
    return out


@contextlib.contextmanager
def replay_server(lanes: dict[int, list[bytes]]) -> Iterator[tuple[str, Any]]:
    """A replay server child process serving ``lanes``: (its address, its psutil.Process)."""
    import psutil

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "messages.pkl"
        path.write_bytes(pickle.dumps(lanes))
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.delivery", "--serve", str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            yield f"127.0.0.1:{int(child.stdout.readline())}", psutil.Process(child.pid)
        finally:
            child.kill()
            child.wait()


def per_item_us(fn: Callable[[Any], Any], items: list[Any], rounds: int) -> float:
    """Median over ``rounds`` of this thread's CPU microseconds per ``fn(item)``."""
    samples = []
    for _ in range(rounds):
        started = time.thread_time()
        for item in items:
            fn(item)
        samples.append((time.thread_time() - started) / len(items) * 1e6)
    return statistics.median(samples)


# --------------------------------------------------------------------------------------------
# replay server (child process)
# --------------------------------------------------------------------------------------------


def serve(messages_path: str) -> None:
    """Serve GetInfo and StreamBatches from stored messages; prints the port."""
    import grpc

    from zephon_proto.v1 import data_service_pb2 as pb
    from zephon_server.service.servicer import WINDOW

    lanes: dict[int, list[bytes]] = pickle.loads(Path(messages_path).read_bytes())

    def info(request: Any, context: Any) -> Any:
        return pb.GetInfoResponse(
            num_lanes=len(lanes),
            fingerprint="replay",
            served_lanes=sorted(lanes),
            acknowledged=[pb.LanePosition(lane=lane, next_seq=0) for lane in sorted(lanes)],
        )

    def stream(requests: Any, context: Any) -> Any:
        first = next(requests)
        acked, cond = [first.open.start_seq], threading.Condition()

        def read_acks() -> None:
            try:
                for request in requests:
                    with cond:
                        acked[0] = max(acked[0], request.ack.next_seq)
                        cond.notify_all()
            except Exception:  # the call ended
                pass
            with cond:
                acked[0] = 1 << 62
                cond.notify_all()

        threading.Thread(target=read_acks, daemon=True).start()
        msgs = lanes[first.open.lane]
        for seq in range(first.open.start_seq, len(msgs)):
            with cond:  # the real server's send window
                while acked[0] <= seq - WINDOW and context.is_active():
                    cond.wait(0.2)
            yield msgs[seq]
        with cond:  # the real server waits for the final acks too
            cond.wait_for(lambda: acked[0] >= len(msgs) - 1, timeout=5)

    handler = grpc.method_handlers_generic_handler(
        "zephon.v1.DataService",
        {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                info,
                request_deserializer=pb.GetInfoRequest.FromString,
                response_serializer=pb.GetInfoResponse.SerializeToString,
            ),
            "StreamBatches": grpc.stream_stream_rpc_method_handler(
                stream,
                request_deserializer=pb.StreamBatchesRequest.FromString,
                response_serializer=lambda raw: raw,
            ),
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(4 * len(lanes) + 8),
        options=[("grpc.max_send_message_length", 1 << 30)],
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


# --------------------------------------------------------------------------------------------
# clients (this process)
# --------------------------------------------------------------------------------------------


def bare_transport(address: str, lanes: dict[int, int]) -> int:
    """Receive every lane's messages (``lanes``: lane → batches) as raw bytes on grpc.aio,
    acking every ``ACK_EVERY``-th batch and the last, as the client does at high rates;
    batches read."""
    import grpc

    from zephon_client import io_loop
    from zephon_client.stream import ACK_EVERY
    from zephon_proto.v1 import data_service_pb2 as pb

    async def lane(channel: Any, number: int, batches: int) -> int:
        acks: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def requests() -> Any:
            yield pb.StreamBatchesRequest(open=pb.OpenLane(lane=number)).SerializeToString()
            while (ack := await acks.get()) is not None:
                yield ack

        call = channel.stream_stream(
            "/zephon.v1.DataService/StreamBatches",
            request_serializer=None,
            response_deserializer=None,
        )(requests())
        count = 0
        async for _raw in call:
            count += 1
            if count == batches or (count < batches and count % ACK_EVERY == 0):
                ack = pb.StreamBatchesRequest(ack=pb.Ack(next_seq=count))
                acks.put_nowait(ack.SerializeToString())
            if count == batches:
                acks.put_nowait(None)
        return count - 1

    async def read_all() -> int:
        options = [("grpc.max_receive_message_length", 1 << 30)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            return sum(await asyncio.gather(*(lane(channel, n, k) for n, k in lanes.items())))

    return io_loop.submit(read_all()).result()  # the client's own loop, as DataClient


def data_client(address: str, verify: bool) -> int:
    """Read every lane with a real DataClient; batches read."""
    from zephon_client import DataClient

    with DataClient(address, verify=verify) as client:
        return sum(1 for _ in client)


def cpu_per_batch(
    fn: Callable[[], int], server: Any, rounds: int, reps: int
) -> tuple[float, float]:
    """Medians over ``rounds`` of (this process's, the server's) CPU microseconds per batch."""
    mine, theirs = [], []
    for _ in range(rounds):
        cpu0, srv0 = sum(os.times()[:2]), sum(server.cpu_times()[:2])
        batches = sum(fn() for _ in range(reps))
        mine.append((sum(os.times()[:2]) - cpu0) / batches * 1e6)
        theirs.append((sum(server.cpu_times()[:2]) - srv0) / batches * 1e6)
        time.sleep(0.1)
    return statistics.median(mine), statistics.median(theirs)


def measure(config: str, batches: int = 32, rounds: int = 3, reps: int = 3) -> dict[str, Any]:
    """Every part's CPU microseconds per batch (see the module docstring)."""

    from zephon_client import wire as client_wire
    from zephon_proto.v1 import data_service_pb2 as pb
    from zephon_server.service.encoding import encode_batch_response

    engine_batches, lanes = capture(config, batches)
    raw = [m for msgs in lanes.values() for m in msgs[:-1]]
    decoded = [client_wire.decode_batch(pb.StreamBatchesResponse.FromString(m).batch) for m in raw]
    chains = {lane: client_wire.CHAIN_SEED for lane in lanes}
    checks = []  # (batch, the chain digest before it): decoded is in lane, seq order
    for batch in decoded:
        checks.append((batch, chains[batch.lane]))
        chains[batch.lane] = batch.chain_digest
    result: dict[str, Any] = {
        "lanes": len(lanes),
        "batches": len(raw),
        "message_bytes": round(statistics.mean(len(m) for m in raw)),
        "tokens_per_batch": round(statistics.mean(b.num_tokens() for b in engine_batches)),
        "server_encode_us": per_item_us(encode_batch_response, engine_batches, rounds),
        "server_protobuf_us": per_item_us(
            lambda m: m.SerializeToString(),
            [pb.StreamBatchesResponse.FromString(encode_batch_response(b)) for b in engine_batches],
            rounds,
        ),
        "client_parse_decode_us": per_item_us(
            lambda m: client_wire.decode_batch(pb.StreamBatchesResponse.FromString(m).batch),
            raw,
            rounds,
        ),
    }
    result["client_verify_us"] = per_item_us(
        lambda check: client_wire.verify(*check), checks, rounds
    )
    counts = {lane: len(msgs) - 1 for lane, msgs in lanes.items()}
    with replay_server(lanes) as (address, server):
        bare = cpu_per_batch(lambda: bare_transport(address, counts), server, rounds, reps)
        full = cpu_per_batch(lambda: data_client(address, True), server, rounds, reps)
        unverified = cpu_per_batch(lambda: data_client(address, False), server, rounds, reps)
    with replay_server(grouped(engine_batches, GROUP)) as (address, server):
        in_groups = cpu_per_batch(lambda: data_client(address, True), server, rounds, reps)
    result.update(
        transport_client_us=bare[0],
        transport_server_us=bare[1],
        data_client_us=full[0],
        data_client_no_verify_us=unverified[0],
        data_client_server_us=full[1],
        group=GROUP,
        data_client_grouped_us=in_groups[0],
        data_client_grouped_server_us=in_groups[1],
    )
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delivery", description=__doc__)
    parser.add_argument("--workload", default=str(RESULTS / "run" / "workload.json"))
    parser.add_argument("--batches", type=int, default=32, help="batches per lane")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    config = json.loads(Path(args.workload).read_text())["config"]
    print(json.dumps(measure(config, args.batches, args.rounds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
