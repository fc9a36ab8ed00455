"""The scenarios of ``tests/reliability/test_bad_input.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from zephon_client import DataClient
from zephon_client.errors import ZephonClientError
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc
from zephon_server.engine.checkpoint import (
    FORMAT_VERSION,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    ResumeState,
)
from zephon_testing.infra import free_port
from zephon_testing.scenarios.faults import health_status
from zephon_testing.scenarios.load import metric, scrape
from zephon_testing.servers import ServerProcess, open_request, read_lane, write_config

TIER = os.environ.get("ZEPHON_RELIABILITY_TIER", "ci")


LONG = TIER == "long"


FUZZ_EXAMPLES = 400 if LONG else 60


U32, U64 = 2**32 - 1, 2**64 - 1


#: Codes a bad request may get; UNKNOWN (an unmapped exception) never.
ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DATA_LOSS,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a valid stream the test stops reading
    grpc.StatusCode.CANCELLED,
}


class Running:
    def __init__(self, srv: ServerProcess, resumed: ServerProcess, other_cfg: Path, state: bytes):
        self.srv = srv
        self.resumed = resumed
        self.other_cfg = other_cfg
        self.state = state  # checkpoint bytes at seq 3 of every lane
        self.channel = grpc.insecure_channel(srv.address)
        self.stub = pb_grpc.DataServiceStub(self.channel)
        self.resumed_stub = pb_grpc.DataServiceStub(grpc.insecure_channel(resumed.address))
        self.first = {lane: read_lane(self.stub, lane, 0, 3, "probe")[0] for lane in range(4)}

    def positions(self) -> dict[int, int]:
        info = self.stub.GetInfo(pb.GetInfoRequest(), timeout=10)
        return {p.lane: p.next_seq for p in info.acknowledged}

    def settled_positions(self) -> dict[int, int]:
        """Positions once the acks of earlier (already cancelled) streams have landed: the
        server reads a stream's last acks on its own thread, possibly after the call ended."""
        previous = self.positions()
        for _ in range(50):
            time.sleep(0.1)
            now = self.positions()
            if now == previous:
                return now
            previous = now
        return previous

    def assert_healthy(self) -> None:
        """Health SERVING, GetInfo answers, lane 0 still streams its original batches."""
        assert health_status(self.srv.address) == "SERVING"
        assert self.stub.GetInfo(pb.GetInfoRequest(), timeout=10).num_lanes == 4
        again, _ = read_lane(self.stub, 0, 0, 3, "health")
        assert [b.chain_digest for b in again] == [b.chain_digest for b in self.first[0]]


@contextlib.contextmanager
def running_servers(work: Path, corpus_dir: Path) -> Iterator[Running]:
    """A server with a checkpoint at seq 3 of every lane, and a second one resumed from it."""
    work.mkdir(parents=True, exist_ok=True)
    cfg = write_config(work / "pipeline.yaml", corpus_dir)
    other = write_config(work / "other.yaml", corpus_dir, seed=999)
    state_dir = work / "state"
    srv = ServerProcess(["--config", str(cfg), "--state-dir", str(state_dir)], work)
    resumed = None
    try:
        stub = srv.stub()
        for lane in range(4):
            read_lane(stub, lane, 0, 3, "setup")
        reply = stub.Checkpoint(
            pb.CheckpointRequest(
                positions=[pb.LanePosition(lane=lane, next_seq=3) for lane in range(4)], tag="s3"
            ),
            timeout=30,
        )
        resumed = ServerProcess(
            ["--config", str(cfg), "--state-dir", str(state_dir), "--resume", "latest"], work
        )
        yield Running(srv, resumed, other, reply.state)
    finally:
        for proc in (srv, resumed):
            if proc is not None and proc.proc.poll() is None:
                assert proc.terminate() == 0, proc.output()[-3000:]


def check_case(running: Running, name: str, call: Any, code: grpc.StatusCode, text: str) -> str:
    """Run one table case; returns the details it got (asserts code, text, no change)."""
    before = running.settled_positions()
    err = call(running)
    details = err.details() or ""
    assert err.code() == code, (name, err.code(), details)
    assert text in details, (name, details)
    assert "Traceback" not in details and err.code() != grpc.StatusCode.UNKNOWN
    assert running.positions() == before  # a rejected request changed nothing
    running.assert_healthy()
    return details


def stream_error(stub, requests, read: int = 50) -> grpc.RpcError:
    """Send ``requests`` on a StreamBatches call and read until it fails."""
    with pytest.raises(grpc.RpcError) as info:
        for n, _ in enumerate(stub.StreamBatches(iter(requests), timeout=20)):
            if n >= read:
                break
    return info.value


def unary_error(method, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        method(request, timeout=20)
    return info.value


def rewrite(state: bytes, edit) -> bytes:
    """Decode checkpoint bytes to JSON, ``edit`` it, re-encode with a valid checksum."""
    import hashlib
    import struct

    payload = json.loads(state[42:])
    edit(payload)
    raw = json.dumps(payload).encode()
    return struct.pack("<8sH32s", b"ZEPHONCK", FORMAT_VERSION, hashlib.sha256(raw).digest()) + raw


def foreign_state(other_cfg: Path) -> bytes:
    from zephon_server.engine.config import load_config
    from zephon_server.engine.execution import ExecutionConfig

    pipeline, _ = load_config(other_cfg)
    return pipeline.run(ExecutionConfig(runner="inline")).checkpoint().encode()


def _drop_lane(doc: dict) -> None:
    del doc["lanes"]["3"]


def _negative_seq(doc: dict) -> None:
    doc["lanes"]["0"]["next_seq"] = -1


def _bad_work_source(doc: dict) -> None:
    doc["lanes"]["1"]["work_source"] = {"version": 999}


def _short_chain(doc: dict) -> None:
    doc["lanes"]["2"]["chain"] = "abcd"


def _lane_out_of_range(doc: dict) -> None:
    doc["lanes"]["17"] = doc["lanes"]["0"]


def superseded(r: Running) -> grpc.RpcError:
    """Stream A of consumer "twin" on lane 2; stream B opens lane 2 under the same name: A
    (a stale stream of the same reader, e.g. on a dead connection) ends with ABORTED."""
    import queue

    def held(requests: queue.SimpleQueue):
        while (item := requests.get(timeout=20)) is not None:
            yield item

    qa: queue.SimpleQueue = queue.SimpleQueue()
    qb: queue.SimpleQueue = queue.SimpleQueue()
    qa.put(open_request(2, 0, "twin"))
    qb.put(open_request(2, 0, "twin"))
    a = r.stub.StreamBatches(held(qa), timeout=20)
    b = None
    try:
        it = iter(a)
        assert next(it).batch.seq == 0
        b = r.stub.StreamBatches(held(qb), timeout=20)  # only once A is streaming
        assert next(iter(b)).batch.seq == 0
        with pytest.raises(grpc.RpcError) as info:
            for _ in range(100):
                next(it)
        return info.value
    finally:
        qa.put(None)
        qb.put(None)
        a.cancel()
        if b is not None:
            b.cancel()


def _open(lane=0, seq=0):
    return open_request(lane, seq, "table")


def _ack(n):
    return pb.StreamBatchesRequest(ack=pb.Ack(next_seq=n))


# (name, call(running) -> RpcError, code, text in details)
CASES: list[tuple[str, Any, grpc.StatusCode, str]] = [
    # StreamBatches
    (
        "stream: lane not served",
        lambda r: stream_error(r.stub, [_open(99)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "lane 99 is not served here; this server serves lanes",
    ),
    (
        "stream: largest lane",
        lambda r: stream_error(r.stub, [_open(U32)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"lane {U32} is not served",
    ),
    (
        "stream: no message at all",
        lambda r: stream_error(r.stub, []),
        grpc.StatusCode.INVALID_ARGUMENT,
        "first StreamBatches message must be OpenLane",
    ),
    (
        "stream: Ack first",
        lambda r: stream_error(r.stub, [_ack(1)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "first StreamBatches message must be OpenLane",
    ),
    (
        "stream: empty first message",
        lambda r: stream_error(r.stub, [pb.StreamBatchesRequest()]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "first StreamBatches message must be OpenLane",
    ),
    (
        "stream: seq not yet reachable",
        lambda r: stream_error(r.stub, [_open(0, 10_000)]),
        grpc.StatusCode.OUT_OF_RANGE,
        "seq 10000 is not yet reachable; reachable range is 0..",
    ),
    (
        "stream: largest seq",
        lambda r: stream_error(r.stub, [_open(0, U64)]),
        grpc.StatusCode.OUT_OF_RANGE,
        f"seq {U64} is not yet reachable",
    ),
    (
        "stream: seq no longer reachable",
        lambda r: stream_error(r.resumed_stub, [_open(1, 0)]),
        grpc.StatusCode.OUT_OF_RANGE,
        "seq 0 is no longer reachable; reachable range is 3..",
    ),
    (
        "stream: second OpenLane",
        lambda r: stream_error(r.stub, [_open(0), _open(1)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "after OpenLane only Ack messages are allowed",
    ),
    (
        "stream: empty message after open",
        lambda r: stream_error(r.stub, [_open(0), pb.StreamBatchesRequest()]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "after OpenLane only Ack messages are allowed",
    ),
    (
        "stream: Ack of batches not sent",
        lambda r: stream_error(r.stub, [_open(0), _ack(U64)]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "acknowledges batches not sent yet",
    ),
    (
        "stream: same consumer name opens the lane again",
        superseded,
        grpc.StatusCode.ABORTED,
        "superseded: consumer 'twin' opened lane 2 again",
    ),
    # Checkpoint
    (
        "checkpoint: lane not served",
        lambda r: unary_error(
            r.stub.Checkpoint,
            pb.CheckpointRequest(positions=[pb.LanePosition(lane=77, next_seq=0)]),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "lane 77 is not served",
    ),
    (
        "checkpoint: position not produced",
        lambda r: unary_error(
            r.stub.Checkpoint,
            pb.CheckpointRequest(positions=[pb.LanePosition(lane=0, next_seq=U64)]),
        ),
        grpc.StatusCode.OUT_OF_RANGE,
        f"position {U64} was not produced yet (produced up to",
    ),
    (
        "checkpoint: position before the resume point",
        lambda r: unary_error(
            r.resumed_stub.Checkpoint,
            pb.CheckpointRequest(positions=[pb.LanePosition(lane=0, next_seq=1)]),
        ),
        grpc.StatusCode.OUT_OF_RANGE,
        "position 1 is no longer retained (checkpointable range",
    ),
    # Resume
    (
        "resume: neither id nor state",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest()),
        grpc.StatusCode.INVALID_ARGUMENT,
        "needs checkpoint_id or state",
    ),
    (
        "resume: unknown id",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest(checkpoint_id="ckpt-00000042")),
        grpc.StatusCode.NOT_FOUND,
        "unknown checkpoint id 'ckpt-00000042'; available: [",
    ),
    (
        "resume: path as id",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest(checkpoint_id="../../etc/passwd")),
        grpc.StatusCode.NOT_FOUND,
        "ids look like ckpt-00000001",
    ),
    (
        "resume: empty bytes",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest(state=b"")),
        grpc.StatusCode.DATA_LOSS,
        "truncated: 0 bytes, shorter than its 42-byte header",
    ),
    (
        "resume: not a checkpoint",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest(state=b"PK\x03\x04" + bytes(60))),
        grpc.StatusCode.DATA_LOSS,
        "not a Zephon checkpoint (starts with b'PK\\x03\\x04",
    ),
    (
        "resume: truncated",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest(state=r.state[:-10])),
        grpc.StatusCode.DATA_LOSS,
        "checksum mismatch",
    ),
    (
        "resume: newer format",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=r.state[:8] + b"\x09\x00" + r.state[10:])
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "format version 9 is newer than this server's 4",
    ),
    (
        "resume: a checkpoint of Zephon 0.1",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=r.state[:8] + b"\x01\x00" + r.state[10:])
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "format version 1 (unsigned) is older than this server's 3: it was written by Zephon 0.1",
    ),
    (
        "resume: format version 0",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=r.state[:8] + b"\x00\x00" + r.state[10:])
        ),
        grpc.StatusCode.DATA_LOSS,
        "format version 0, expected 3 (unsigned) or 4 (signed)",
    ),
    (
        "resume: another pipeline",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest(state=foreign_state(r.other_cfg))),
        grpc.StatusCode.FAILED_PRECONDITION,
        "seed (checkpoint 999, pipeline 1234)",
    ),
    (
        "resume: lanes missing",
        lambda r: unary_error(r.stub.Resume, pb.ResumeRequest(state=rewrite(r.state, _drop_lane))),
        grpc.StatusCode.FAILED_PRECONDITION,
        "no state for lanes [3] served here (expected lanes [0, 1, 2, 3], found [0, 1, 2])",
    ),
    (
        "resume: negative next_seq",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=rewrite(r.state, _negative_seq))
        ),
        grpc.StatusCode.DATA_LOSS,
        "next_seq: expected an integer >= 0, found -1",
    ),
    (
        "resume: bad work-source state",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=rewrite(r.state, _bad_work_source))
        ),
        grpc.StatusCode.DATA_LOSS,
        "lane state is invalid: work source state: version 999",
    ),
    (
        "resume: short chain digest",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=rewrite(r.state, _short_chain))
        ),
        grpc.StatusCode.DATA_LOSS,
        "chain: expected 64 hex digits, found 'abcd'",
    ),
    (
        "resume: lane out of range",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=rewrite(r.state, _lane_out_of_range))
        ),
        grpc.StatusCode.DATA_LOSS,
        "lane 17: expected a lane in 0..3",
    ),
    (
        "resume: JSON array payload",
        lambda r: unary_error(
            r.stub.Resume, pb.ResumeRequest(state=rewrite(r.state, lambda d: d.clear()))
        ),
        grpc.StatusCode.DATA_LOSS,
        "checkpoint payload is malformed",
    ),
    # Undecodable request bytes
    (
        "raw: undecodable Resume request",
        lambda r: unary_error(
            r.channel.unary_unary("/zephon.v1.DataService/Resume"), b"\xff\xff\xff\xff"
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "the request does not decode as zephon.v1.ResumeRequest (4 bytes",
    ),
    (
        "raw: unknown method",
        lambda r: unary_error(r.channel.unary_unary("/zephon.v1.DataService/Nope"), b""),
        grpc.StatusCode.UNIMPLEMENTED,
        "",
    ),
]


u32 = st.one_of(st.integers(0, 8), st.integers(0, U32))


u64 = st.one_of(st.integers(0, 64), st.integers(0, U64))


text = st.text(max_size=300)


stream_msg = st.one_of(
    st.builds(
        lambda lane, seq, c: pb.StreamBatchesRequest(
            open=pb.OpenLane(lane=lane, start_seq=seq, consumer=c)
        ),
        u32,
        u64,
        text,
    ),
    st.builds(lambda n: pb.StreamBatchesRequest(ack=pb.Ack(next_seq=n)), u64),
    st.just(pb.StreamBatchesRequest()),
)


REQUESTS = st.one_of(
    st.tuples(st.just("stream"), st.lists(stream_msg, max_size=5)),
    st.tuples(
        st.just("checkpoint"),
        st.builds(
            lambda ps, tag: pb.CheckpointRequest(
                positions=[pb.LanePosition(lane=a, next_seq=b) for a, b in ps], tag=tag
            ),
            st.lists(st.tuples(u32, u64), max_size=4),
            text,
        ),
    ),
    st.tuples(st.just("resume-id"), text),
    st.tuples(st.just("resume-bytes"), st.binary(max_size=300)),
    st.tuples(st.just("raw"), st.binary(max_size=64)),
)


def send_random(running: Running, kind: str, value: Any) -> grpc.StatusCode:
    """Send one random request; the status code it ended with (OK for a normal answer)."""
    try:
        if kind == "stream":
            call = running.stub.StreamBatches(iter(value), timeout=5)
            for n, _ in enumerate(call):
                if n >= 3:
                    call.cancel()
                    break
        elif kind == "checkpoint":
            # Checkpoints at random but producible positions may wait for production: bounded.
            running.stub.Checkpoint(value, timeout=5)
        elif kind == "resume-id":
            running.stub.Resume(pb.ResumeRequest(checkpoint_id=value), timeout=5)
        elif kind == "resume-bytes":
            running.stub.Resume(pb.ResumeRequest(state=value), timeout=5)
        else:
            running.channel.unary_unary("/zephon.v1.DataService/Checkpoint")(value, timeout=5)
    except grpc.RpcError as err:
        details = err.details() or ""
        assert "Traceback" not in details, details
        assert err.code() in ALLOWED, (kind, value, err.code(), details)
        return err.code()
    return grpc.StatusCode.OK


def run_fuzz(running: Running, examples: int = FUZZ_EXAMPLES) -> dict[str, Any]:
    codes: Counter = Counter()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(request=REQUESTS)
    def fuzz(request):
        kind, value = request
        if kind == "resume-id" and value.startswith("ckpt-"):
            value = "x" + value  # never resume a real checkpoint: it would move the lanes
        codes[(kind, send_random(running, kind, value).name)] += 1

    fuzz()
    running.assert_healthy()
    return {"requests": sum(codes.values()), "codes": dict(codes)}


def corruptions(state: bytes) -> list[tuple[str, bytes]]:
    """Every truncation, every single-bit flip, and the empty file."""
    out = [(f"truncated at {n}", state[:n]) for n in range(len(state))]
    for i in range(len(state)):
        for bit in range(8):
            flipped = bytearray(state)
            flipped[i] ^= 1 << bit
            out.append((f"bit {bit} of byte {i} flipped", bytes(flipped)))
    return out


def check_corruptions(state: bytes) -> dict[str, Any]:
    """Decode every corruption in-process; each must be rejected with a clear message."""
    kinds: Counter = Counter()
    for name, data in corruptions(state):
        try:
            ResumeState.decode(data)
        except CorruptCheckpoint as exc:
            message = str(exc)
            kinds["DATA_LOSS"] += 1
            assert any(word in message for word in ("expected", "shorter than its", "malformed")), (
                name,
                message,
            )
        except IncompatibleCheckpoint as exc:
            kinds["FAILED_PRECONDITION"] += 1
            # A flipped version bit reads as a newer format, or as Zephon 0.1's format 1.
            assert any(w in str(exc) for w in ("newer than this server's", "older than")), (
                name,
                exc,
            )
        else:
            raise AssertionError(f"{name}: a corrupt checkpoint was accepted")
    return {"cases": sum(kinds.values()), "by_status": dict(kinds)}


GOOD = [json.dumps({"text": f"good record {i} " + "lorem ipsum " * (i % 7)}) for i in range(40)]


BAD_LINES = {
    3: b"{not json",
    7: b'{"body": "no text field"}',
    11: b'{"text": "\xff\xfe broken utf8"}',
    15: b'["an", "array"]',
    18: b'{"text": 42}',
    21: b'{"text": ""}',  # empty document: not an error
    25: json.dumps({"text": "huge " * 60_000}).encode(),  # 300 kB: split across rows
}


def write_bad_corpus(root: Path) -> dict[str, Path]:
    """A dataset with malformed lines (shard 0) and two clean shards that will vanish or
    become unreadable once the server runs."""
    bad = root / "bad"
    bad.mkdir(parents=True)
    lines = [BAD_LINES.get(i, line.encode()) for i, line in enumerate(GOOD)]
    (bad / "part-0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    more = [json.dumps({"text": f"late record {i} " * 5}).encode() for i in range(120)]
    (bad / "part-1.jsonl").write_bytes(b"\n".join(more) + b"\n")
    (bad / "part-2.jsonl").write_bytes(b"\n".join(more) + b"\n")
    return {
        "bad": bad / "part-0.jsonl",
        "vanish": bad / "part-1.jsonl",
        "unreadable": bad / "part-2.jsonl",
    }


def bad_config(path: Path, corpus_dir: Path, bad_dir: Path, on_error: str) -> Path:
    cfg = {
        "seed": 5,
        "lanes": 2,
        "chunk_size": 4,
        "flush_every_k_chunks": 2,
        # Every record must be delivered or dropped for its own reason: no lane is cut short.
        "end_of_data": "longest",
        "datasets": [
            {"name": "web", "path": str(corpus_dir / "web"), "weight": 0.5},
            {"name": "bad", "path": str(bad_dir), "weight": 0.5, "on_error": on_error},
        ],
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": "byte"}},
            {"pack_flat": {"max_length": 4096}},
            {"batch": {"microbatch_size": 4, "drop_last": False}},
        ],
        "execution": {"runner": "threads", "workers": 2},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_malformed_data(
    corpus_dir: Path,
    workdir: Path,
    on_error: str,
    damage: tuple[str, ...] = ("vanish", "unreadable"),
) -> dict[str, Any]:
    """Serve a dataset with malformed records; once serving, one shard vanishes and another
    becomes unreadable (replaced by a directory), as ``damage`` says. Read every lane with a
    DataClient; figures: closed documents, rows, /metrics counters, the error if any."""
    workdir = workdir / f"{on_error}-{'-'.join(damage) or 'intact'}"
    shards = write_bad_corpus(workdir / "data")
    cfg = bad_config(workdir / f"bad-{on_error}.yaml", corpus_dir, shards["bad"].parent, on_error)
    mport = free_port()
    srv = ServerProcess(
        ["--config", str(cfg), "--metrics-port", str(mport), "--max-ahead", "1"], workdir
    )
    figures: dict[str, Any] = {"on_error": on_error}
    try:
        if "vanish" in damage:
            shards["vanish"].unlink()
        if "unreadable" in damage:
            shards["unreadable"].unlink()
            shards["unreadable"].mkdir()
        closed: Counter = Counter()
        rows: set = set()
        client = DataClient(srv.address, reconnect_timeout=10, rpc_timeout=20)
        try:
            for batch in client:
                closed.update((c.dataset, c.shard, c.row, c.tombstone) for c in batch.closed)
                rows.update((s.dataset, s.shard, s.row) for row in batch.rows for s in row)
                assert sum(closed.values()) < 10_000
            # Records dropped after a lane's last batch come in its EndOfStream.
            ends = client.lane_ends
            figures["ends"] = ends
            for end in ends.values():
                closed.update((c.dataset, c.shard, c.row, c.tombstone) for c in end.closed)
        except ZephonClientError as exc:
            figures["error"] = (exc.code.name if exc.code else None, exc.message)
        finally:
            client.close()
        figures["closed"] = closed
        figures["rows"] = rows
        text = scrape(mport)
        figures["metrics"] = {
            "skipped": metric(text, "zephon_records_skipped_total", 'dataset="bad"'),
            **{
                reason: metric(
                    text, "zephon_records_dropped_total", f'dataset="bad",reason="{reason}"'
                )
                for reason in ("malformed", "read_error", "empty")
            },
        }
        figures["health"] = health_status(srv.address)
        figures["wire_dropped"] = Counter(t for (d, _, _, t) in closed if d == 1 and t)
    finally:
        code = srv.terminate()
    assert code == 0, srv.output()[-3000:]
    figures["paths"] = {k: str(v) for k, v in shards.items()}
    return figures
