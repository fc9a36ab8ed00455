"""The trainer client's CPU per batch, measured against a server that only replays messages.

``python -m bench.client_cost [--workload bench/results/run/workload.json] [--reps 4]``
captures the first ``--batches`` batches of every lane of the benchmark pipeline (in-process
engine) as serialized ``StreamBatchesResponse`` messages, serves them from a replay server in
a child process (raw bytes, ack window as the real server's), and reads them with a real
:class:`~zephon_client.DataClient` in this process, ``--reps`` times per round, alternately
with and without digest verification. It prints the client's CPU (user + system) per batch,
the median over ``--rounds`` rounds of each. The replay server does no pipeline work, so the
client's cost is not mixed with the tokenizer's on the same cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

from .common import RESULTS


def capture(config: str, batches: int) -> dict[int, list[bytes]]:
    """The first ``batches`` batches of every lane, serialized, plus each lane's EndOfStream."""
    from zephon_proto.v1 import data_service_pb2 as pb
    from zephon_server.engine.run import PipelineRun
    from zephon_server.service.wire import batch_response

    from .workload import load_plan

    run = PipelineRun(load_plan(config, "threads", 2))
    lanes: dict[int, list[bytes]] = collections.defaultdict(list)
    chains: dict[int, bytes] = {}
    try:
        for batch in run.batches():
            msgs = lanes[batch.lane_id]
            if len(msgs) < batches:
                msgs.append(batch_response(batch).SerializeToString())
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
    return dict(lanes)


def serve(messages_path: str) -> None:
    """Replay server (child process): prints its port, serves until killed."""
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
        lane, start = first.open.lane, first.open.start_seq
        acked, cond = [start], threading.Condition()

        def read_acks() -> None:
            try:
                for request in requests:
                    with cond:
                        acked[0] = max(acked[0], request.ack.next_seq)
                        cond.notify_all()
            except Exception:  # the call ended
                with cond:
                    acked[0] = 1 << 62
                    cond.notify_all()

        threading.Thread(target=read_acks, daemon=True).start()
        msgs = lanes[lane]
        for seq in range(start, len(msgs)):
            with cond:
                while acked[0] <= seq - WINDOW and context.is_active():
                    cond.wait(0.2)
            yield msgs[seq]
        with cond:  # wait for the final acks, as the real server does
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


def read_all(address: str, reps: int, verify: bool) -> tuple[int, float]:
    """Batches read and client CPU seconds for ``reps`` full passes over every lane."""
    from zephon_client import DataClient

    cpu0 = sum(os.times()[:2])
    batches = 0
    for _ in range(reps):
        with DataClient(address, verify=verify) as client:
            for _batch in client:
                batches += 1
    return batches, sum(os.times()[:2]) - cpu0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_cost", description=__doc__)
    parser.add_argument("--workload", default=str(RESULTS / "run" / "workload.json"))
    parser.add_argument("--batches", type=int, default=32, help="batches per lane captured")
    parser.add_argument("--reps", type=int, default=4, help="passes per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    config = json.loads(Path(args.workload).read_text())["config"]
    lanes = capture(config, args.batches)
    size = statistics.mean(len(m) for msgs in lanes.values() for m in msgs[:-1])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "messages.pkl"
        path.write_bytes(pickle.dumps(lanes))
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.client_cost", "--serve", str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            address = f"127.0.0.1:{int(child.stdout.readline())}"
            per_batch: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.rounds):
                for verify in (True, False):
                    n, cpu = read_all(address, args.reps, verify)
                    per_batch[verify].append(cpu / n * 1e6)
                    time.sleep(0.2)
        finally:
            child.kill()
            child.wait()
    result = {
        "lanes": len(lanes),
        "batches_per_pass": sum(len(m) - 1 for m in lanes.values()),
        "message_bytes": round(size),
        "client_cpu_us_per_batch": round(statistics.median(per_batch[True])),
        "client_cpu_us_per_batch_no_verify": round(statistics.median(per_batch[False])),
        "rounds": {
            k: [round(v) for v in vs]
            for k, vs in (("verify", per_batch[True]), ("no_verify", per_batch[False]))
        },
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
