"""The scenarios of ``tests/reliability/test_startup.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.checkpoint import (
    SIGNED_VERSION,
    ResumeState,
)
from zephon_testing.servers import ServerProcess, serve_once


def state_of(cfg: Path, batches: int = 2, key=None) -> bytes:
    """Checkpoint bytes of ``cfg`` after ``batches`` batches (inline run, no server)."""
    from zephon_server.engine.config import load_config
    from zephon_server.engine.execution import ExecutionConfig
    from zephon_server.engine.numbered_batch import NumberedBatch

    pipeline, _ = load_config(cfg)
    run = pipeline.run(ExecutionConfig(runner="inline"))
    n = 0
    for item in run:
        n += isinstance(item, NumberedBatch)
        if n >= batches:
            break
    run.close()
    return run.checkpoint().encode(key)


def error_line(res: subprocess.CompletedProcess) -> str:
    """The one error line of a start-up that must fail with status 2 and no traceback."""
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("zephon: error:")]
    assert len(lines) == 1, res.stderr[-3000:]
    return lines[0]


def exit_line(res: subprocess.CompletedProcess) -> str:
    """``exit <status>: <the one error line>`` of a start-up checked by :func:`error_line`."""
    return f"exit {res.returncode}: {error_line(res)}"


def positions(srv: ServerProcess) -> dict[int, int]:
    info = srv.stub().GetInfo(pb.GetInfoRequest(), timeout=10)
    return {p.lane: p.next_seq for p in info.acknowledged}


def run_every_checkpoint_refused(cfg: Path, good: bytes, tmp_path: Path) -> dict[str, object]:
    """Four damaged checkpoint files (cut, a bit flipped, a zip, a directory): ``--resume
    latest`` and the directory named explicitly fail listing why, ``latest-or-fresh`` starts
    from seq 0 loudly. Checks each outcome; returns the error lines, positions and exit code."""
    state = tmp_path / "state"
    state.mkdir()
    flipped = bytearray(good)
    flipped[-10] ^= 0x01
    (state / "ckpt-00000001-cut.zck").write_bytes(good[:30])
    (state / "ckpt-00000002-flip.zck").write_bytes(bytes(flipped))
    (state / "ckpt-00000003-zip.zck").write_bytes(b"PK\x03\x04" + bytes(60))
    (state / "ckpt-00000004-dir.zck").mkdir()  # a directory where the newest file should be
    args = ["--config", str(cfg), "--state-dir", str(state)]
    line = latest = exit_line(serve_once([*args, "--resume", "latest"], tmp_path))
    assert "--resume latest: no usable checkpoint in" in line and "(4 refused:" in line
    for expected in (
        "ckpt-00000004-dir: checkpoint file",
        "ckpt-00000004-dir.zck' is a directory, not a file",
        "ckpt-00000003-zip: not a Zephon checkpoint",
        "ckpt-00000002-flip: checkpoint checksum mismatch",
        "ckpt-00000001-cut: checkpoint is truncated: 30 bytes",
        "start fresh with --resume latest-or-fresh",
    ):
        assert expected in line, (expected, line)
    # The directory named explicitly is refused too.
    named = exit_line(serve_once([*args, "--resume", "ckpt-00000004-dir"], tmp_path))
    assert "is a directory, not a file" in named
    # latest-or-fresh starts from seq 0, loudly.
    srv = ServerProcess([*args, "--resume", "latest-or-fresh"], tmp_path)
    try:
        fresh = positions(srv)
        assert fresh == dict.fromkeys(range(4), 0)
        log = srv.output()
        assert "--resume latest-or-fresh: no usable checkpoint in" in log
        assert "STARTING FRESH" in log and "ckpt-00000004-dir" in log
    finally:
        code = srv.terminate()
        assert code == 0, srv.output()[-3000:]
    warning = next(line for line in log.splitlines() if "STARTING FRESH" in line)
    return {"latest": latest, "named": named, "fresh": fresh, "warning": warning, "exit": code}


def run_stop_at_another_pipeline(cfg: Path, other: Path, good: bytes, tmp_path: Path) -> str:
    """Ours, another pipeline's, then a torn checkpoint: ``--resume latest`` skips the torn
    one and stops at the other pipeline's (ours is not tried). Checks; returns the line."""
    work = tmp_path
    state = tmp_path / "state"
    state.mkdir()
    (state / "ckpt-00000001-ours.zck").write_bytes(good)
    (state / "ckpt-00000002-theirs.zck").write_bytes(state_of(other))
    (state / "ckpt-00000003-torn.zck").write_bytes(good[:50])
    res = serve_once(["--config", str(cfg), "--state-dir", str(state), "--resume", "latest"], work)
    line = exit_line(res)
    assert "ckpt-00000003-torn: checkpoint checksum mismatch" in line
    assert "ckpt-00000002-theirs: checkpoint is from another pipeline" in line
    assert "differs in:" in line and "1 older checkpoint(s) not tried" in line
    return line


def run_tls_key_of_another_certificate(cfg: Path, tmp_path: Path) -> str:
    """``--tls-key`` of another certificate: the one line names the key, not a bind
    failure. Checks; returns the line."""
    from zephon_testing.scenarios.security import make_pki

    pki = make_pki(tmp_path / "pki")
    res = serve_once(
        [
            "--config",
            str(cfg),
            "--tls-cert",
            str(pki["server_cert"]),
            "--tls-key",
            str(pki["client_key"]),
        ],
        tmp_path,
    )
    line = exit_line(res)
    assert "the TLS key does not match the certificate (--tls-key " in line
    assert str(pki["client_key"]) in line and "Failed to bind" not in res.stderr
    return line


def run_busy_port_or_unknown_host(config: Path, tmp_path: Path) -> dict[str, str]:
    """A port another process listens on, an unknown host, a port a running Zephon server
    has. Checks each one line; returns them by case."""
    cfg = str(config)
    lines = {}
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        res = serve_once(["--config", cfg, "--port", str(port)], tmp_path)
    line = lines["port of another process"] = exit_line(res)
    assert f"cannot listen on 127.0.0.1:{port}: address already in use (stop the other" in line
    assert "--port 0 picks a free one" in line
    line = exit_line(serve_once(["--config", cfg, "--host", "no-such-host.invalid"], tmp_path))
    lines["unknown host"] = line
    assert "cannot listen on no-such-host.invalid:0: cannot resolve host" in line
    # Another Zephon server on the port: gRPC's default SO_REUSEPORT let a second one bind it
    # and share the connections.
    srv = ServerProcess(["--config", cfg], tmp_path)
    try:
        line = exit_line(serve_once(["--config", cfg, "--port", str(srv.port)], tmp_path))
        lines["port of a running Zephon server"] = line
        assert f"cannot listen on 127.0.0.1:{srv.port}: address already in use" in line
    finally:
        assert srv.terminate() == 0
    return lines


def _signal_masks(pid: int) -> dict[str, int]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {
        name: int(value, 16)
        for name, _, value in (line.partition(":\t") for line in status.splitlines())
        if name in ("SigCgt", "SigBlk")
    }


def _bit(signum: int) -> int:
    return 1 << (signum - 1)


def stop_signals_held(pid: int) -> bool:
    """Whether SIGTERM and SIGINT are blocked the way ``StopSignals.blocked`` blocks them
    (glibc blocks every signal for a moment while it creates a thread: not that)."""
    blocked = _signal_masks(pid).get("SigBlk", 0)
    ours = _bit(signal.SIGTERM) | _bit(signal.SIGINT)
    return blocked & ours == ours and not blocked & _bit(signal.SIGHUP)


def sigterm_handled(pid: int) -> bool:
    """Whether the process has a SIGTERM handler, or holds the signal back for one."""
    return bool(_signal_masks(pid).get("SigCgt", 0) & _bit(signal.SIGTERM)) or stop_signals_held(
        pid
    )


def tagged(tag: str) -> list[int]:
    """Processes started with ``ZEPHON_TEST_TAG=tag`` in their environment (server, workers)."""
    found = []
    marker = f"ZEPHON_TEST_TAG={tag}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def sigterm_during_start(
    args: list[str], workdir: Path, delay: float, ready=sigterm_handled
) -> tuple[int, str, bool]:
    """Start ``zephon serve``, SIGTERM it ``delay`` s after ``ready(pid)`` (polled through
    /proc), wait; returns (exit code, output, whether ``ready`` still held just before the
    signal went) once none of its processes is left."""
    tag = uuid.uuid4().hex
    log_path = workdir / f"serve-{tag}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zephon_server.cli", "serve", "--port", "0", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env={**os.environ, "ZEPHON_TEST_TAG": tag},
        )
        try:
            deadline = time.monotonic() + 60
            while not ready(proc.pid) and proc.poll() is None:
                assert time.monotonic() < deadline, "no SIGTERM handler within 60 s"
                time.sleep(0.002)
            time.sleep(delay)
            still_ready = proc.poll() is None and ready(proc.pid)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    deadline = time.monotonic() + 15
    while tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged(tag) == [], f"processes left after exit: {tagged(tag)}"
    return code, log_path.read_text(errors="replace"), still_ready


SIGTERM_DELAYS = (0.0, 0.3, 0.8, 1.5, 3.0)


def run_sigterm_during_start_up(
    cfg: Path, good: bytes, tmp_path: Path
) -> list[tuple[float, int, str]]:
    """A processes-runner server resuming a checkpoint, SIGTERMed ``SIGTERM_DELAYS`` s after
    its handler is in place. Checks each exits 0 (or 143) with no traceback and no process
    left; returns (delay, exit code, interrupted or drained) of each."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "ckpt-00000001.zck").write_bytes(good)
    args = ["--config", str(cfg), "--state-dir", str(state), "--resume", "latest"]
    args += ["--runner", "processes", "--workers", "2", "--allocator", "system"]
    args += ["--log-interval", "0"]
    outcomes: list[str] = []
    codes = []
    for delay in SIGTERM_DELAYS:
        code, log, _ = sigterm_during_start(args, tmp_path, delay)
        codes.append(code)
        assert code in (0, 143), (delay, code, log[-3000:])
        assert "Traceback" not in log, log[-3000:]
        if "stopped before serving" in log:
            assert "serving 4 lanes" not in log, log[-3000:]
            outcomes.append("interrupted")
        else:
            assert "draining" in log and "stopped" in log, log[-3000:]
            outcomes.append("drained")
        if delay == 0.0:  # the handler is in place before the pipeline even loads
            assert outcomes[-1] == "interrupted", log[-3000:]
    print("outcomes by delay:", outcomes)
    return list(zip(SIGTERM_DELAYS, codes, outcomes, strict=True))


def rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value


def outcome(err: grpc.RpcError) -> str:
    """``CODE: details`` of a refused call."""
    return f"{err.code().name}: {err.details()}"


@contextlib.contextmanager
def _serving(args: list[str], workdir: Path, env: dict | None = None) -> Iterator[ServerProcess]:
    """A server that must exit with 0 once the block is done (checked even if it failed)."""
    srv = ServerProcess(args, workdir, env=env)
    try:
        yield srv
    finally:
        assert srv.terminate() == 0, srv.output()[-3000:]


def _write_keys(tmp_path: Path) -> tuple[Path, Path]:
    """Two checkpoint key files, key A and key B."""
    key_a, key_b = tmp_path / "a.key", tmp_path / "b.key"
    key_a.write_text("key A: 0123456789abcdef0123456789\n")
    key_b.write_text("key B: fedcba9876543210fedcba9876\n")
    return key_a, key_b


def _denied(call, request) -> grpc.RpcError:
    """The error of a call that must be refused with PERMISSION_DENIED."""
    err = rpc_error(call, request)
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err.details()
    return err


def _resume_with_key_a(
    srv: ServerProcess, key_a: Path, unsigned: bytes, out: dict[str, str]
) -> tuple[bytes, bytes]:
    """A server with key A signs its checkpoint, resumes it (bytes and id) and refuses a
    forged and an unsigned one; their outcomes go to ``out``. Returns (signed, forged)."""
    from zephon_server.engine.checkpoint_key import CheckpointKey
    from zephon_testing.scenarios.checkpoint_signing import forge

    stub = srv.stub()
    reply = stub.Checkpoint(pb.CheckpointRequest(tag="signed"), timeout=30)
    signed = reply.state
    assert (
        signed[8] == SIGNED_VERSION and len(signed) == len(ResumeState.decode(signed).encode()) + 32
    )
    assert CheckpointKey.from_file(key_a).verify(signed[:10] + signed[74:], signed[42:74])
    stub.Resume(pb.ResumeRequest(state=signed), timeout=30)
    stub.Resume(pb.ResumeRequest(checkpoint_id=reply.checkpoint_id), timeout=30)
    out["key A: Resume of its own signed checkpoint (bytes and id)"] = "OK"
    forged = forge(signed, lambda doc: doc.update(tag="forged"))
    err = _denied(stub.Resume, pb.ResumeRequest(state=forged))
    out["key A: Resume of a forged checkpoint"] = outcome(err)
    assert "signature does not match (forged, or signed with another key)" in err.details()
    err = _denied(stub.Resume, pb.ResumeRequest(state=unsigned))
    out["key A: Resume of an unsigned checkpoint"] = outcome(err)
    assert "checkpoint is not signed; this server requires signed checkpoints" in err.details()
    assert "Traceback" not in err.details()
    return signed, forged


def _forged_file_refused_with_key_a(
    base: list[str], key_a: Path, forged_file: Path, tmp_path: Path, out: dict[str, str]
) -> None:
    """With key A at start-up the forged file is refused."""
    res = serve_once(
        [*base, "--checkpoint-key-file", str(key_a), "--resume", str(forged_file)], tmp_path
    )
    line = out["key A: start-up resuming the forged file"] = exit_line(res)
    assert "checkpoint signature does not match (forged" in line


def _key_a_state_refused_with_key_b(
    base: list[str], state_a: Path, env: dict, tmp_path: Path, out: dict[str, str]
) -> None:
    """Key B (from the environment in ``env``) refuses every checkpoint key A signed, listing
    them."""
    res = serve_once([*base, "--state-dir", str(state_a), "--resume", "latest"], tmp_path, env=env)
    line = out["key B: start-up with --resume latest over key A's checkpoints"] = exit_line(res)
    assert "no usable checkpoint" in line and "signature does not match" in line
    assert "from ZEPHON_CHECKPOINT_KEY" in line


def _resume_with_key_b(srv: ServerProcess, signed: bytes, key_b: Path, out: dict[str, str]) -> None:
    """Key B over the Resume RPC refuses key A's checkpoint, and the bytes it hands out (no
    --state-dir) are signed with B."""
    from zephon_server.engine.checkpoint_key import CheckpointKey

    err = _denied(srv.stub().Resume, pb.ResumeRequest(state=signed))
    out["key B: Resume of key A's checkpoint"] = outcome(err)
    mine = srv.stub().Checkpoint(pb.CheckpointRequest(), timeout=30).state
    ResumeState.decode(mine, CheckpointKey.from_text(key_b.read_text(), "B"))


def _forged_accepted_without_key(srv: ServerProcess, forged: bytes, out: dict[str, str]) -> None:
    """Without a key the forged checkpoint is accepted, at start-up (``srv`` resumed it) and
    over the RPC: the checksum alone cannot tell."""
    resumed = [line for line in srv.output().splitlines() if "resumed from" in line]
    assert resumed, srv.output()[-3000:]
    out["no key: start-up resuming the forged file"] = "accepted: " + resumed[0]
    srv.stub().Resume(pb.ResumeRequest(state=forged), timeout=30)
    out["no key: Resume of the forged checkpoint"] = "OK (accepted)"


def run_signed_checkpoints(cfg: Path, unsigned: bytes, tmp_path: Path) -> dict[str, str]:
    """Servers with key A, with key B (from the environment) and without a key, given a
    signed, a forged (payload edited, checksum recomputed) and an unsigned checkpoint, over
    Resume and at start-up. Checks each outcome; returns them by case."""
    key_a, key_b = _write_keys(tmp_path)
    state_a = tmp_path / "state-a"
    base = ["--config", str(cfg)]
    out: dict[str, str] = {}
    key_a_args = [*base, "--state-dir", str(state_a), "--checkpoint-key-file", str(key_a)]
    with _serving(key_a_args, tmp_path) as srv:
        signed, forged = _resume_with_key_a(srv, key_a, unsigned, out)
    forged_file = tmp_path / "forged.zck"
    forged_file.write_bytes(forged)
    _forged_file_refused_with_key_a(base, key_a, forged_file, tmp_path, out)
    env = {"ZEPHON_CHECKPOINT_KEY": key_b.read_text()}
    _key_a_state_refused_with_key_b(base, state_a, env, tmp_path, out)
    with _serving(base, tmp_path, env=env) as srv:
        _resume_with_key_b(srv, signed, key_b, out)
    with _serving([*base, "--resume", str(forged_file)], tmp_path) as srv:
        _forged_accepted_without_key(srv, forged, out)
    return out
