"""The portable resume state of a :class:`~zephon_client.DataClient`: its ``state_dict``
format (every lane's position and chain digest), validation, and merging several ranks'."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .wire import CHAIN_SEED

STATE_VERSION = 1
"""Version of the :meth:`DataClient.state_dict` format."""


def merge_state_dicts(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The union of several ranks' :meth:`DataClient.state_dict` results.

    Use it to resume with a different number of ranks: save every old rank's state_dict,
    merge them, and load the merged dict into every new rank (each picks its own lanes).
    All must share the version and fingerprint; a lane present in several with different
    positions or chains raises :class:`ValueError` (tensor/pipeline-parallel peers that read
    the same lanes agree).
    """
    merged: dict[str, Any] = {"version": STATE_VERSION, "fingerprint": None}
    positions: dict[int, int] = {}
    chains: dict[int, str] = {}
    count = 0
    for state in states:
        count += 1
        _version, fingerprint, pos, ch = parse_state(state)
        if merged["fingerprint"] is None:
            merged["fingerprint"] = fingerprint
        elif fingerprint is not None and fingerprint != merged["fingerprint"]:
            raise ValueError(
                f"state_dicts of different pipelines: fingerprint {merged['fingerprint']} "
                f"and {fingerprint}"
            )
        for lane, next_seq in pos.items():
            if positions.setdefault(lane, next_seq) != next_seq:
                raise ValueError(
                    f"lane {lane}: state_dicts disagree on its position "
                    f"({positions[lane]} vs {next_seq})"
                )
        for lane, chain in ch.items():
            if chains.setdefault(lane, chain.hex()) != chain.hex():
                raise ValueError(f"lane {lane}: state_dicts disagree on its chain digest")
    if not count:
        raise ValueError("merge_state_dicts needs at least one state_dict")
    merged["positions"] = dict(sorted(positions.items()))
    merged["chains"] = dict(sorted(chains.items()))
    return merged


def parse_state(
    state: Mapping[str, Any],
) -> tuple[int, str | None, dict[int, int], dict[int, bytes]]:
    """Validate a state_dict; lane keys may be strings (after a JSON round trip)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"a state_dict is a mapping, got {type(state).__name__}")
    version = state.get("version")
    if version != STATE_VERSION:
        raise ValueError(
            f"unsupported state_dict version {version!r} (this client reads {STATE_VERSION})"
        )
    fingerprint = state.get("fingerprint")
    try:
        positions = {int(k): int(v) for k, v in dict(state.get("positions") or {}).items()}
        chains = {int(k): bytes.fromhex(v) for k, v in dict(state.get("chains") or {}).items()}
    except (TypeError, ValueError) as error:
        raise ValueError(f"malformed state_dict: {error}") from None
    for lane, chain in chains.items():
        if len(chain) != len(CHAIN_SEED):
            raise ValueError(f"malformed state_dict: lane {lane} chain is not 32 bytes")
    return int(version), fingerprint, positions, chains
