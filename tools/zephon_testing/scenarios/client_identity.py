"""The scenarios of ``tests/reliability/test_client_identity.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import pytest

from zephon_client import DataClient, PipelineMismatch
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_testing.infra import free_port
from zephon_testing.servers import ServerProcess, dump_digests, write_config

LANES = 4


BEFORE = 2 * LANES  # batches read from the first server


def make_pipelines(work, corpus_dir):
    """Two pipelines over the corpus (the second with another seed), the first's digests."""
    first = write_config(work / "first.yaml", corpus_dir, lanes=LANES, chunk_size=8)
    other = write_config(work / "other.yaml", corpus_dir, lanes=LANES, chunk_size=8, seed=99)
    expected = dump_digests(first, 1000)
    # Each lane must outlast what the client has read and buffered before the swap.
    assert min(len(chains) for chains in expected.values()) > 3 * BEFORE
    return work, first, other, expected


def fingerprint(srv: ServerProcess) -> str:
    return srv.stub().GetInfo(pb.GetInfoRequest(), timeout=30).fingerprint


def swap_servers(work, first, second, *, verify: bool):
    """Read ``BEFORE`` batches from a server of ``first``, replace it on its port by one of
    ``second``, read on. Returns (batches, error raised or None, first's and second's
    fingerprints, the positions the second server saw acknowledged)."""
    port = free_port()
    srv = ServerProcess(["--config", str(first), "--port", str(port)], work)
    batches, error = [], None
    try:
        with DataClient(f"127.0.0.1:{port}", verify=verify, reconnect_timeout=60) as client:
            it = iter(client)
            batches += [next(it) for _ in range(BEFORE)]
            old = fingerprint(srv)
            assert srv.terminate() == 0, srv.output()[-3000:]
            srv = ServerProcess(["--config", str(second), "--port", str(port)], work)
            new = fingerprint(srv)
            try:
                batches += list(it)
            except PipelineMismatch as err:
                error = err
                with pytest.raises(PipelineMismatch):
                    client.checkpoint()  # would checkpoint the other pipeline
        info = srv.stub().GetInfo(pb.GetInfoRequest(), timeout=30)
        acked = {p.lane: p.next_seq for p in info.acknowledged}
    finally:
        if srv.proc.poll() is None:
            assert srv.terminate() == 0, srv.output()[-3000:]
    return batches, error, old, new, acked


def assert_first_pipelines(batches, expected) -> None:
    """Every batch yielded is the first pipeline's batch at its (lane, seq)."""
    for batch in batches:
        assert batch.chain_digest.hex() == expected[batch.lane][batch.seq], (
            f"lane {batch.lane} seq {batch.seq} is not the first pipeline's batch"
        )


def run_swap_to_another_pipeline(pipelines, verify: bool) -> dict:
    """The server swapped to another pipeline under a client: checks the client raises
    PipelineMismatch having yielded only the first pipeline's batches and acknowledged
    nothing to the second; returns the counts and the message."""
    work, first, other, expected = pipelines
    batches, error, old, new, acked = swap_servers(work, first, other, verify=verify)
    assert old != new
    assert_first_pipelines(batches, expected)
    assert error is not None, "the client read the other pipeline to its end without an error"
    assert (error.expected_fingerprint, error.found_fingerprint) == (old, new)
    assert (error.expected_lanes, error.found_lanes) == (LANES, LANES)
    message = str(error)
    assert message.startswith("FAILED_PRECONDITION (server 127.0.0.1:")
    assert f"now serves another pipeline: fingerprint {new}" in message
    assert "Restart the trainer from a checkpoint" in message
    # Only the first server's batches (the ones buffered before the swap) were yielded and
    # nothing was acknowledged to the second.
    assert len(batches) < sum(len(chains) for chains in expected.values())
    assert set(acked.values()) == {0}
    return {"yielded": len(batches), "acked": sum(acked.values()), "error": message}


def run_swap_to_the_same_pipeline(pipelines) -> dict:
    """The server restarted with the same pipeline: checks the client reads every lane to its
    end exactly once, in order; returns the counts."""
    work, first, _, expected = pipelines
    batches, error, old, new, acked = swap_servers(work, first, first, verify=False)
    assert error is None and old == new
    # The client went on with the second server and read every lane to its end there.
    assert acked == {lane: len(chains) for lane, chains in expected.items()}
    assert_first_pipelines(batches, expected)
    got: dict[int, list[int]] = {}
    for batch in batches:
        got.setdefault(batch.lane, []).append(batch.seq)
    assert got == {lane: list(range(len(chains))) for lane, chains in expected.items()}
    return {"yielded": len(batches), "acked": sum(acked.values())}
