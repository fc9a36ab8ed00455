"""The client's side of a shared-memory ring (``RingOffer``): map the server's file, or say why not.

A server on the same host offers each stream a file under ``/dev/shm`` that starts with a
random nonce; a client that can map it and finds the nonce reads the stream's tensor bytes
from it (``Tensor.ring_offset``), copying each tensor out on receipt, instead of receiving them
in the messages. Anything else (another host, another user, no ``/dev/shm``) is a polite
decline and the bytes keep coming in the messages: the stream is the same either way.
"""

from __future__ import annotations

import mmap
import os

from zephon_proto.v1 import data_service_pb2 as pb
from zephon_wire import RING_DIR, RING_PREFIX


def open_ring(offer: pb.RingOffer) -> tuple[mmap.mmap | None, str]:
    """The offered ring mapped read-only, or ``None`` and the reason it cannot be used."""
    path = offer.path
    name = path[len(RING_DIR) :] if path.startswith(RING_DIR) else ""
    if not name.startswith(RING_PREFIX) or "/" in name:
        return None, f"{path!r} is not a ring file ({RING_DIR}{RING_PREFIX}*)"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return None, f"cannot open {path}: {exc.strerror or exc} (another host?)"
    try:
        if os.fstat(fd).st_size < offer.size or offer.size < len(offer.nonce):
            return None, f"{path} is smaller than the offered {offer.size} bytes"
        ring = mmap.mmap(fd, offer.size, prot=mmap.PROT_READ)
    except (OSError, ValueError) as exc:
        return None, f"cannot map {path}: {exc}"
    finally:
        os.close(fd)
    if not offer.nonce or ring[: len(offer.nonce)] != offer.nonce:
        ring.close()
        return None, f"{path} does not start with the offered nonce (a different host's file?)"
    return ring, ""


def reply(ring: mmap.mmap | None, reason: str) -> pb.StreamBatchesRequest:
    """The ``RingReply`` for the outcome of :func:`open_ring`."""
    return pb.StreamBatchesRequest(ring=pb.RingReply(accepted=ring is not None, reason=reason))
