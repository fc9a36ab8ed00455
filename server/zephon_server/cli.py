"""The ``zephon`` command line: explain, dump, and (for now) running the default pipeline.

``zephon explain --config F`` prints the plan. ``zephon dump --config F`` runs the pipeline
in-process and prints the first N batches of each selected lane as text, JSON lines, or
digest lines ``<lane> <seq> <chain_digest_hex>``.

The module imports little at the top: ``zephon serve`` handles SIGTERM/SIGINT from the start
of :func:`main` (:mod:`.stop_signals`), so the heavy imports come after that, inside the
commands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .engine.errors import ZephonError
from .stop_signals import StartupInterrupted, StopSignals

if TYPE_CHECKING:
    from .engine.checkpoint_key import CheckpointKey
    from .engine.execution import ExecutionConfig
    from .engine.pipeline import Pipeline
    from .engine.records import SampleBatch

log = logging.getLogger("zephon")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def parse_lanes(text: str | None) -> list[int] | None:
    """``"0,1,4-7"`` → ``[0, 1, 4, 5, 6, 7]``; None stays None (all lanes)."""
    if not text:
        return None
    lanes: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                lanes.extend(range(int(lo), int(hi) + 1))
            else:
                lanes.append(int(part))
    except ValueError:
        raise ZephonError(f"--lanes: expected a list like 0,1,4-7, got {text!r}") from None
    return lanes


def load_pipeline(args: argparse.Namespace) -> tuple[Pipeline, ExecutionConfig]:
    """The pipeline named by --config or --pipeline, or the embedded default."""
    from .engine.execution import ExecutionConfig

    if getattr(args, "config", None) and getattr(args, "pipeline", None):
        raise ZephonError("give either --config or --pipeline, not both")
    if getattr(args, "config", None):
        from .engine.config import load_config

        pipeline, execution = load_config(args.config)
    elif getattr(args, "pipeline", None):
        from .engine.ops.map_transform import resolve_callable

        pipeline, execution = _python_pipeline(
            resolve_callable(_import_path(args.pipeline), what="--pipeline")
        )
    else:
        from .defaults import default_pipeline

        pipeline, execution = default_pipeline(), ExecutionConfig()
    overrides = {
        "runner": getattr(args, "runner", None),
        "workers": getattr(args, "workers", None),
        "index_dir": index_dir_from_args(args, execution.index_dir, os.environ),
    }
    return pipeline, execution.with_overrides(**overrides)


def index_dir_from_args(
    args: argparse.Namespace, configured: str | None, environ: Mapping[str, str]
) -> str:
    """Where the shard index lives: ``--index-dir`` (wins), else the config's ``index_dir``,
    else ``<state-dir>/index`` when there is a ``--state-dir``, else the per-user cache
    directory (``$XDG_CACHE_HOME/zephon/index``, ``~/.cache/zephon/index``). ``none`` keeps
    it in memory only."""
    from .engine.index_dir import user_index_dir

    flag = getattr(args, "index_dir", None)
    if flag is not None:
        if not flag:
            raise ZephonError("--index-dir: give a directory, or 'none' to keep it in memory")
        return str(flag)
    if configured is not None:
        return configured
    state_dir = getattr(args, "state_dir", None)
    if state_dir:
        return os.path.join(state_dir, "index")
    return user_index_dir(environ)


def _import_path(spec: str) -> str:
    """Accept ``file.py:function``: the file's directory joins ``sys.path`` and the file is
    imported under its own module name, so process and Ray workers can import it too."""
    import os

    path, _, func = spec.rpartition(":")
    if not path.endswith(".py"):
        return spec
    if not os.path.isfile(path):
        raise ZephonError(f"--pipeline: file {path!r} does not exist")
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = os.path.splitext(os.path.basename(path))[0]
    if not name.isidentifier():
        raise ZephonError(f"--pipeline: {path!r} must be named like a Python module")
    return f"{name}:{func}"


def _python_pipeline(fn: Any) -> tuple[Pipeline, ExecutionConfig]:
    from .engine.execution import ExecutionConfig
    from .engine.pipeline import Pipeline

    result = fn()
    if isinstance(result, tuple):
        pipeline, execution = result
    else:
        pipeline, execution = result, ExecutionConfig()
    if not isinstance(pipeline, Pipeline):
        raise ZephonError(
            "--pipeline: the function must return a Pipeline "
            "(or a (Pipeline, ExecutionConfig) tuple)"
        )
    return pipeline, execution


def batch_json(batch: SampleBatch) -> dict[str, Any]:
    """A JSON-able view of a batch (tensors as nested lists)."""
    return {
        "lane": batch.lane_id,
        "seq": batch.seq,
        "digest": batch.digest.hex(),
        "chain_digest": batch.chain_digest.hex(),
        "tensors": {
            k: {"dtype": str(v.dtype), "shape": list(v.shape), "data": v.tolist()}
            for k, v in sorted(batch.tensors.items())
        },
        "rows": [
            [[*list(span.doc), span.start, span.length] for span in meta.spans]
            for meta in batch.rows
        ],
    }


def cmd_explain(args: argparse.Namespace) -> int:
    pipeline, execution = load_pipeline(args)
    print(pipeline.explain(execution))
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    from .engine.records import SampleBatch
    from .engine.run import PipelineRun

    key = checkpoint_key_from_args(args)
    pipeline, execution = load_pipeline(args)
    lanes = parse_lanes(args.lanes)
    plan = pipeline.plan(execution)

    resume = None
    if args.resume_state:
        from .engine.checkpoint import read_state_file

        resume = read_state_file(args.resume_state, key)
    run = PipelineRun(plan, lanes=_dump_lanes(plan, lanes, resume), resume=resume)
    shown = run.lanes if lanes is None else sorted(set(lanes))
    wanted = args.batches
    counts = dict.fromkeys(shown, 0)
    open_lanes = set(shown)
    out = sys.stdout
    for item in run:
        if item.lane_id not in counts:
            continue  # a lane run only for the common end (end_of_data)
        if not isinstance(item, SampleBatch):
            open_lanes.discard(item.lane_id)
        elif counts[item.lane_id] < wanted:
            counts[item.lane_id] += 1
            if args.format == "digest":
                out.write(f"{item.lane_id} {item.seq} {item.chain_digest.hex()}\n")
            elif args.format == "json":
                out.write(json.dumps(batch_json(item)) + "\n")
            else:
                shapes = " ".join(f"{k}{list(v.shape)}" for k, v in sorted(item.tensors.items()))
                out.write(
                    f"lane {item.lane_id} seq {item.seq} tokens {item.num_tokens()} "
                    f"{shapes} chain {item.chain_digest.hex()[:16]}\n"
                )
            if counts[item.lane_id] >= wanted:
                open_lanes.discard(item.lane_id)
        if not open_lanes:
            break
    run.close()
    if args.save_state:
        from .engine.checkpoint import write_atomic
        from .engine.manifest import ShardManifest, manifest_dir, save_manifest

        positions = {lane: run.logs[lane].start.next_seq + n for lane, n in counts.items()}
        # The shard manifest first (next to the file): a refused resume then names the shard.
        manifest = ShardManifest.of(plan.fingerprint, plan.datasets)
        save_manifest(manifest_dir(Path(args.save_state).absolute().parent), manifest)
        write_atomic(args.save_state, run.checkpoint(positions).encode(key))
        log.info("saved resume state at %s to %s", positions, args.save_state)
    return 0


def _dump_lanes(plan: Any, lanes: list[int] | None, resume: Any) -> list[int] | None:
    """The lanes ``zephon dump`` runs: every lane when it shows some lanes of a ``shortest``
    pipeline (the common end needs every lane's length), else the ones it shows."""
    from .engine.lane_ends import applies

    n = plan.pipeline.lanes
    if lanes is None or not applies(plan.pipeline, range(n)):
        return lanes
    if resume is not None and sorted(resume.lanes) != list(range(n)):
        return lanes  # resume state of some lanes: only those can run
    return list(range(n))


def cmd_run_default(args: argparse.Namespace) -> int:
    """Run the embedded default pipeline in-process, logging batches and throughput."""
    pipeline, execution = load_pipeline(args)
    print(pipeline.explain(execution))
    run = pipeline.run(execution)
    start = last = time.monotonic()
    batches = tokens = 0
    for batch in run.batches():
        batches += 1
        tokens += batch.num_tokens()
        now = time.monotonic()
        if batches <= 3 or now - last >= 1.0:
            last = now
            log.info(
                "lane %d seq %d %s | %d batches, %.0f tokens/s",
                batch.lane_id,
                batch.seq,
                {k: list(v.shape) for k, v in batch.tensors.items()},
                batches,
                tokens / max(now - start, 1e-9),
            )
        if args.batches and batches >= args.batches:
            break
    run.close()
    elapsed = time.monotonic() - start
    log.info(
        "done: %d batches, %d tokens in %.2fs (%.0f tokens/s)",
        batches,
        tokens,
        elapsed,
        tokens / max(elapsed, 1e-9),
    )
    return 0


def cmd_serve(args: argparse.Namespace, signals: StopSignals | None = None) -> int:
    """Serve the pipeline over gRPC until SIGTERM (``signals``: see :func:`main`)."""
    from .service.server import serve

    pipeline, execution = load_pipeline(args)
    return serve(args, pipeline, execution, signals)


CHECKPOINT_KEY_ENV = "ZEPHON_CHECKPOINT_KEY"
"""Environment variable holding the checkpoint key (``--checkpoint-key-file`` wins)."""


def checkpoint_key_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> CheckpointKey | None:
    """The checkpoint key ``--checkpoint-key-file`` or ``ZEPHON_CHECKPOINT_KEY`` gives (the
    flag wins), or None: checkpoints are then written unsigned and read unverified."""
    from .engine.checkpoint_key import CheckpointKey

    env = os.environ if environ is None else environ
    path = getattr(args, "checkpoint_key_file", None)
    if path:
        return CheckpointKey.from_file(path)
    text = env.get(CHECKPOINT_KEY_ENV, "")
    if text.strip():
        return CheckpointKey.from_text(text, CHECKPOINT_KEY_ENV)
    return None


def cmd_sign_checkpoint(args: argparse.Namespace) -> int:
    """Sign an intact checkpoint file with the key, for servers that require signatures."""
    from .engine.checkpoint import UnsignedCheckpoint, read_state_file, write_atomic

    key = checkpoint_key_from_args(args)
    if key is None:
        raise ZephonError(
            f"sign-checkpoint needs the key: --checkpoint-key-file PATH or {CHECKPOINT_KEY_ENV}"
        )
    try:
        state = read_state_file(args.input, key)  # signed with this key already
    except UnsignedCheckpoint:
        state = read_state_file(args.input)  # intact (checksum), now signed
    output = args.output or args.input
    write_atomic(output, state.encode(key))
    print(f"signed {args.input} -> {output} (key from {key.source})")
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    """Print batches of one lane from a running server."""
    from zephon_client import ZephonClientError
    from zephon_client.tail import tail

    try:
        tail(
            args.address, args.lane, args.count, start_seq=args.start_seq, decode=not args.no_decode
        )
    except ZephonClientError as exc:
        print(f"zephon tail: {exc}", file=sys.stderr)
        return 2
    return 0


def index_dir_arg(p: argparse.ArgumentParser) -> None:
    """``--index-dir`` for a command that resolves datasets."""
    p.add_argument(
        "--index-dir",
        default=None,
        metavar="DIR",
        help="where the shard index (row counts and offsets of every shard) is kept between "
        "runs; 'none' keeps it in memory only (default: the config's index_dir, else "
        "<state-dir>/index with --state-dir, else $XDG_CACHE_HOME/zephon/index or "
        "~/.cache/zephon/index)",
    )


def checkpoint_key_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--checkpoint-key-file`` for a command that reads or writes checkpoint files."""
    p.add_argument(
        "--checkpoint-key-file",
        default=None,
        metavar="PATH",
        help=f"the checkpoint key to {what} (HMAC-SHA256; or set {CHECKPOINT_KEY_ENV})",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every sub-command."""
    from .engine.execution import RUNNERS

    parser = argparse.ArgumentParser(prog="zephon", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def pipeline_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="pipeline YAML file")
        p.add_argument("--pipeline", help="Python pipeline, file.py:function or module:function")
        p.add_argument("--runner", choices=RUNNERS, help="override execution.runner")
        p.add_argument("--workers", type=int, help="override execution.workers")
        index_dir_arg(p)

    p = sub.add_parser("explain", help="print the compiled plan")
    pipeline_args(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("dump", help="run in-process and print the first N batches of each lane")
    pipeline_args(p)
    p.add_argument("--lanes", help="lanes to dump, e.g. 0,1 or 0-3 (default: all)")
    p.add_argument("--batches", type=int, default=4, help="batches per lane (default 4)")
    p.add_argument("--format", choices=("text", "json", "digest"), default="text")
    p.add_argument("--save-state", metavar="FILE", help="write the resume state after the dump")
    p.add_argument("--resume-state", metavar="FILE", help="continue each lane from a state file")
    checkpoint_key_arg(p, "sign --save-state and require --resume-state signed with")
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("serve", help="serve the pipeline over gRPC")
    pipeline_args(p)
    from .service.server import add_serve_arguments

    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("index", help="build the shard index of every dataset ahead of time")
    from .index_command import add_index_arguments, cmd_index

    add_index_arguments(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("tail", help="print batches of a lane from a running server")
    p.add_argument("--address", required=True, help="server address host:port")
    p.add_argument("--lane", type=int, required=True)
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--start-seq", type=int, default=0)
    p.add_argument("--no-decode", action="store_true", help="print token ids, not text")
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser(
        "sign-checkpoint", help="sign a checkpoint file with the checkpoint key (HMAC-SHA256)"
    )
    p.add_argument("input", metavar="FILE", help="an intact checkpoint file")
    p.add_argument("output", nargs="?", help="where to write it signed (default: in place)")
    checkpoint_key_arg(p, "sign with")
    p.set_defaults(func=cmd_sign_checkpoint)

    p = sub.add_parser("run-default", help="run a pipeline in-process with throughput logs")
    pipeline_args(p)
    p.add_argument("--batches", type=int, default=400, help="stop after N batches (0: all)")
    p.set_defaults(func=cmd_run_default)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zephon`` command.

    For ``serve``, SIGTERM/SIGINT are handled from the first line (see :mod:`.stop_signals`):
    one during the start-up stops it and exits 0, never a traceback or status -15.
    """
    signals = None
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        signals = _stop_signals(words)
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        preloaded = None
        if argv is None and _command(words) == "serve":
            # Run as a program: may re-execute itself with a faster malloc (allocator.py),
            # before the parser imports the server (numpy, gRPC, the engine), which the new
            # image would import again.
            from .allocator import requested

            preloaded = requested(words)
            _ensure_allocator(preloaded, signals)
        args = build_parser().parse_args(argv)
        if args.verbose:
            logging.getLogger().setLevel(logging.DEBUG)
        if args.command == "serve":
            if argv is None and args.allocator != preloaded:
                _ensure_allocator(args.allocator, signals)  # an abbreviated --allocator
            return cmd_serve(args, signals)
        return int(args.func(args))
    except ZephonError as exc:
        print(f"zephon: error: {exc}", file=sys.stderr)
        return 2
    except StartupInterrupted as exc:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # no-op once configured
        log.info("received %s during start-up; stopped before serving", exc.name)
        return 0
    except BrokenPipeError:
        return 0


def _command(argv: Sequence[str]) -> str | None:
    """The sub-command a command line names (its first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _stop_signals(argv: Sequence[str]) -> StopSignals | None:
    """Stop-signal handling for ``serve`` run from the main thread (None otherwise)."""
    if _command(argv) != "serve" or threading.current_thread() is not threading.main_thread():
        return None
    return StopSignals.install()


def _ensure_allocator(choice: str, signals: StopSignals | None) -> None:
    """:func:`~.allocator.ensure_allocator` with the stop signals blocked: one that arrives
    meanwhile stays pending for the re-executed image."""
    from .allocator import ensure_allocator

    with signals.blocked() if signals else contextlib.nullcontext():
        ensure_allocator(choice)


if __name__ == "__main__":
    sys.exit(main())
