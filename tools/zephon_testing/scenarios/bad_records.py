"""The scenarios of ``tests/unit/test_bad_records.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml


def deep(levels: int) -> bytes:
    """A record whose text is fine but whose other field is nested ``levels`` deep."""
    return b'{"text": "deep", "meta": ' + b"[" * levels + b"]" * levels + b"}"


def good(i: int) -> bytes:
    return json.dumps({"text": f"good record number {i} " * 3}).encode()


def fails_to_parse(line: bytes) -> bool:
    try:
        json.loads(line)
    except Exception:  # whatever this Python's parser raises
        return True
    return False


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


HUGE_NUMBER = b'{"text": "a number", "n": 1' + b"0" * 100_000 + b"}"


LIMIT = 2**20


def _records() -> dict[int, bytes]:
    """40 lines: good records but for deep nesting (3, 9, 25), a 100,000-digit number (17)
    and a record over ``LIMIT`` bytes (31)."""
    lines = {i: good(i) for i in range(40)}
    lines.update({3: deep(1_000), 9: deep(100_000), 17: HUGE_NUMBER, 25: deep(100_000)})
    lines[31] = json.dumps({"text": "y" * (2 * LIMIT)}).encode()
    return lines


def _bad_records_config(tmp_path: Path, corpus_dir: Path, shard: Path) -> Path:
    """``bad.yaml``: the sample corpus's ``web`` and ``shard``'s dataset ``bad`` (on_error:
    skip, max_document_bytes ``LIMIT``), half and half."""
    cfg = {
        "seed": 5,
        "lanes": 2,
        "chunk_size": 4,
        "flush_every_k_chunks": 2,
        "datasets": [
            {"name": "web", "path": str(corpus_dir / "web"), "weight": 0.5},
            {
                "name": "bad",
                "path": str(shard.parent),
                "weight": 0.5,
                "on_error": "skip",
                "max_document_bytes": LIMIT,
            },
        ],
        "pipeline": [
            {"decode_text": {}},
            {"tokenize": {"tokenizer": "byte"}},
            {"pack_flat": {"max_length": 512}},
            {"batch": {"microbatch_size": 4, "drop_last": False}},
        ],
        "execution": {"runner": "threads", "workers": 2},
    }
    cfg_path = tmp_path / "bad.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    return cfg_path


def _closed_documents(address: str) -> Counter:
    """(dataset, row, tombstone) of every document closed on the wire, reading every lane to
    its end (its EndOfStream included) with a DataClient."""
    from zephon_client import DataClient

    closed: Counter = Counter()
    client = DataClient(address, reconnect_timeout=10, rpc_timeout=20)
    try:
        for batch in client:
            closed.update((c.dataset, c.row, c.tombstone) for c in batch.closed)
        for end in client.lane_ends.values():
            closed.update((c.dataset, c.row, c.tombstone) for c in end.closed)
    finally:
        client.close()
    return closed


def _serve_and_read(cfg_path: Path, tmp_path: Path) -> tuple[Counter, str, str, int, str]:
    """Serve ``cfg_path`` and read it all; returns the closed documents, the /metrics text,
    health, the exit code (checked 0) and the server's output."""
    from zephon_testing.infra import free_port
    from zephon_testing.scenarios.faults import health_status
    from zephon_testing.scenarios.load import scrape
    from zephon_testing.servers import ServerProcess

    mport = free_port()
    srv = ServerProcess(["--config", str(cfg_path), "--metrics-port", str(mport)], tmp_path)
    try:
        closed = _closed_documents(srv.address)
        text = scrape(mport)
        health = health_status(srv.address)
    finally:
        code = srv.terminate()
    assert code == 0, srv.output()[-3000:]
    return closed, text, health, code, srv.output()


def _check_skips(ours: set[tuple[int, str]], bad: set[int], text: str) -> None:
    """The bad dataset's tombstones on the wire and its /metrics counters, by reason."""
    from zephon_testing.scenarios.load import metric

    assert {(r, t) for r, t in ours if t} == {(i, "malformed") for i in bad} | {(31, "too_large")}
    assert metric(text, "zephon_records_skipped_total", 'dataset="bad"') == len(bad) + 1
    for reason, n in (("malformed", len(bad)), ("too_large", 1)):
        labels = f'dataset="bad",reason="{reason}"'
        assert metric(text, "zephon_records_dropped_total", labels) == n, reason


def _kinds(lines: dict[int, bytes]) -> dict[int, str]:
    """What is wrong with each bad line, by row."""
    kinds = {3: "JSON nested 1,000 levels", 9: "JSON nested 100,000 levels"}
    kinds.update({17: "a 100,000-digit number", 25: "JSON nested 100,000 levels"})
    kinds[31] = f"a {len(lines[31])}-byte record over max_document_bytes {LIMIT}"
    return kinds


def run_bad_records_server(tmp_path: Path, corpus_dir: Path) -> dict[str, Any]:
    """``zephon serve`` over a dataset with deeply nested records, a too-long number and a
    too-large document (on_error: skip): a DataClient reads every lane to its end. Checks
    each document of the dataset is closed exactly once, health stays SERVING, and /metrics
    counts the skips by reason; returns the records, the skipped rows by reason, the metric
    values, health and exit code."""
    from zephon_testing.scenarios.load import metric

    lines = _records()
    bad = {i for i, line in lines.items() if fails_to_parse(line)}
    shard = write_lines(tmp_path / "data" / "bad" / "part-0.jsonl", [lines[i] for i in range(40)])
    cfg_path = _bad_records_config(tmp_path, corpus_dir, shard)
    closed, text, health, code, output = _serve_and_read(cfg_path, tmp_path)
    assert health == "SERVING"
    ours = {(row, reason) for (dataset, row, reason), n in closed.items() if dataset == 1}
    assert sum(n for (dataset, _, _), n in closed.items() if dataset == 1) == 40  # once each
    _check_skips(ours, bad, text)
    kinds = _kinds(lines)
    return {
        "records": len(lines),
        "closed": sum(n for (dataset, _, _), n in closed.items() if dataset == 1),
        "skipped": {row: (kinds.get(row, "?"), reason) for row, reason in sorted(ours) if reason},
        "skipped_metric": metric(text, "zephon_records_skipped_total", 'dataset="bad"'),
        "health": health,
        "exit": code,
        "tracebacks": output.count("Traceback"),
    }
