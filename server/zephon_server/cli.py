"""The zephon command line: serve a pipeline over gRPC; explain, dump, index and tail it.

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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .engine.errors import ZephonError
from .pipeline_flags import load_pipeline, pipeline_args, tuned_runtime
from .stop_signals import StartupInterrupted, StopSignals

if TYPE_CHECKING:
    from .engine.numbered_batch import NumberedBatch

log = logging.getLogger("zephon")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def batch_json(batch: NumberedBatch) -> dict[str, Any]:
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
    """Print the compiled plan."""
    pipeline, execution = load_pipeline(args, tuned_runtime())
    print(pipeline.explain(execution))
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    """Run in-process and print the first N batches of each selected lane."""
    from .engine.run import PipelineRun
    from .serve_flags import checkpoint_key_from_args, parse_lanes

    if args.batches < 1:
        raise ZephonError(f"--batches must be >= 1 (batches per lane), got {args.batches}")
    key = checkpoint_key_from_args(args, os.environ)
    pipeline, execution = load_pipeline(args, tuned_runtime())
    lanes = parse_lanes(args.lanes)
    for lane in lanes or ():
        if not 0 <= lane < pipeline.lanes:
            raise ZephonError(
                f"--lanes: lane {lane} does not exist; the pipeline's lanes are "
                f"0..{pipeline.lanes - 1}"
            )
    plan = pipeline.plan(execution)

    resume = None
    if args.resume_state:
        from .engine.checkpoint import read_state_file

        resume = read_state_file(args.resume_state, key)
    run = PipelineRun(plan, lanes=_dump_lanes(plan, lanes, resume), resume=resume)
    shown = run.lanes if lanes is None else sorted(set(lanes))
    counts = dict.fromkeys(shown, 0)
    open_lanes = set(shown)
    try:
        _print_lanes(run, args, counts, open_lanes)
    finally:
        run.close()  # also on Ctrl-C: worker processes and shared memory go with the run
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


def _print_lanes(
    run: Any, args: argparse.Namespace, counts: dict[int, int], open_lanes: set[int]
) -> None:
    """Print the first ``args.batches`` batches of each lane in ``counts`` (counted there)."""
    from .engine.numbered_batch import NumberedBatch

    wanted = args.batches
    out = sys.stdout
    show = _decoded_printer(run.plan) if args.format == "decoded" else None
    for item in run:
        if item.lane_id not in counts:
            continue  # a lane run only for the common end (end_of_data)
        if not isinstance(item, NumberedBatch):
            open_lanes.discard(item.lane_id)
        elif counts[item.lane_id] < wanted:
            counts[item.lane_id] += 1
            if args.format == "digest":
                out.write(f"{item.lane_id} {item.seq} {item.chain_digest.hex()}\n")
            elif args.format == "json":
                out.write(json.dumps(batch_json(item)) + "\n")
            elif show is not None:
                show(item, out)
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


def _decoded_printer(plan: Any) -> Any:
    """``zephon dump --format decoded``'s printer: each batch as ``zephon tail`` prints it
    (rows decoded by the pipeline's tokenizer, trained runs marked), from the client package
    (:class:`ZephonError` naming the install when it is missing)."""
    try:
        from zephon_client.batch_text import detokenizer, print_batch
        from zephon_client.wire import DecodedBatch
    except ImportError as exc:
        raise ZephonError(
            f"zephon dump --format decoded prints batches as zephon tail does, with the client "
            f"package zephon_client ({exc}); install the project with its client "
            "(pip install zephon-service), or use --format text"
        ) from None
    from .engine.planner import TOKENIZING

    tokenizers = [op for op in plan.ops if isinstance(op, TOKENIZING)]
    decode = detokenizer(tokenizers[-1].tokenizer_spec if tokenizers else "")

    def show(item: Any, out: Any) -> None:
        batch = DecodedBatch(item.lane_id, item.seq, dict(item.tensors))
        print_batch(batch, out, detokenize=decode)

    return show


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
    pipeline, execution = load_pipeline(args, tuned_runtime())
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


def cmd_serve(
    args: argparse.Namespace,
    signals: StopSignals | None = None,
    *,
    allocator: str | None = None,
    exec_argv: Sequence[str] | None = None,
) -> int:
    """Serve the pipeline over gRPC until SIGTERM (``signals``, ``exec_argv``: see
    :func:`main`; ``allocator``: the choice already carried out). The flags and environment
    become one frozen ``ServeConfig`` (checked before the pipeline loads), whose process
    tuning is applied before the pipeline starts its threads."""
    from .serve_flags import serve_config
    from .service.server import serve

    config = serve_config(args, os.environ)
    if config.runtime.allocator != allocator:  # e.g. an abbreviated --allocator
        _ensure_allocator(config.runtime.allocator, exec_argv, signals)
    config.runtime.apply_process()
    pipeline, execution = load_pipeline(args, config.runtime)
    return serve(config, pipeline, execution, signals)


def cmd_sign_checkpoint(args: argparse.Namespace) -> int:
    """Sign an intact checkpoint file with the key, for servers that require signatures."""
    from .engine.checkpoint import UnsignedCheckpoint, read_state_file, write_atomic
    from .serve_flags import CHECKPOINT_KEY_ENV, checkpoint_key_from_args

    key = checkpoint_key_from_args(args, os.environ)
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
    """Print batches of one lane from a running server, with the client package's
    :func:`zephon_client.tail.tail`. With its flags, the one place the server package uses the
    client, and only when the command runs (an import-boundary test keeps it so): a server installed
    without the client still serves."""
    try:
        from zephon_client import ZephonClientError
        from zephon_client.tail import connection_options, tail
    except ImportError as exc:
        raise ZephonError(
            f"zephon tail needs the client package zephon_client ({exc}); install the "
            "project with its client (pip install zephon-service), or run the client's own "
            "python -m zephon_client.tail"
        ) from None
    try:
        tail(
            args.address,
            args.lane,
            args.count or None,
            start_seq=args.start_seq,
            decode=not args.no_decode,
            max_chars=args.max_chars,
            **connection_options(args),
        )
    except ZephonClientError as exc:
        print(f"zephon tail: {exc}", file=sys.stderr)
        return 2
    return 0


def _tail_connection_arguments(p: argparse.ArgumentParser) -> None:
    """``zephon tail``'s TLS and ``--wait`` flags, from the client package when installed
    (a server installed without it still parses its other commands)."""
    try:
        from zephon_client.tail import add_connection_arguments
    except ImportError:
        return
    add_connection_arguments(p)


def checkpoint_key_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--checkpoint-key-file`` for a command that reads or writes checkpoint files."""
    from .serve_flags import CHECKPOINT_KEY_ENV

    p.add_argument(
        "--checkpoint-key-file",
        default=None,
        metavar="PATH",
        help=f"the checkpoint key to {what} (HMAC-SHA256; or set {CHECKPOINT_KEY_ENV})",
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser for every sub-command; given the ``command`` being run, it imports
    the client package (for ``tail``'s flags) only when that is ``tail``."""
    parser = argparse.ArgumentParser(prog="zephon", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("explain", help="print the compiled plan")
    pipeline_args(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("dump", help="run in-process and print the first N batches of each lane")
    pipeline_args(p)
    p.add_argument("--lanes", help="lanes to dump, e.g. 0,1 or 0-3 (default: all)")
    p.add_argument("--batches", type=int, default=4, help="batches per lane, >= 1 (default 4)")
    p.add_argument(
        "--format",
        choices=("text", "json", "digest", "decoded"),
        default="text",
        help="text: a line per batch; json: the batch as JSON; digest: its chain digest; "
        "decoded: its rows as text, trained runs marked train: (as zephon tail prints them)",
    )
    p.add_argument("--save-state", metavar="FILE", help="write the resume state after the dump")
    p.add_argument("--resume-state", metavar="FILE", help="continue each lane from a state file")
    checkpoint_key_arg(p, "sign --save-state and require --resume-state signed with")
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("serve", help="serve the pipeline over gRPC")
    pipeline_args(p)
    from .serve_flags import add_serve_arguments

    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("index", help="build the shard index of every dataset ahead of time")
    from .index_command import add_index_arguments, cmd_index

    add_index_arguments(p)
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("tail", help="print batches of a lane from a running server")
    p.add_argument("--address", required=True, help="server address host:port")
    p.add_argument("--lane", type=int, required=True, help="the lane to read (0 .. lanes - 1)")
    p.add_argument("--count", type=int, default=4, help="batches to print (0: all; default 4)")
    p.add_argument("--start-seq", type=int, default=0, help="the first seq to read (default 0)")
    p.add_argument(
        "--no-decode", action="store_true", help="print each batch's header line only, no text"
    )
    p.add_argument(
        "--max-chars",
        type=int,
        default=None,
        metavar="N",
        help="cut each printed row (or document) after N characters (default: whole)",
    )
    if command in (None, "tail"):  # the client is imported for tail alone (a serve's start-up)
        _tail_connection_arguments(p)
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


def main(argv: Sequence[str] | None = None, *, exec_argv: Sequence[str] | None = None) -> int:
    """Run the ``zephon`` command line ``argv`` (default ``sys.argv[1:]``); the exit code.

    ``exec_argv`` is the command line that runs this program again (:func:`entry` passes
    ``sys.orig_argv``): ``serve`` may then re-execute itself on a faster allocator. Callers
    that run the command inside a process of their own (tests, embedding) leave it None:
    the allocator is decided the same way, and a re-execution is logged instead of done.
    For ``serve``, SIGTERM/SIGINT are handled from the first line (see :mod:`.stop_signals`):
    one during the start-up stops it and exits 0, never a traceback or status -15.
    """
    signals = None
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        signals = _stop_signals(words)
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        allocator = None
        if _command(words) == "serve" and not {"-h", "--help"} & set(words):
            # Before the parser imports the server (numpy, gRPC, the engine), which a
            # re-executed image would import again.
            from .runtime.allocator import requested

            allocator = requested(words)
            _ensure_allocator(allocator, exec_argv, signals)
        args = build_parser(_command(words)).parse_args(words)
        if args.verbose:
            logging.getLogger().setLevel(logging.DEBUG)
        if args.command == "serve":
            return cmd_serve(args, signals, allocator=allocator, exec_argv=exec_argv)
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
    except KeyboardInterrupt:  # Ctrl-C in dump, explain, index, tail (serve handles its own)
        print("zephon: interrupted", file=sys.stderr)
        return 130


def entry() -> NoReturn:
    """The ``zephon`` program (console script and ``python -m zephon_server.cli``): its own
    process, so ``serve`` may re-execute it (:func:`main` with ``exec_argv``)."""
    sys.exit(main(sys.argv[1:], exec_argv=sys.orig_argv))


def _command(argv: Sequence[str]) -> str | None:
    """The sub-command a command line names (its first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _stop_signals(argv: Sequence[str]) -> StopSignals | None:
    """Stop-signal handling for ``serve`` run from the main thread (None otherwise)."""
    if _command(argv) != "serve" or threading.current_thread() is not threading.main_thread():
        return None
    return StopSignals.install()


def _ensure_allocator(
    choice: str, exec_argv: Sequence[str] | None, signals: StopSignals | None
) -> None:
    """:func:`~.runtime.allocator.ensure_allocator` with the stop signals blocked: one that
    arrives meanwhile stays pending for the re-executed image."""
    from .runtime.allocator import ensure_allocator

    with signals.blocked() if signals else contextlib.nullcontext():
        ensure_allocator(choice, exec_argv)


if __name__ == "__main__":
    entry()
