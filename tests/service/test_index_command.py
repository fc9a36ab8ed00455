"""The index directory from the command line: ``zephon index`` (progress, summary, resumable
after ``kill -9``, bad configs), ``--index-dir`` / ``index_dir`` / the defaults for
``explain``, ``dump`` and ``serve``, and a server over a warm index serving exactly what a
server over a cold one serves."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zephon_server.engine.corpus import write_sample_corpus
from zephon_server.pipeline_flags import index_dir_from_args
from zephon_testing.servers import lane_digests, server, write_config

pytestmark = [pytest.mark.service, pytest.mark.timeout(180)]

PROGRESS = re.compile(r"^index: (\d+)/(\d+) shards, \S+ \S+, \S+ \S+/s, ETA \S+$")


def zephon(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zephon_server.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def tree(root: Path) -> dict[str, bytes]:
    """Every index file under ``root`` (writers' temporary files, hidden lock files and
    spill files aside) and its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".") and p.relative_to(root).parts[0] != "spill"
    }


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus (JSONL, JSONL.zst, Parquet) and the service tests' config over it."""
    root = tmp_path_factory.mktemp("index-cli")
    write_sample_corpus(root / "corpus", docs_per_dataset=120, seed=11)
    write_config(root / "pipeline.yaml", root / "corpus", lanes=2)
    return root


def slow_corpus(root: Path) -> Path:
    """40 small JSONL shards, then 3 gzip shards of 60 MB of content that each take a
    while to decompress and index, and a config over them."""
    data = root / "data"
    data.mkdir(parents=True)
    for i in range(40):
        (data / f"a-{i:03d}.jsonl").write_bytes(b'{"text": "small"}\n' * 2000)
    row = (json.dumps({"text": "y" * 1000}) + "\n").encode()
    for i in range(3):
        (data / f"z-{i}.jsonl.gz").write_bytes(gzip.compress(row * 60_000, compresslevel=1))
    config = root / "p.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "datasets": [{"name": "web", "path": "data", "weight": 1}],
                "pipeline": [
                    {"tokenize": {"tokenizer": "byte"}},
                    {"batch": {"microbatch_size": 4}},
                ],
            }
        )
    )
    return config


def test_zephon_index_shows_progress_and_resumes_after_kill_9(tmp_path: Path) -> None:
    config = slow_corpus(tmp_path)
    args = [sys.executable, "-m", "zephon_server.cli", "index", "--config", str(config)]
    args += ["--index-dir", "idx", "--workers", "1", "--progress-interval", "0.05"]
    proc = subprocess.Popen(args, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # plain progress lines: stderr is not a terminal
        m = PROGRESS.match(line.strip())
        if m:
            seen.append(int(m.group(1)))
            assert int(m.group(2)) == 43
            if 40 <= seen[-1] < 43:  # the small shards done, a big one in progress
                proc.send_signal(signal.SIGKILL)
                break
    assert proc.wait(30) == -signal.SIGKILL, f"not killed mid-run (progress {seen})"
    assert seen == sorted(seen)
    res = zephon("index", "--config", str(config), "--index-dir", "idx", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = res.stdout.strip()
    m = re.fullmatch(
        rf"indexed 43 shards of 1 dataset\(s\) in {tmp_path / 'idx'}: (\d) built, (\d+) "
        r"already indexed; 260000 rows, .* read\) in .* s \(.*/s\)",
        summary,
    )
    assert m, summary
    assert 1 <= int(m.group(1)) <= 3 and int(m.group(2)) == 43 - int(m.group(1))
    assert PROGRESS.match(res.stderr.strip().splitlines()[-1]), res.stderr
    clean = zephon("index", "--config", str(config), "--index-dir", "clean", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    resumed, built = tree(tmp_path / "idx"), tree(tmp_path / "clean")
    assert resumed == built and len(built) == 44  # 43 entries and the catalog
    again = zephon("index", "--config", str(config), "--index-dir", "idx", cwd=tmp_path)
    assert "0 built, 43 already indexed" in again.stdout


def test_zephon_index_refuses_bad_input_with_one_line(tmp_path: Path, small: Path) -> None:
    config = str(small / "pipeline.yaml")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    in_the_way = tmp_path / "in-the-way"  # writable, but its entries/ is taken by a file
    in_the_way.mkdir()
    (in_the_way / "entries").write_text("x")
    bad = tmp_path / "bad.yaml"
    bad.write_text("datasets: []\npipeline: []\n")
    cases = {
        "--index-dir none": (
            ["index", "--config", config, "--index-dir", "none"],
            "zephon: error: zephon index: --index-dir none keeps the shard index in memory only",
        ),
        "unwritable": (
            ["index", "--config", config, "--index-dir", str(blocker / "idx")],
            f"zephon: error: zephon index: cannot write in index directory {blocker / 'idx'} (",
        ),
        "entries not saved": (
            ["index", "--config", config, "--index-dir", str(in_the_way)],
            f"zephon: error: zephon index: writing in index directory {in_the_way} failed (",
        ),
        "bad config": (["index", "--config", str(bad)], "zephon: error: datasets: expected"),
        "missing config": (["index", "--config", "nope.yaml"], "zephon: error: config file"),
        "workers": (
            ["index", "--config", config, "--index-dir", "i", "--workers", "0"],
            "zephon: error: --workers must be an integer >= 1, got 0",
        ),
    }
    for name, (args, start) in cases.items():
        res = zephon(*args, cwd=tmp_path)
        errors = [line for line in res.stderr.splitlines() if line.startswith("zephon: error")]
        assert res.returncode == 2 and len(errors) == 1, (name, res.stderr)
        assert errors[0].startswith(start), (name, errors)
        assert "Traceback" not in res.stderr and res.stdout == ""


def test_explain_and_dump_use_the_index_dir_flag_yaml_key_and_default(
    tmp_path: Path, small: Path
) -> None:
    config = small / "pipeline.yaml"
    cache_home = tmp_path / "xdg"
    env = {"XDG_CACHE_HOME": str(cache_home)}
    res = zephon("explain", "--config", str(config), cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    default = cache_home / "zephon" / "index"
    assert f"shard index: {default}\n" in res.stdout
    assert len(list(default.glob("catalogs/*.zsc"))) == 3  # the per-user default
    res = zephon("explain", "--config", str(config), "--index-dir", "flag", cwd=tmp_path, env=env)
    assert f"shard index: {tmp_path / 'flag'}\n" in res.stdout
    assert "shards indexed now" in res.stderr and len(tree(tmp_path / "flag")) == 12
    # The YAML key, relative to the config file; the flag wins over it.
    with_key = tmp_path / "conf" / "p.yaml"
    with_key.parent.mkdir()
    with_key.write_text(config.read_text() + "index_dir: from-yaml\n")
    res = zephon("explain", "--config", str(with_key), cwd=tmp_path, env=env)
    assert f"shard index: {tmp_path / 'conf' / 'from-yaml'}\n" in res.stdout
    res = zephon("explain", "--config", str(with_key), "--index-dir", "none", cwd=tmp_path, env=env)
    assert "shard index: memory (no index dir)\n" in res.stdout
    dumps = {}
    for where in ("none", "flag", "flag"):  # in memory, then the warm index
        args = ["dump", "--config", str(config), "--format", "digest", "--batches", "3"]
        res = zephon(*args, "--index-dir", where, cwd=tmp_path, env=env)
        assert res.returncode == 0, res.stderr
        dumps.setdefault(where, res.stdout)
        assert res.stdout == dumps["none"] and res.stdout.count("\n") == 6
        if where == "flag":
            assert "row counts from the index catalog" in res.stderr


def test_index_dir_precedence() -> None:
    ns = argparse.Namespace
    env = {"XDG_CACHE_HOME": "/xdg"}
    assert index_dir_from_args(ns(index_dir="/f", state_dir="/s"), "/y", env) == "/f"
    assert index_dir_from_args(ns(index_dir=None, state_dir="/s"), "/y", env) == "/y"
    assert index_dir_from_args(ns(index_dir=None, state_dir="/s"), None, env) == "/s/index"
    assert index_dir_from_args(ns(index_dir=None), None, env) == "/xdg/zephon/index"
    assert index_dir_from_args(ns(index_dir=None), None, {"HOME": "/h"}) == (
        "/h/.cache/zephon/index"
    )


def test_a_server_over_a_warm_index_serves_what_a_cold_one_serves(
    tmp_path: Path, small: Path
) -> None:
    config = str(small / "pipeline.yaml")
    runs = {}
    for name, extra in (
        ("memory", ["--index-dir", "none"]),
        ("cold", ["--state-dir", "state"]),
        ("warm", ["--index-dir", str(tmp_path / "state" / "index")]),
    ):
        with server(["--config", config, *extra], tmp_path) as srv:
            runs[name] = lane_digests(srv, 2)
            log = srv.output()
        if name == "cold":
            assert "shards indexed now" in log and "from the index catalog" not in log
            assert len(list((tmp_path / "state" / "index").glob("catalogs/*"))) == 3
        if name.startswith("warm"):
            assert log.count("row counts from the index catalog") == 3, log[-3000:]
            assert "shards indexed now" not in log
    assert runs["memory"] == runs["cold"] == runs["warm"]
    assert all(len(d) > 3 for d in runs["cold"].values())


def test_a_server_with_an_unwritable_index_dir_warns_and_serves(
    tmp_path: Path, small: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    in_the_way = tmp_path / "in-the-way"  # writable, but its entries/ is taken by a file
    in_the_way.mkdir()
    (in_the_way / "entries").write_text("x")
    config = str(small / "pipeline.yaml")
    with server(["--config", config, "--index-dir", str(blocker / "idx")], tmp_path) as srv:
        digests = lane_digests(srv, 2)
        log = srv.output()
    where = blocker / "idx"
    assert f"WARNING zephon_server.engine.index_dir: index directory {where} is not " in log
    assert "live in memory only" in log and log.count("is not writable") == 1
    assert all(len(d) > 3 for d in digests.values())  # every lane served to its end
