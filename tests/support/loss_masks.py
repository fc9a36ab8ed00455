"""Loss-mask functions for ``map_transform`` in tests and doc examples (importable by name).

``completion_mask`` trains the last two thirds of every document (a prompt/completion shape);
``every_third_mask`` trains tokens whose id is a multiple of 3 (data-dependent, sometimes
nothing at all).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def completion_mask(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with ``loss_mask`` 0 on the first third of the tokens, 1 after."""
    n = len(payload["input_ids"])
    mask = np.zeros(n, dtype=np.uint8)
    mask[n // 3 :] = 1
    return {**payload, "loss_mask": mask}


def every_third_mask(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload with ``loss_mask`` 1 where the token id is a multiple of 3."""
    ids = np.asarray(payload["input_ids"])
    return {**payload, "loss_mask": (ids % 3 == 0).astype(np.uint8)}


def sometimes_empty_mask(payload: dict[str, Any]) -> dict[str, Any]:
    """Like :func:`completion_mask`, but nothing trained when the first token id is even."""
    out = completion_mask(payload)
    ids = payload["input_ids"]
    if len(ids) and int(ids[0]) % 2 == 0:
        out["loss_mask"][:] = 0
    return out
