"""The scenarios of ``tests/unit/test_shard_integrity.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
import zstandard

from zephon_server.engine.datasets import DatasetSpec, resolve_datasets
from zephon_server.engine.decompression import IncompleteShardError
from zephon_server.engine.errors import DataError
from zephon_server.engine.shards import ShardCache
from zephon_testing.servers import serve_once

FIX = "re-create or re-download the shard, or remove it from the dataset"


#: The reproduction of issue 19: 8,192 rows of 128 bytes (with their newline).
ROWS = [b'{"text": "%0115d"}' % i for i in range(8192)]


CONTENT = b"\n".join(ROWS) + b"\n"


def zst(content: bytes = CONTENT, **kwargs: object) -> bytes:
    return zstandard.ZstdCompressor(**kwargs).compress(content)  # type: ignore[arg-type]


def zst_frames(content: bytes, pieces: int) -> bytes:
    step = -(-len(content) // pieces)
    return b"".join(zst(content[i : i + step]) for i in range(0, len(content), step))


def gz(content: bytes = CONTENT) -> bytes:
    return gzip.compress(content, mtime=0)


def resolve(path: Path, on_error: str = "fail") -> int:
    """Rows of the one-shard dataset at ``path`` as start-up counts them (a fresh cache)."""
    spec = DatasetSpec("web", str(path), 1.0, on_error=on_error)
    (info,) = resolve_datasets([spec], cache=ShardCache())
    return info.num_rows


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def refused(path: Path, on_error: str = "fail") -> str:
    with pytest.raises(IncompleteShardError) as info:
        resolve(path, on_error)
    message = str(info.value)
    assert isinstance(info.value, DataError)
    assert message.startswith(f"cannot decompress shard {path} ("), message
    assert message.endswith(FIX), message
    assert "\n" not in message
    return message


def config(tmp_path: Path, shard_dir: Path) -> Path:
    cfg = {
        "seed": 1,
        "lanes": 2,
        "chunk_size": 64,
        "datasets": [{"name": "web", "path": str(shard_dir), "weight": 1.0, "on_error": "skip"}],
        "pipeline": [{"decode_text": {}}, {"tokenize": {}}, {"batch": {"microbatch_size": 4}}],
        "execution": {"runner": "inline"},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_truncated_shard_cli(tmp_path: Path) -> dict[str, object]:
    """``zephon explain``, ``dump`` and ``serve`` over a dataset whose second shard is the
    issue's reproduction (a ``.jsonl.zst`` of 8,192 rows with its last byte removed); checks
    each exits 2 with the one line naming the file, and returns the shard and the runs."""
    shards = tmp_path / "data"
    shards.mkdir()
    (shards / "a.jsonl.zst").write_bytes(zst())
    broken = shards / "b.jsonl.zst"
    data = zst()
    broken.write_bytes(data[:-1])  # the reproduction: `zstd -t` says "premature end"
    cfg = config(tmp_path, shards)
    runs = {
        args[0]: subprocess.run(
            [sys.executable, "-m", "zephon_server.cli", *args, "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for args in (["explain"], ["dump", "--batches", "1"])
    }
    runs["serve"] = serve_once(["--config", str(cfg)], tmp_path)
    for res in runs.values():
        assert res.returncode == 2, (res.args, res.stdout[-500:], res.stderr[-2000:])
        errors = [line for line in res.stderr.splitlines() if line.startswith("zephon: error:")]
        assert errors == [
            f"zephon: error: cannot decompress shard {broken} (jsonl.zst): truncated: zstd "
            f"frame 1 (at byte 0) ends before its end mark (its header declares {len(CONTENT)} "
            f"bytes, got {_got(errors)} before the file ended); {FIX}"
        ], res.stderr[-2000:]
        assert "Traceback" not in res.stderr
        assert res.stdout == ""
    return {"shard": broken, "runs": runs}


def _got(errors: list[str]) -> str:
    return errors[0].split(", got ", 1)[1].split(" ", 1)[0] if errors else "?"
