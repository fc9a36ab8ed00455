"""Shard identity end to end, on real servers and the real CLI: a checkpoint taken by
``zephon serve --state-dir`` before a same-size in-place rewrite of a shard is refused by
``--resume latest`` (exit 2) and by the Resume RPC (FAILED_PRECONDITION), both naming the
shard and what changed; a shard rewritten while the server runs fails the pipeline instead of
serving other data; ``zephon dump`` names added, removed and grown shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zephon_server.engine.corpus import write_jsonl
from zephon_testing.scenarios.shard_identity_service import (
    Changed,
    make_changed,
    run_resume_latest_onto_changed,
    run_resume_rpc_onto_changed,
    run_rewrite_while_serving,
    write_setup,
)

pytestmark = [pytest.mark.service, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def changed(tmp_path_factory) -> Changed:
    return make_changed(tmp_path_factory.mktemp("identity"))


def test_resume_latest_onto_a_rewritten_shard_exits_2_naming_it(changed: Changed) -> None:
    run_resume_latest_onto_changed(changed)


def test_resume_rpc_onto_changed_data_is_failed_precondition_naming_the_shard(
    changed: Changed,
) -> None:
    run_resume_rpc_onto_changed(changed)


def test_a_shard_rewritten_while_serving_fails_the_pipeline_not_the_data(tmp_path: Path) -> None:
    run_rewrite_while_serving(tmp_path)


def dump(cfg: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "zephon_server.cli", "dump", "--config", str(cfg)]
    return subprocess.run(
        [*cmd, "--format", "digest", *args], cwd=work, capture_output=True, text=True, timeout=60
    )


def test_dump_resume_names_added_removed_and_grown_shards(tmp_path: Path) -> None:
    cfg = write_setup(tmp_path)
    state = tmp_path / "saved" / "state.zck"
    state.parent.mkdir()
    res = dump(cfg, tmp_path, "--batches", "3", "--save-state", str(state))
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(list((state.parent / "manifests").glob("*.json"))) == 1
    web = tmp_path / "web"
    removed, grown = web / "part-00000.jsonl", web / "part-00002.jsonl"
    old_size = grown.stat().st_size
    removed.unlink()
    write_jsonl(web / "part-00009.jsonl", [json.dumps({"text": "new"})] * 7)
    with open(grown, "ab") as fh:
        fh.write(b'{"text": "one more"}\n')
    res = dump(cfg, tmp_path, "--batches", "3", "--resume-state", str(state))
    assert res.returncode == 2, res.stderr[-3000:]
    err = res.stderr
    assert f"shard {web / 'part-00009.jsonl'} added (7 rows)" in err, err[-3000:]
    assert f"shard {removed} removed (60 rows)" in err
    assert f"shard {grown} modified (modified time " in err
    assert f"size {old_size} -> {grown.stat().st_size} bytes, rows 60 -> 61)" in err
    assert "Traceback" not in err
