"""The scenarios of ``tests/unit/test_checkpoint_signing.py``, also run by the tools.

Moved out of the test module so that ``tools/`` never imports ``tests``: the functions
check what their tests check and return what they measured.
"""

from __future__ import annotations

import hashlib
import json
import struct

from zephon_server.engine.checkpoint import (
    SIGNED_VERSION,
)
from zephon_server.engine.checkpoint_key import MAC_BYTES


def forge(data: bytes, edit) -> bytes:
    """What an attacker can do: edit the JSON payload and recompute the sha256; a signed
    checkpoint keeps its (now wrong) MAC."""
    version = struct.unpack_from("<H", data, 8)[0]
    start = 42 + (MAC_BYTES if version == SIGNED_VERSION else 0)
    doc = json.loads(data[start:])
    edit(doc)
    payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return data[:10] + hashlib.sha256(payload).digest() + data[42:start] + payload
