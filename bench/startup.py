"""Start-up: launching ``zephon serve`` to SERVING and to a client's first batch, and RSS.

``python -m bench.startup [--rounds 5] [--quick] [--publish]`` (``bench.run`` runs it too and
publishes it in docs/benchmarks.md). Every start is the real command a user types, the installed
``zephon serve --config P`` (the shell launcher beside this Python), with ``--allocator auto``
(the default: mimalloc when installed, preloaded by the launcher) or ``--allocator system``, in
an environment without ``LD_PRELOAD`` or ``MIMALLOC_*`` variables, so whatever the default
costs to get its allocator is measured too.

Cases: 100 / 1,000 / 10,000 JSONL shards of ~20 KB (byte tokenizer), and the reference
workload, 8 JSONL shards of 38 MB with the BPE tokenizer the benchmark trains (decode →
tokenize → pack_flat 2048 → shuffle → batch 8, threads x2). Per start: the time from launching
the process to SERVING (its ``--port-file`` appears right after health turns SERVING), its RSS
then, and the time to the first batch a ``DataClient`` in this process receives (imported
beforehand). The shard files are in the page cache (read once beforehand).

Index: when ``zephon serve --help`` lists ``--index-dir``, every case runs with a fresh,
empty index directory (cold) and with one filled beforehand (warm: by ``zephon index`` when
that command exists, else by the cold start). Otherwise every start counts every shard and the
report says ``index: not available`` instead of a warm figure.

Rounds: each round runs every case, cold then warm, both allocators back to back (every other
round in the other order); figures are medians over the rounds, and the allocator comparison
is the median of the per-round ratios.

Read rate: the reference shards, each dropped from the page cache, read with large reads (the
disk's sequential rate for one reader), then indexed by ``zephon index --workers 1`` (or,
until that exists, :func:`zephon_server.engine.shards.index_lines` in this process).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import mmap
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import startup_report
from .common import RESULTS, compile_sources
from .service import HOST, START_TIMEOUT, spawn, stop, tail
from .workload import MAX_LENGTH, MICROBATCH, VOCAB_SIZE

log = logging.getLogger("bench")

SHARD_COUNTS = (100, 1_000, 10_000)
SHARD_BYTES = 20_000
REFERENCE_SHARDS = 8
REFERENCE_BYTES = 38_000_000
QUICK_SHARD_COUNTS = (100, 1_000)
QUICK_REFERENCE_BYTES = 4_000_000
READ_BLOCKS = (1 << 20, 16 << 20)
"""Read sizes timed for the disk's sequential rate; the faster one counts (on this virtual disk
1 MiB reads beat 16 MiB ones: the kernel's read-ahead overlaps them)."""
ZEPHON = str(Path(sys.executable).with_name("zephon"))
"""The ``zephon`` command ``pip install`` puts beside this Python (``server/bin/zephon``)."""


@dataclass(frozen=True)
class Case:
    """One start-up case: a name, its pipeline YAML and its shard files."""

    name: str
    config: Path
    files: tuple[Path, ...]

    @property
    def shards(self) -> int:
        return len(self.files)


@dataclass(frozen=True)
class Support:
    """What the installed ``zephon`` offers: ``serve --index-dir`` and ``zephon index``."""

    index_dir: bool
    index_cmd: bool


def probe_support() -> Support:
    """Ask the installed command (``--help``) whether the persisted index is there."""
    if not os.access(ZEPHON, os.X_OK):
        raise SystemExit(f"{ZEPHON}: no zephon command beside this Python; run `make install`")
    env = server_env()
    serve = _run_cli(["serve", "--help"], env)
    index = _run_cli(["index", "--help"], env)
    return Support(
        index_dir=startup_report.supports_index_dir(serve.stdout),
        index_cmd=index.returncode == 0,
    )


def _run_cli(args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZEPHON, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def server_env() -> dict[str, str]:
    """This environment without an inherited allocator (``LD_PRELOAD``, ``MIMALLOC_*``,
    ``ZEPHON_ALLOCATOR``): each start chooses its own, as a user's shell would."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "ZEPHON_ALLOCATOR") and not k.startswith("MIMALLOC_")
    }


# -- corpora ----------------------------------------------------------------------------------


def _complete(root: Path, write: Any) -> Path:
    """``root``, written by ``write(tmp)`` once (a ``.complete`` marker says it is whole)."""
    if (root / ".complete").exists():
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


def small_shards(count: int, shard_bytes: int = SHARD_BYTES) -> Path:
    """``count`` JSONL shards of about ``shard_bytes`` each (generated once, under results)."""
    from zephon_server.engine.corpus import generate_texts

    def write(tmp: Path) -> None:
        lines = [json.dumps({"text": t}).encode() + b"\n" for t in generate_texts(4000, seed=1)]
        at = 0
        for i in range(count):
            out, size = [], 0
            while size < shard_bytes:
                line = lines[at % len(lines)]
                out.append(line)
                size += len(line)
                at += 1
            (tmp / f"shard-{i:05d}.jsonl").write_bytes(b"".join(out))

    return _complete(RESULTS / f"startup-{count}x{shard_bytes}", write)


def reference_shards(shard_bytes: int = REFERENCE_BYTES) -> Path:
    """The reference workload: :data:`REFERENCE_SHARDS` JSONL shards of ``shard_bytes``."""
    from zephon_server.engine.corpus import generate_texts

    def write(tmp: Path) -> None:
        for i in range(REFERENCE_SHARDS):
            out, size, tag = [], 0, 0
            while size < shard_bytes:
                for t in generate_texts(5000, seed=100 + i, mean_words=250, tag=tag):
                    line = json.dumps({"text": t}).encode() + b"\n"
                    out.append(line)
                    size += len(line)
                    if size >= shard_bytes:
                        break
                tag += 1
            (tmp / f"ref-{i}.jsonl").write_bytes(b"".join(out))

    return _complete(RESULTS / f"startup-ref-{REFERENCE_SHARDS}x{shard_bytes}", write)


def bpe_tokenizer(reference: Path, given: str | None = None) -> str:
    """The benchmark's BPE tokenizer: ``given`` (``bench.run``'s), else one trained once on
    the reference shards (vocab :data:`~bench.workload.VOCAB_SIZE`)."""
    if given:
        return given
    path = RESULTS / f"bpe-{VOCAB_SIZE}-{reference.name}.json"
    if not path.exists():
        from zephon_server.engine.tokenizer import train_bpe_tokenizer

        texts: list[str] = []
        for shard in sorted(reference.glob("*.jsonl")):
            with open(shard, "rb") as fh:
                texts += [json.loads(line)["text"] for line in itertools.islice(fh, 5000)]
        texts = texts[:5000]
        log.info("training a BPE tokenizer (vocab %d) for the reference workload", VOCAB_SIZE)
        train_bpe_tokenizer(texts, path, vocab_size=VOCAB_SIZE)
    return str(path)


def write_config(
    path: Path, dataset: str, tokenizer: str, *, shuffle: bool, end_of_data: str | None = None
) -> Path:
    """A one-dataset pipeline: decode → tokenize → pack_flat 2048 [→ shuffle] → batch 8
    (``end_of_data`` unset: the default, ``shortest``)."""
    ops: list[dict[str, Any]] = [
        {"decode_text": {}},
        {"tokenize": {"tokenizer": tokenizer}},
        {"pack_flat": {"max_length": MAX_LENGTH}},
    ]
    if shuffle:
        ops.append({"shuffle": {"buffer_size": 64}})
    ops.append({"batch": {"microbatch_size": MICROBATCH}})
    cfg = {
        "seed": 1234,
        "lanes": 8,
        "chunk_size": 256,
        "flush_every_k_chunks": 8,
        "datasets": [{"name": "data", "path": dataset, "weight": 1.0}],
        "pipeline": ops,
        "execution": {"runner": "threads", "workers": 2},
    }
    if end_of_data is not None:
        cfg["end_of_data"] = end_of_data
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def cases(work_dir: Path, quick: bool, tokenizer: str | None) -> tuple[list[Case], Case, Case]:
    """The shard-count cases, the reference case, and the reference case with ``end_of_data:
    longest`` (the first batch of the default, ``shortest``, on this finite corpus waits for
    every lane's first batch; corpora generated on first use)."""
    out = []
    for count in QUICK_SHARD_COUNTS if quick else SHARD_COUNTS:
        root = small_shards(count)
        config = write_config(work_dir / f"shards-{count}.yaml", str(root), "byte", shuffle=False)
        out.append(Case(f"{count:,} shards", config, tuple(sorted(root.glob("*.jsonl")))))
    root = reference_shards(QUICK_REFERENCE_BYTES if quick else REFERENCE_BYTES)
    files = tuple(sorted(root.glob("*.jsonl")))
    size = sum(f.stat().st_size for f in files) / 1e6
    config = write_config(
        work_dir / "reference.yaml", str(root), bpe_tokenizer(root, tokenizer), shuffle=True
    )
    ref = Case(f"reference {len(files)} x {size / len(files):.0f} MB, BPE", config, files)
    longest = write_config(
        work_dir / "reference-longest.yaml",
        str(root),
        bpe_tokenizer(root, tokenizer),
        shuffle=True,
        end_of_data="longest",
    )
    return out, ref, Case(f"{ref.name}, end_of_data: longest", longest, files)


# -- one start --------------------------------------------------------------------------------


def serve_args(case: Case, run_dir: Path, allocator: str, index_dir: Path | None) -> list[str]:
    """``zephon serve``'s arguments for ``case`` (``allocator``: default | system)."""
    args = ["serve", "--config", str(case.config), "--host", HOST, "--port", "0"]
    args += ["--port-file", str(run_dir / "port"), "--log-interval", "0"]
    args += ["--allocator", "auto" if allocator == "default" else "system"]
    if index_dir is not None:
        args += ["--index-dir", str(index_dir)]
    return args


def measure_start(
    case: Case, run_dir: Path, allocator: str, index_dir: Path | None
) -> dict[str, Any]:
    """Launch → SERVING (port file), RSS at SERVING, launch → the first batch of a client."""
    import psutil

    from zephon_client import DataClient

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    port_file = run_dir / "port"
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("MIMALLOC_")}
    env.update(LD_PRELOAD=None, ZEPHON_ALLOCATOR=None)
    t0 = time.monotonic()
    proc = spawn(
        serve_args(case, run_dir, allocator, index_dir), run_dir / "server.log", env, ZEPHON
    )
    try:
        deadline = t0 + START_TIMEOUT
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{tail(run_dir / 'server.log')}")
            time.sleep(0.002)
        to_serving = time.monotonic() - t0
        server = psutil.Process(proc.pid)  # the same pid after a re-execution
        rss = server.memory_info().rss
        times = server.cpu_times()
        address = f"{HOST}:{int(port_file.read_text())}"
        with DataClient(address, rank=0, world_size=1) as client:
            next(iter(client))
            to_first_batch = time.monotonic() - t0
    finally:
        stop(proc)
    return {
        "case": case.name,
        "shards": case.shards,
        "allocator": allocator,
        "to_serving": to_serving,
        "to_first_batch": to_first_batch,
        "rss_serving": rss,
        "cpu_serving": times.user + times.system,
        "ran_on": startup_report.allocator_from_log(tail(run_dir / "server.log", 100_000)),
    }


_UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def reported_rate(summary: str) -> float | None:
    """The bytes/s ``zephon index`` reports on its summary line (``... (716.3 MB/s)``): what
    it read over the time its build took, without the interpreter start and the listing."""
    found = re.search(r"\(([\d.]+) (B|kB|MB|GB|TB)/s\)\s*$", summary.strip())
    return float(found.group(1)) * _UNITS[found.group(2)] if found else None


def build_index(case: Case, index_dir: Path, workers: int, run_dir: Path) -> float:
    """``zephon index --config P --index-dir D --workers N``; its wall time."""
    run_dir.mkdir(parents=True, exist_ok=True)
    args = ["index", "--config", str(case.config), "--index-dir", str(index_dir)]
    t0 = time.monotonic()
    proc = subprocess.run(
        [ZEPHON, *args, "--workers", str(workers)],
        capture_output=True,
        text=True,
        timeout=3600,
        env=server_env(),
        check=False,
    )
    seconds = time.monotonic() - t0
    (run_dir / "index.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"zephon index failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def run_case(
    case: Case, support: Support, rnd: int, order: Sequence[str], work_dir: Path
) -> list[dict[str, Any]]:
    """One round of ``case``: cold (fresh index directory) then warm, both allocators each."""
    base = work_dir / f"{case.config.stem}-r{rnd}"
    shutil.rmtree(base, ignore_errors=True)
    runs = []
    if not support.index_dir:
        for alloc in order:
            run = measure_start(case, base / alloc, alloc, None)
            runs.append({**run, "index": startup_report.NOT_AVAILABLE, "round": rnd})
        return runs
    for alloc in order:
        run = measure_start(case, base / f"cold-{alloc}", alloc, base / f"index-cold-{alloc}")
        runs.append({**run, "index": "cold", "round": rnd})
    warm = base / f"index-cold-{order[0]}"  # filled by that cold start ...
    if support.index_cmd:  # ... or, better, by the command made for it
        warm = base / "index-warm"
        build_index(case, warm, 2, base / "index-build")
    for alloc in order:
        run = measure_start(case, base / f"warm-{alloc}", alloc, warm)
        runs.append({**run, "index": "warm", "round": rnd})
    return runs


# -- read rates -------------------------------------------------------------------------------


def drop_cached(path: Path) -> None:
    """Drop ``path`` from the page cache (written back first, so its pages are clean)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_seconds(paths: Sequence[Path], *, cold: bool, block: int = READ_BLOCKS[-1]) -> float:
    """Seconds to read ``paths`` in reads of ``block`` bytes (each dropped first if ``cold``),
    into a page-aligned buffer: a read into one 8 or 16 bytes past a cache line (where a
    ``bytearray`` may start) took the kernel 4-5 times as long on this machine's AMD CPU, so the
    disk's rate would have depended on where the allocator put the buffer. Its pages are
    mapped in advance (``MAP_POPULATE``), so no read pays their first-touch faults."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    buf = mmap.mmap(-1, block, flags=flags)
    total = 0.0
    for path in paths:
        if cold:
            drop_cached(path)
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
        total += time.perf_counter() - t0
    return total


def index_seconds(case: Case, support: Support, work_dir: Path) -> tuple[float, str, str]:
    """Seconds ``zephon index --workers 1`` (else ``index_lines`` here) takes on the dropped
    files; what was timed; a note. The previous round's index directory is removed and
    everything written back (``os.sync()``) before the build starts: the removal's metadata
    writes, flushed during the build, shared the disk with its reads."""
    fresh = work_dir / "index-rate"
    shutil.rmtree(fresh, ignore_errors=True)
    for path in case.files:
        drop_cached(path)
    os.sync()
    if support.index_cmd:
        log_dir = work_dir / "index-rate-log"
        whole = build_index(case, fresh, 1, log_dir)
        rate = reported_rate((log_dir / "index.log").read_text().split("\n")[0])
        if rate:
            size = sum(p.stat().st_size for p in case.files)
            note = (
                f"`zephon index` took {whole:.2f} s in all; the rate is the one it reports for "
                "its build (bytes read over the build's time: the interpreter start, imports "
                "and listing left out)."
            )
            return size / rate, "`zephon index --workers 1`", note
        fixed = build_index(case, fresh, 1, log_dir)  # all indexed: overhead
        note = (
            f"`zephon index` took {whole:.2f} s; the rate leaves out the {fixed:.2f} s the "
            "same command takes once everything is indexed (interpreter, imports, listing)."
        )
        return max(whole - fixed, 1e-9), "`zephon index --workers 1`", note
    from zephon_server.engine.shards import index_lines

    t0 = time.perf_counter()
    for path in case.files:
        index_lines(str(path))
    note = "`zephon index` is not available yet: the rate is the engine's line indexer alone."
    return time.perf_counter() - t0, "`engine.shards.index_lines` in-process", note


def read_rates(case: Case, support: Support, work_dir: Path, rounds: int) -> dict[str, Any]:
    """The disk's sequential read rate and the indexer's on the same dropped files.

    Each round reads the files at every size in :data:`READ_BLOCKS` just before and just
    after the index build, and takes the faster size's mean of the two as that round's disk
    rate: the disk here drifts by a factor of two within a minute, and one read on one side
    of the build left each round's ratio to where the drift happened to be. Every read and
    build comes after ``os.sync()``: the cases before this one leave dirty pages (index
    entries, logs, corpora) whose write-back would otherwise share the disk with whichever
    read it happens to meet."""
    size = sum(p.stat().st_size for p in case.files)
    first = case.files[:1]
    read_seconds(first, cold=False)
    warm_s = read_seconds(first, cold=False)
    cold_s = read_seconds(first, cold=True)
    disk, index, how, note = [], [], "", ""
    by_block: dict[int, list[float]] = {block: [] for block in READ_BLOCKS}

    def disk_rates() -> dict[int, float]:
        rates = {}
        for block in READ_BLOCKS:
            os.sync()  # no write-back of earlier cases' files competes with the reads
            rates[block] = size / read_seconds(case.files, cold=True, block=block)
        return rates

    for _ in range(rounds):
        before = disk_rates()
        seconds, how, note = index_seconds(case, support, work_dir)
        index.append(size / seconds)
        after = disk_rates()
        for block in READ_BLOCKS:
            by_block[block].append((before[block] + after[block]) / 2)
        disk.append(max(rates[-1] for rates in by_block.values()))
    return {
        "files": len(case.files),
        "bytes": size,
        "disk_rate": statistics.median(disk),
        "index_rate": statistics.median(index),
        # the disk's rate moves a lot between rounds: each round's ratio is taken against the
        # reads just before and after its build
        "ratio": statistics.median(i / d for i, d in zip(index, disk)),
        "disk_rounds": disk,
        "index_rounds": index,
        "read_blocks": {block: statistics.median(v) for block, v in by_block.items()},
        "how": how,
        "note": note,
        "fadvise": {
            "cold_rate": first[0].stat().st_size / cold_s,
            "warm_rate": first[0].stat().st_size / warm_s,
        },
    }


def steady_rate(dataset: str, tokenizer: str, work_dir: Path, seconds: float = 30.0) -> float:
    """Steady-state tokens/s of ``zephon serve`` reading ``dataset`` (a local path, glob or,
    with object storage, a URL) to one client: the hook for "tokens/s from S3 on loopback vs
    local disk" (call it with both and take the ratio). Not run by default."""
    import numpy as np

    from zephon_client import DataClient

    from .measure import steady_rate as rate

    config = write_config(work_dir / "steady.yaml", dataset, tokenizer, shuffle=True)
    case = Case("dataset", config, ())
    run_dir = work_dir / "steady"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    proc = spawn(serve_args(case, run_dir, "default", None), run_dir / "server.log", program=ZEPHON)
    progress: list[tuple[float, int]] = []
    try:
        while not ((run_dir / "port").exists() and (run_dir / "port").read_text().strip()):
            if proc.poll() is not None:
                raise RuntimeError(f"server did not start:\n{tail(run_dir / 'server.log')}")
            time.sleep(0.01)
        address = f"{HOST}:{int((run_dir / 'port').read_text())}"
        with DataClient(address, rank=0, world_size=1) as client:
            end = time.time() + seconds
            total = 0
            for batch in client:
                total += int(np.count_nonzero(batch.tensors["padding_mask"]))
                progress.append((time.time(), total))
                if progress[-1][0] > end:
                    break
    finally:
        stop(proc)
    return float(rate(progress))


# -- the section ------------------------------------------------------------------------------


def method(support: Support, rounds: int) -> list[str]:
    """The paragraph above the tables."""
    index = (
        "cold = a fresh `--index-dir`, warm = one filled beforehand by "
        + ("`zephon index --workers 2`" if support.index_cmd else "the cold start")
        if support.index_dir
        else "index: not available (`zephon serve --help` has no `--index-dir`): every start "
        "counts every shard, so there is no warm figure"
    )
    return [
        "Launching the installed `zephon serve --config P` (no `LD_PRELOAD`; "
        "`--allocator auto`, the default, runs on mimalloc, which the `zephon` launcher "
        "preloads; `--allocator system` stays on glibc malloc) to SERVING (its `--port-file` "
        "appears) and to the first batch a "
        "`DataClient` receives; RSS of the server at SERVING. JSONL shards of ~20 KB with the "
        "byte tokenizer, and the reference workload (8 JSONL shards of 38 MB, the BPE "
        "tokenizer, shuffle, threads x2), with the default `end_of_data: shortest` (this "
        "corpus is finite, so the first batch waits until every lane has one) and with "
        f"`end_of_data: longest`. {index}. Shard files in the page cache, sources "
        "byte-compiled. Medians of "
        f"{rounds} round(s), both allocators back to back in each (the order alternates); "
        "the allocator ratios are medians of per-round ratios. The per-round times to the "
        "first batch are in brackets. `python -m bench.startup` runs this section alone.",
    ]


def run(
    work_dir: Path, rounds: int = 3, quick: bool = False, tokenizer: str | None = None
) -> dict[str, Any]:
    """Measure the whole section; the plain data ``bench.json`` keeps under ``startup``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger("zephon_client").setLevel(logging.WARNING)  # a line per connection
    support = probe_support()
    log.info("start-up: index dir %s, zephon index %s", support.index_dir, support.index_cmd)
    small, ref, ref_longest = cases(work_dir, quick, tokenizer)
    for case in (*small, ref):
        read_seconds(case.files, cold=False)  # into the page cache
    runs: list[dict[str, Any]] = []
    for rnd in range(rounds):
        order = startup_report.ALLOCATORS[:: -1 if rnd % 2 else 1]
        for case in (*small, ref, ref_longest):
            log.info("start-up round %d: %s", rnd + 1, case.name)
            runs += run_case(case, support, rnd, order, work_dir)
    log.info("start-up: read rates")
    rates = read_rates(ref, support, work_dir, rounds=rounds)
    log.info("start-up: tokens/s from S3 on loopback vs local disk")
    from . import storage_rate

    storage = storage_rate.measure(
        ref.files,
        bpe_tokenizer(Path(ref.files[0]).parent, tokenizer),
        work_dir / "storage",
        rounds=rounds,  # 20-second windows on two cores shared with moto are noisy
        seconds=10.0 if quick else 30.0,
    )
    return {
        "index_dir": support.index_dir,
        "index_cmd": support.index_cmd,
        "rounds": rounds,
        "reference_case": ref.name,
        "reference_longest_case": ref_longest.name,
        "runs": runs,
        "index_rate": rates,
        "method": method(support, rounds),
        "storage": storage_rate.summary(storage),
        "storage_rates": storage,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.startup", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds (medians over them)")
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 shards, 8 x 4 MB")
    parser.add_argument(
        "--publish",
        action="store_true",
        help="replace the Start-up section of docs/benchmarks.md (the rest of the page is kept)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    compile_sources()
    section = run(RESULTS / "startup-run", rounds=args.rounds, quick=args.quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "startup.json").write_text(json.dumps(section, indent=1) + "\n")
    print(startup_report.targets_table(section))
    print()
    print(startup_report.runs_table(section))
    print()
    print(startup_report.rate_text(section["index_rate"]))
    if args.publish:
        from . import report

        page = report.DOCS / "benchmarks.md"
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        provenance = (
            f"This section comes from its own run, `python -m bench.startup --rounds "
            f"{args.rounds} --publish` on {stamp}; the rest of this page is the run named above."
        )
        page.write_text(startup_report.replace_section(page.read_text(), section, provenance))
    return 0


if __name__ == "__main__":
    sys.exit(main())
