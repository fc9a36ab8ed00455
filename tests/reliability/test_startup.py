"""Start-up of ``zephon serve``: what ``--resume`` refuses, one-line errors, stop signals.

Real ``zephon serve`` subprocesses over real files and sockets, real signals. A start-up
failure exits 2 with one ``zephon: error:`` line naming the cause and the fix and no
traceback: every checkpoint file refused under ``--resume latest`` (each one listed with its
reason), a TLS key of another certificate, a busy port (another process, or another Zephon
server: gRPC's ``SO_REUSEPORT`` would have shared it), a host that does not resolve. A SIGTERM
at any moment once the command runs stops the start-up and exits 0, worker processes and all.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_server.engine.checkpoint import (
    CheckpointStore,
    IncompatibleCheckpoint,
    NoUsableCheckpoint,
    ResumeState,
)
from zephon_server.service.server import _start_latest
from zephon_testing.scenarios.startup import (
    error_line,
    run_busy_port_or_unknown_host,
    run_every_checkpoint_refused,
    run_signed_checkpoints,
    run_sigterm_during_start_up,
    run_stop_at_another_pipeline,
    run_tls_key_of_another_certificate,
    sigterm_during_start,
    state_of,
    stop_signals_held,
)
from zephon_testing.servers import write_config

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory, corpus_dir):
    work = tmp_path_factory.mktemp("startup")
    cfg = write_config(work / "pipeline.yaml", corpus_dir)
    other = write_config(work / "other.yaml", corpus_dir, seed=999)
    return work, cfg, other, state_of(cfg)


# --------------------------------------------------------------------------------------------
# --resume latest / latest-or-fresh
# --------------------------------------------------------------------------------------------


def _recorder():
    started: list[ResumeState | None] = []
    return started, started.append


def test_latest_without_checkpoint_files_starts_fresh_both_ways(tmp_path, caplog):
    for mode in ("latest", "latest-or-fresh"):
        started, start = _recorder()
        (tmp_path / mode).mkdir()
        assert _start_latest(mode, CheckpointStore(tmp_path / mode), start) == ""
        assert started == [None]
    assert "no checkpoint in" in caplog.text and "did not exist" not in caplog.text


def test_latest_over_a_state_dir_that_did_not_exist_says_so_loudly(tmp_path, caplog):
    # A typo, a volume not mounted, a relative path from elsewhere: not a quiet first start.
    started, start = _recorder()
    assert _start_latest("latest", CheckpointStore(tmp_path / "stat"), start) == ""
    assert started == [None]
    assert f"state directory {tmp_path / 'stat'} did not exist" in caplog.text
    assert "STARTING FRESH" in caplog.text and "fix --state-dir" in caplog.text


def test_latest_refuses_and_latest_or_fresh_starts_fresh_when_all_are_refused(tmp_path, caplog):
    (tmp_path / "ckpt-00000001.zck").write_bytes(b"damaged")
    store = CheckpointStore(tmp_path)
    started, start = _recorder()
    with pytest.raises(
        NoUsableCheckpoint, match=r"--resume latest: no usable checkpoint in .*1 refused"
    ):
        _start_latest("latest", store, start)
    assert started == []
    assert _start_latest("latest-or-fresh", store, start) == ""
    assert started == [None]
    assert (
        "STARTING FRESH" in caplog.text and "ckpt-00000001: checkpoint is truncated" in caplog.text
    )


def test_latest_takes_the_newest_checkpoint_the_hub_accepts(tmp_path, setup):
    good = setup[3]
    (tmp_path / "ckpt-00000001.zck").write_bytes(good)
    (tmp_path / "ckpt-00000002.zck").write_bytes(good[:-3])
    started, start = _recorder()
    assert _start_latest("latest", CheckpointStore(tmp_path), start) == "ckpt-00000001"
    assert len(started) == 1 and started[0] is not None

    def refuse(state: ResumeState | None) -> None:
        raise IncompatibleCheckpoint("checkpoint is from another pipeline: seed differs")

    with pytest.raises(
        NoUsableCheckpoint, match="ckpt-00000001: checkpoint is from another pipeline"
    ):
        _start_latest("latest", CheckpointStore(tmp_path), refuse)


@pytest.mark.service
@pytest.mark.timeout(180)
def test_every_checkpoint_refused_is_a_start_up_failure_listing_each(setup, tmp_path):
    run_every_checkpoint_refused(setup[1], setup[3], tmp_path)


@pytest.mark.service
@pytest.mark.timeout(120)
def test_latest_stops_at_a_checkpoint_of_another_pipeline(setup, tmp_path):
    _work, cfg, other, good = setup
    run_stop_at_another_pipeline(cfg, other, good, tmp_path)


# --------------------------------------------------------------------------------------------
# TLS, port and host
# --------------------------------------------------------------------------------------------


def test_tls_files_are_checked_one_by_one(tmp_path):
    pytest.importorskip("cryptography")
    from cryptography.hazmat.primitives import serialization

    from zephon_server.engine.errors import ZephonError
    from zephon_server.service.listen import check_tls_files
    from zephon_testing.scenarios.security import _key, make_pki

    pki = make_pki(tmp_path / "pki")
    cert, key, ca = str(pki["server_cert"]), str(pki["server_key"]), str(pki["ca"])
    assert check_tls_files(cert, key, ca)[2] == pki["ca"].read_bytes()
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(
        _key().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    cut = tmp_path / "cut.pem"
    cut.write_bytes(pki["server_key"].read_bytes()[:60] + b"\n-----END PRIVATE KEY-----\n")
    cases = {
        (cert, str(pki["client_key"]), None): "the TLS key does not match the certificate",
        (cert, str(tmp_path / "none.pem"), None): "none.pem': the file does not exist",
        (str(tmp_path), key, None): "is a directory, not a PEM file",
        (key, key, None): "is not a PEM certificate (no '-----BEGIN CERTIFICATE-----' line)",
        (cert, cert, None): "is not a PEM private key",
        (cert, str(encrypted), None): "is encrypted; the server needs an unencrypted key",
        (cert, str(cut), None): "cannot load the TLS certificate and key",
        (cert, key, key): "--tls-client-ca",
    }
    for (c, k, a), message in cases.items():
        with pytest.raises(ZephonError, match=re.escape(message)):
            check_tls_files(c, k, a)


@pytest.mark.service
def test_listen_problems_are_named():
    from zephon_server.service.listen import listen_problem

    assert listen_problem("127.0.0.1", 0) is None
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert "address already in use" in (listen_problem("127.0.0.1", port) or "")
    assert listen_problem("127.0.0.1", port) is None  # free again
    assert "cannot resolve host" in (listen_problem("no-such-host.invalid", 5000) or "")
    # 192.0.2.1 (TEST-NET-1) is never a local address.
    assert "is not an address of this machine" in (listen_problem("192.0.2.1", 5000) or "")


@pytest.mark.service
@pytest.mark.timeout(120)
def test_a_tls_key_of_another_certificate_is_named_not_a_bind_failure(setup, tmp_path):
    pytest.importorskip("cryptography")
    run_tls_key_of_another_certificate(setup[1], tmp_path)


@pytest.mark.service
@pytest.mark.timeout(180)
def test_a_busy_port_or_unknown_host_is_named(setup, tmp_path):
    run_busy_port_or_unknown_host(setup[1], tmp_path)


# --------------------------------------------------------------------------------------------
# Stop signals during start-up
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_sigterm_at_any_moment_of_start_up_exits_cleanly(setup, tmp_path):
    run_sigterm_during_start_up(setup[1], setup[3], tmp_path)


@pytest.mark.service
@pytest.mark.timeout(120)
def test_sigterm_while_the_allocator_re_executes_is_kept_for_the_new_image(setup, tmp_path):
    # Preloading any library re-executes the process (allocator.py); libm is always mapped.
    maps = Path("/proc/self/maps").read_text().splitlines()
    libm = next(line.split()[-1] for line in maps if "/libm.so" in line or "/libm-" in line)
    args = ["--config", str(setup[1]), "--allocator", libm, "--log-interval", "0"]
    held = []
    for delay in (0.0, 0.05, 0.3):  # while the first image or the new one holds it back
        code, log, still_held = sigterm_during_start(args, tmp_path, delay, ready=stop_signals_held)
        assert code == 0 and "Traceback" not in log, (code, log[-3000:])
        # Sent while held back: kept, and acted on before serving. Sent later, a fast
        # start-up (a cached index) may reach SERVING first and drain as usual.
        before = "stopped before serving" in log
        assert before or not still_held, log[-3000:]
        assert before or log.index("serving ") < log.index("received SIGTERM"), log[-3000:]
        held.append(still_held)
    assert held[0], "the signal sent at once did not find it held back"


# --------------------------------------------------------------------------------------------
# Signed checkpoints on real servers
# --------------------------------------------------------------------------------------------


@pytest.mark.service
@pytest.mark.timeout(300)
def test_signed_checkpoints_refuse_forged_unsigned_and_other_keys(setup, tmp_path):
    _work, cfg, _other, unsigned = setup
    run_signed_checkpoints(cfg, unsigned, tmp_path)


@pytest.mark.service
@pytest.mark.timeout(180)
def test_dump_and_sign_checkpoint_use_the_key(setup, tmp_path):
    from zephon_server.engine.checkpoint_key import CheckpointKey

    _work, cfg, _other, unsigned = setup
    key = "a dump key, long enough"
    env = {**os.environ, "ZEPHON_CHECKPOINT_KEY": key}
    zephon = [sys.executable, "-m", "zephon_server.cli"]
    dump = [*zephon, "dump", "--config", str(cfg), "--batches", "2", "--format", "digest"]
    saved = tmp_path / "saved.zck"
    subprocess.run(
        [*dump, "--save-state", str(saved)], env=env, check=True, capture_output=True, timeout=120
    )
    ResumeState.decode(saved.read_bytes(), CheckpointKey.from_text(key, "env"))
    other = {**os.environ, "ZEPHON_CHECKPOINT_KEY": "another key, long enough"}
    res = subprocess.run(
        [*dump, "--resume-state", str(saved)],
        env=other,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "signature does not match" in error_line(res)
    plain = tmp_path / "plain.zck"
    plain.write_bytes(unsigned)
    res = subprocess.run(
        [*zephon, "sign-checkpoint", str(plain)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    ResumeState.decode(plain.read_bytes(), CheckpointKey.from_text(key, "env"))
    res = subprocess.run(
        [*zephon, "sign-checkpoint", str(saved)],
        env=other,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "signature does not match" in error_line(res)


def test_latest_names_files_it_does_not_consider(tmp_path, caplog):
    # A file named by hand is never taken for the newest (it could roll the run back or
    # forward), but it is not passed over without a word either.
    (tmp_path / "ckpt-2.zck").write_bytes(b"anything")
    started, start = _recorder()
    assert _start_latest("latest", CheckpointStore(tmp_path), start) == ""
    assert started == [None]
    assert "are not named as checkpoints" in caplog.text and "ckpt-2.zck" in caplog.text
