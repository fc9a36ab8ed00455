"""The servers a :class:`~zephon_client.client.DataClient` reads from: the addresses it is
given, the check that they serve one pipeline, and which of them serves each lane."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from .channel import Endpoint
from .errors import ZephonClientError


def server_addresses(address: str | Sequence[str]) -> list[str]:
    """The server addresses given, one or several, none twice (ValueError otherwise)."""
    addresses = [address] if isinstance(address, str) else list(address)
    if not addresses:
        raise ValueError("DataClient needs at least one server address")
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"duplicate server addresses in {addresses}")
    return addresses


def check_same_pipeline(endpoints: Sequence[Endpoint]) -> None:
    """Raise ``FAILED_PRECONDITION`` unless every server has the same fingerprint and lane
    count (from the ``GetInfo`` each endpoint holds)."""
    first = endpoints[0]
    for other in endpoints[1:]:
        if other.info.fingerprint != first.info.fingerprint:
            raise ZephonClientError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "servers serve different pipelines: "
                + ", ".join(f"{e.address} has fingerprint {e.info.fingerprint}" for e in endpoints),
            )
        if other.info.num_lanes != first.info.num_lanes:
            raise ZephonClientError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "servers disagree on the lane count: "
                + ", ".join(f"{e.address} has {e.info.num_lanes}" for e in endpoints),
            )


def route(endpoints: Sequence[Endpoint], lane: int, rank: int) -> Endpoint:
    """The first of ``endpoints`` that serves ``lane`` (an error naming what each serves)."""
    for endpoint in endpoints:
        if endpoint.serves(lane):
            return endpoint
    served = "; ".join(f"{e.address} serves {list(e.info.served_lanes)}" for e in endpoints)
    raise ZephonClientError(
        None, f"lane {lane} of rank {rank} is served by none of the servers ({served})"
    )
