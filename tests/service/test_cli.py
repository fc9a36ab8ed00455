"""The ``zephon`` CLI: explain and dump, run as a user would (subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml


@pytest.fixture(scope="module")
def config_path(tmp_path_factory, corpus_dir):
    cfg = {
        "seed": 1234,
        "lanes": 4,
        "chunk_size": 32,
        "flush_every_k_chunks": 2,
        "datasets": [
            {"name": "web", "path": str(corpus_dir / "web"), "weight": 0.5},
            {"name": "books", "path": str(corpus_dir / "books"), "weight": 0.3},
            {
                "name": "code",
                "path": str(corpus_dir / "code"),
                "weight": 0.2,
                "text_field": "content",
            },
        ],
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": "byte"}},
            {"batch": {"microbatch_size": 4}},
        ],
        "execution": {"runner": "threads", "workers": 2},
    }
    path = tmp_path_factory.mktemp("cli") / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


ZEPHON = (sys.executable, "-m", "zephon_server.cli")


def zephon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zephon_server.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_explain_prints_the_plan(config_path):
    res = zephon("explain", "--config", str(config_path))
    assert res.returncode == 0, res.stderr
    assert "stage 0 [threads]" in res.stdout and "batch(microbatch_size=4" in res.stdout


def test_dump_digests_identical_across_runners(config_path):
    outs = {}
    for runner, workers in (("inline", "1"), ("threads", "4"), ("processes", "2")):
        res = zephon(
            "dump",
            "--config",
            str(config_path),
            "--format",
            "digest",
            "--batches",
            "5",
            "--runner",
            runner,
            "--workers",
            workers,
        )
        assert res.returncode == 0, res.stderr
        outs[runner] = res.stdout
    assert outs["inline"] == outs["threads"] == outs["processes"]
    lines = [line.split() for line in outs["inline"].splitlines()]
    assert sorted((int(lane), int(seq)) for lane, seq, _ in lines) == [
        (lane, seq) for lane in range(4) for seq in range(5)
    ]
    assert all(len(digest) == 64 for _, _, digest in lines)


def test_dump_selected_lanes_json(config_path):
    res = zephon(
        "dump", "--config", str(config_path), "--lanes", "1,3", "--batches", "2", "--format", "json"
    )
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert sorted((r["lane"], r["seq"]) for r in rows) == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert rows[0]["tensors"]["input_ids"]["shape"][0] == 4


def test_dump_bad_config_exits_with_clear_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("datasets: []\npipeline: []\n")
    res = zephon("dump", "--config", str(path))
    assert res.returncode == 2
    assert "datasets: expected a non-empty list" in res.stderr
    assert "Traceback" not in res.stderr


def test_dump_save_and_resume_state_continue_exactly(config_path, tmp_path):
    full = zephon("dump", "--config", str(config_path), "--format", "digest", "--batches", "6")
    assert full.returncode == 0, full.stderr
    state = tmp_path / "state.zck"
    first = zephon(
        "dump",
        "--config",
        str(config_path),
        "--format",
        "digest",
        "--batches",
        "2",
        "--save-state",
        str(state),
        "--runner",
        "inline",
    )
    assert first.returncode == 0, first.stderr
    rest = zephon(
        "dump",
        "--config",
        str(config_path),
        "--format",
        "digest",
        "--batches",
        "4",
        "--resume-state",
        str(state),
        "--runner",
        "processes",
        "--workers",
        "2",
    )
    assert rest.returncode == 0, rest.stderr

    def by_lane(text):
        lines = sorted((int(a), int(b), c) for a, b, c in (x.split() for x in text.splitlines()))
        return lines

    assert by_lane(first.stdout + rest.stdout) == by_lane(full.stdout)
    assert {seq for _, seq, _ in by_lane(rest.stdout)} == {2, 3, 4, 5}


def test_dump_resume_state_errors_are_clear(config_path, tmp_path):
    bad = tmp_path / "bad.zck"
    bad.write_bytes(b"ZEPHONCK" + bytes(40))
    res = zephon("dump", "--config", str(config_path), "--resume-state", str(bad))
    assert res.returncode == 2 and "checksum mismatch" in res.stderr


TAIL_WITHOUT_CLIENT = """
import sys
sys.modules["zephon_client"] = None  # as if the client package were not installed
from zephon_server.cli import main
sys.exit(main(["tail", "--address", "127.0.0.1:1", "--lane", "0"]))
"""


def test_tail_without_the_client_package_says_what_to_install():
    # The server package needs the client only for `zephon tail`, imported when it runs.
    run = subprocess.run(
        [sys.executable, "-c", TAIL_WITHOUT_CLIENT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "zephon: error: zephon tail needs the client package zephon_client" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lanes", "9"], "--lanes: lane 9 does not exist; the pipeline's lanes are 0..3"),
        (["--lanes", "2-5"], "--lanes: lane 4 does not exist; the pipeline's lanes are 0..3"),
        (["--batches", "0"], "--batches must be >= 1 (batches per lane), got 0"),
    ],
)
def test_dump_refuses_lanes_and_counts_it_cannot_show(config_path, tmp_path, args, message):
    # a lane past the pipeline's printed nothing and exited 0 (with --save-state: KeyError)
    state = tmp_path / "s.zck"
    res = zephon("dump", "--config", str(config_path), *args, "--save-state", str(state))
    assert res.returncode == 2 and res.stderr.strip().endswith(message), res.stderr
    assert "Traceback" not in res.stderr and not state.exists()


def test_tail_refuses_a_negative_lane_before_connecting():
    res = zephon("tail", "--address", "127.0.0.1:1", "--lane", "-1")
    assert res.returncode == 2
    assert (
        res.stderr.strip() == "zephon tail: error: lane must be at least 0 (a lane number), got -1"
    )


def test_ctrl_c_during_dump_stops_it_without_a_traceback(config_path, tmp_path):
    import os
    import signal

    cfg = yaml.safe_load(config_path.read_text())
    for dataset in cfg["datasets"]:
        dataset["exhaustion"] = "repeat"  # never ends on its own
    cfg["execution"] = {"runner": "processes", "workers": 2}
    path = tmp_path / "forever.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [*ZEPHON, "dump", "--config", str(path), "--batches", "100000000", "--format", "digest"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # batches are flowing
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: workers get it too
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().endswith("zephon: interrupted") and "Traceback" not in err, err
    assert "leaked" not in err, err  # the run's workers and shared memory were closed
