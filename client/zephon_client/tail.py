"""``zephon tail``: print a lane's batches as a server streams them.

Each batch prints a header ``lane L seq S`` with its row count and tensor shapes, then (when
``decode``) one line per row with its tokens decoded: with the server's built-in ``byte``
tokenizer ids below 256 are UTF-8 bytes and other ids print as ``<id>``; with a
``tokenizer.json`` path that exists here and the ``tokenizers`` package installed, the
Hugging Face tokenizer decodes them; otherwise the ids are printed. Padding is skipped using
``padding_mask`` (True on tokens) or ``segment_ids`` (0 on padding) when the batch has them.
A batch with a ``loss_mask`` (chat and instruction pipelines) prints each row's documents on
lines of their own (from ``cu_seqlens``, else ``segment_ids``), every run of trained tokens
marked ``train:``: what the model learns, as it reaches the trainer.

The reader registers as consumer ``tail-<pid>`` and acknowledges only what it printed.
Run it as ``python -m zephon_client.tail ADDRESS LANE``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, TextIO

import grpc
import numpy as np

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

from .channel import TLSConfig, auth_metadata, close_aio_channel, make_aio_channel, make_channel
from .connect_hint import diagnose_error
from .errors import ZephonClientError
from .options import whole_number
from .stream import LaneStream
from .wire import DecodedBatch, LaneEnd, decode_end

BYTE_TOKENIZER = "byte"


def end_line(end: LaneEnd) -> str:
    """``zephon tail``'s line for a lane's end, counting the documents closed after its last
    batch by reason."""
    reasons = Counter(c.tombstone or "delivered" for c in end.closed)
    after = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    return f"lane {end.lane}: end of stream at seq {end.next_seq}" + (
        f"; closed after the last batch: {after}" if after else ""
    )


def tail(
    address: str,
    lane: int,
    count: int | None = 10,
    *,
    start_seq: int = 0,
    decode: bool = True,
    out: TextIO | None = None,
    auth_token: str | None = None,
    tls: TLSConfig | None = None,
    verify: bool = True,
    max_chars: int | None = None,
    timeout: float | None = None,
    wait: float = 0.0,
) -> int:
    """Print ``count`` batches of ``lane`` from ``start_seq`` (all until the end if ``None``).

    Returns the number of batches printed. ``max_chars`` truncates each decoded row;
    ``timeout`` bounds the wait for each batch (seconds); ``wait`` is how long to wait for a
    server that does not answer yet (starting up) before giving up (0: give up at once). Raises
    :class:`~zephon_client.errors.ZephonClientError` with the server's message when the call
    fails (e.g. ``OUT_OF_RANGE`` naming the reachable seqs).
    """
    out = sys.stdout if out is None else out
    try:
        whole_number("lane", lane, 0, "a lane number")
        whole_number("start_seq", start_seq, 0, "a seq")
        if count is not None:
            whole_number("count", count, 1, "batches to print; None for all")
    except ValueError as exc:
        raise ZephonClientError(None, str(exc)) from None
    metadata = auth_metadata(auth_token)
    channel = make_channel(address, tls=tls)
    stream: LaneStream | None = None
    aio_channel: Any = None
    try:
        info = _server_info(channel, address, tls, timeout, wait, metadata)
        detokenize = detokenizer(info.tokenizer) if decode else None
        aio_channel = make_aio_channel(address, tls=tls)
        stream = LaneStream(
            pb_grpc.DataServiceStub(aio_channel),
            address=address,
            lane=lane,
            start_seq=start_seq,
            consumer=f"tail-{os.getpid()}",
            previous_chain=None,
            verify=verify,
            metadata=metadata,
        )
        printed = _print_stream(stream, lane, address, count, out, detokenize, max_chars, timeout)
        out.flush()
        return printed
    finally:
        if stream is not None:
            stream.close(flush=True)
        if aio_channel is not None:
            close_aio_channel(aio_channel)
        channel.close()


def _server_info(
    channel: Any,
    address: str,
    tls: TLSConfig | None,
    timeout: float | None,
    wait: float,
    metadata: Any,
) -> Any:
    """The server's ``GetInfo`` answer, retried while it is unavailable for ``wait`` seconds
    (:class:`ZephonClientError` naming the cause when known, when the call fails)."""
    stub = pb_grpc.DataServiceStub(channel)
    deadline = time.monotonic() + wait
    while True:
        try:
            return stub.GetInfo(pb.GetInfoRequest(), timeout=timeout or 30.0, metadata=metadata)
        except grpc.RpcError as error:
            why = diagnose_error(address, tls, error)
            remaining = deadline - time.monotonic()
            unavailable = error.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            if unavailable and remaining > 0 and not (why is not None and why.permanent):
                time.sleep(min(_WAIT_STEP_S, remaining))
                continue
            err = ZephonClientError.from_rpc_error(error, address=address)
            if why is not None:
                err = ZephonClientError(err.code, f"{err.message}; {why.hint}", address=address)
            if unavailable and not wait and not (why is not None and why.permanent):
                err = ZephonClientError(
                    err.code,
                    f"{err.message} (--wait SECONDS waits for a server that is starting)",
                    address=address,
                )
            raise err from None


_WAIT_STEP_S = 0.25  # between GetInfo attempts while waiting for a server to answer


def _print_stream(
    stream: LaneStream,
    lane: int,
    address: str,
    count: int | None,
    out: TextIO,
    detokenize: Any,
    max_chars: int | None,
    timeout: float | None,
) -> int:
    """Print the stream's batches (acknowledging each) until ``count`` or its end; the
    number printed."""
    printed = 0
    while count is None or printed < count:
        item = stream.get(timeout=timeout)
        if item.kind == "batch":
            assert item.batch is not None
            print_batch(item.batch, out, detokenize=detokenize, max_chars=max_chars)
            printed += 1
            stream.ack(item.batch.seq + 1)
        elif item.kind == "end":
            assert item.end is not None
            print(end_line(decode_end(lane, item.end)), file=out)
            break
        elif isinstance(item.error, grpc.RpcError):
            raise ZephonClientError.from_rpc_error(item.error, lane=lane, address=address) from None
        elif item.error is not None:
            raise item.error
        else:
            raise ZephonClientError(
                grpc.StatusCode.UNAVAILABLE,
                "the server ended the call without EndOfStream",
                lane=lane,
                address=address,
            )
    return printed


def print_batch(
    batch: DecodedBatch,
    out: TextIO,
    *,
    detokenize: Callable[[list[int]], str] | None = None,
    max_chars: int | None = None,
) -> None:
    """Print one batch: header with tensor shapes, then each row shown by ``detokenize``."""
    shapes = "  ".join(
        f"{name}{list(arr.shape)}:{arr.dtype.name}" for name, arr in sorted(batch.tensors.items())
    )
    rows = _row_count(batch)
    print(f"lane {batch.lane} seq {batch.seq}  rows={rows}  {shapes}", file=out)
    if detokenize is None or "input_ids" not in batch.tensors:
        return
    ids = batch.tensors["input_ids"]
    if ids.ndim == 1:
        ids = ids[None, :]
    keep = _token_mask(batch.tensors, ids.shape)
    trained = _shaped(batch.tensors, "loss_mask", ids.shape)
    for row in range(ids.shape[0]):
        if trained is not None:
            _print_trained_row(batch.tensors, row, ids, keep, trained, out, detokenize, max_chars)
            continue
        row_ids = [int(v) for v in ids[row][keep[row]]]
        print(f"  row {row}: {_cut(detokenize(row_ids), max_chars)}", file=out)


def _print_trained_row(
    tensors: dict[str, np.ndarray],
    row: int,
    ids: np.ndarray,
    keep: np.ndarray,
    trained: np.ndarray,
    out: TextIO,
    detokenize: Callable[[list[int]], str],
    max_chars: int | None,
) -> None:
    """A row with a ``loss_mask``: a line of counts, then one line per document in which each
    run of trained tokens is shown as ``train:`` and its text, the rest as its text alone."""
    documents = _documents(tensors, row, keep[row], ids.shape)
    mask = trained[row] != 0
    print(
        f"  row {row}: {len(documents)} documents, {int(keep[row].sum())} tokens, "
        f"{int(mask[keep[row]].sum())} trained",
        file=out,
    )
    for number, (start, end) in enumerate(documents):
        runs = _runs(mask[start:end])
        shown = " ".join(
            ("train:" if mask[start + a] else "")
            + detokenize(ids[row, start + a : start + b].tolist())
            for a, b in runs
        )
        print(f"    doc {number}: {_cut(shown, max_chars)}", file=out)


def _documents(
    tensors: dict[str, np.ndarray], row: int, keep: np.ndarray, shape: tuple[int, ...]
) -> list[tuple[int, int]]:
    """The [start, end) token ranges of a row's documents: from ``cu_seqlens`` and
    ``num_docs`` when the batch has them, else where ``segment_ids`` changes, else the row's
    tokens as one document. Padding (``keep`` False) is in none."""
    cu = tensors.get("cu_seqlens")
    count = tensors.get("num_docs")
    if cu is not None and count is not None and cu.ndim == 2 and row < len(cu):
        bounds = [int(v) for v in cu[row][: int(count[row]) + 1]]
        return [(a, b) for a, b in pairwise(bounds) if b > a]
    segments = _shaped(tensors, "segment_ids", shape)
    labels = segments[row] if segments is not None else keep.astype(np.int64)
    return [(a, b) for a, b in _runs(labels) if keep[a]]


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) ranges of equal consecutive ``values``."""
    if not len(values):
        return []
    edges = [0, *(int(i) + 1 for i in np.flatnonzero(values[1:] != values[:-1])), len(values)]
    return list(pairwise(edges))


def _cut(text: str, max_chars: int | None) -> str:
    return text[:max_chars] + "..." if max_chars is not None and len(text) > max_chars else text


def _shaped(tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...]) -> Any:
    """Tensor ``name`` when the batch has it with ``shape`` (a row-per-token tensor), else None."""
    value = tensors.get(name)
    return value if value is not None and value.shape == shape else None


def byte_decode(ids: Sequence[int]) -> str:
    """The byte tokenizer's ids as text: runs of ids < 256 as UTF-8, others as ``<id>``."""
    parts: list[str] = []
    run = bytearray()
    for token in ids:
        if 0 <= token < 256:
            run.append(token)
            continue
        if run:
            parts.append(run.decode("utf-8", errors="replace"))
            run.clear()
        parts.append(f"<{token}>")
    if run:
        parts.append(run.decode("utf-8", errors="replace"))
    return "".join(parts)


def _ids_text(ids: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, ids)) + "]"


def detokenizer(spec: str) -> Callable[[list[int]], str]:
    """How to show a row's ids (quoted text, or the ids) given the server's tokenizer spec."""
    if spec == BYTE_TOKENIZER:
        return lambda ids: repr(byte_decode(ids))
    if spec and os.path.isfile(spec):
        try:
            # Optional dependency, imported by name so the client installs without it.
            tokenizers: Any = importlib.import_module("tokenizers")
        except ImportError:
            return _ids_text
        tokenizer = tokenizers.Tokenizer.from_file(spec)

        def hf_decode(ids: list[int]) -> str:
            return repr(str(tokenizer.decode(ids, skip_special_tokens=False)))

        return hf_decode
    return _ids_text


def _token_mask(tensors: dict[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """True on real tokens: ``padding_mask``, else ``segment_ids != 0``, else everything."""
    mask = _shaped(tensors, "padding_mask", shape)
    if mask is not None:
        return np.asarray(mask, dtype=bool)
    segments = _shaped(tensors, "segment_ids", shape)
    if segments is not None:
        return np.asarray(segments != 0)
    return np.ones(shape, dtype=bool)


def _row_count(batch: DecodedBatch) -> int:
    if batch.rows:
        return len(batch.rows)
    for arr in batch.tensors.values():
        return int(arr.shape[0]) if arr.ndim else 1
    return 0


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``zephon tail`` that say how to reach the server: TLS and the wait."""
    parser.add_argument(
        "--tls-ca", metavar="PEM", help="connect with TLS, trusting this CA certificate (PEM)"
    )
    parser.add_argument(
        "--tls-cert", metavar="PEM", help="client certificate for mutual TLS (with --tls-key)"
    )
    parser.add_argument("--tls-key", metavar="PEM", help="the client certificate's private key")
    parser.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="check the server's certificate against NAME instead of the address's host",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for a server that does not answer yet (default 0: fail at "
        "once); the token comes from $ZEPHON_AUTH_TOKEN",
    )


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """``tail`` keyword arguments from :func:`add_connection_arguments`' flags."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ZephonClientError(None, "--tls-cert and --tls-key go together (mutual TLS)")
    if args.wait < 0:
        raise ZephonClientError(None, f"--wait must be >= 0 seconds, got {args.wait:g}")
    tls = None
    if any(v is not None for v in (args.tls_ca, args.tls_cert, args.tls_server_name)):
        for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert)):
            if path is not None and not os.path.isfile(path):
                raise ZephonClientError(None, f"{flag} {path!r}: no such file")
        if args.tls_key is not None and not os.path.isfile(args.tls_key):
            raise ZephonClientError(None, f"--tls-key {args.tls_key!r}: no such file")
        tls = TLSConfig(
            root_certificates=args.tls_ca,
            certificate_chain=args.tls_cert,
            private_key=args.tls_key,
            server_name_override=args.tls_server_name,
        )
    return {"tls": tls, "wait": args.wait}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m zephon_client.tail ADDRESS LANE [-n N] [--start-seq S]``."""
    parser = argparse.ArgumentParser(prog="zephon tail", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="server address, host:port")
    parser.add_argument("lane", type=int, help="the lane to read (0 .. lanes - 1)")
    parser.add_argument("-n", "--count", type=int, default=10, help="batches to print (0: all)")
    parser.add_argument("--start-seq", type=int, default=0, help="the first seq (default 0)")
    parser.add_argument(
        "--no-decode", action="store_true", help="print each batch's header line only, no text"
    )
    parser.add_argument("--max-chars", type=int, default=None)
    add_connection_arguments(parser)
    args = parser.parse_args(argv)
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
    except ZephonClientError as error:
        print(f"zephon tail: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
