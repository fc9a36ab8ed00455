"""``zephon tail``: print a lane's batches as a server streams them.

Each batch prints as :mod:`.batch_text` shows it: a header ``lane L seq S`` with its row
count and tensor shapes, then (when ``decode``) its rows decoded, documents and trained runs
marked when the batch has a ``loss_mask``.

The reader registers as consumer ``tail-<pid>`` and acknowledges only what it printed.
Run it as ``python -m zephon_client.tail ADDRESS LANE``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

import grpc

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

from .batch_text import BYTE_TOKENIZER, byte_decode, detokenizer, print_batch
from .channel import TLSConfig, auth_metadata, close_aio_channel, make_aio_channel, make_channel
from .connect_hint import diagnose_error
from .errors import ZephonClientError
from .options import whole_number
from .stream import LaneStream
from .wire import LaneEnd, decode_end

__all__ = ["BYTE_TOKENIZER", "byte_decode", "detokenizer", "end_line", "print_batch", "tail"]


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
        if max_chars is not None:
            whole_number("max_chars", max_chars, 1, "characters per row; None for all")
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
