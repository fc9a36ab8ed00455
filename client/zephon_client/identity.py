"""Which pipeline a client streams: checked on every (re)connection to a server.

A :class:`~zephon_client.DataClient` learns the pipeline's fingerprint and lane count from
its servers' ``GetInfo`` when it is constructed. A server restarted on the same address may
serve another pipeline (another seed, corpus or lane count): its lanes still have seqs 0, 1,
2 ..., so without a check the client would go on yielding batches of another stream. Every
``StreamBatches`` call the client opens (the first and each reconnection) therefore asks the
server's ``GetInfo`` first, on the same channel, and stops with
:class:`~zephon_client.errors.PipelineMismatch` when the answer differs. This costs one small
unary call per opened stream and is independent of ``verify`` (which checks every batch's
digests and costs CPU per byte).
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_proto.v1 import data_service_pb2 as pb

from .errors import PipelineMismatch


@dataclass(frozen=True)
class PipelineIdentity:
    """A pipeline as a client knows it: its ``fingerprint`` (hex) and lane count."""

    fingerprint: str
    num_lanes: int

    def __post_init__(self) -> None:
        if not isinstance(self.fingerprint, str):
            raise ValueError(f"fingerprint must be a string, got {self.fingerprint!r}")
        if isinstance(self.num_lanes, bool) or not isinstance(self.num_lanes, int):
            raise ValueError(f"num_lanes must be an integer, got {self.num_lanes!r}")
        if self.num_lanes < 1:
            raise ValueError(f"num_lanes must be at least 1, got {self.num_lanes}")

    @classmethod
    def of(cls, info: pb.GetInfoResponse) -> PipelineIdentity:
        """The identity a ``GetInfo`` answer reports."""
        return cls(info.fingerprint, int(info.num_lanes))

    def check(self, info: pb.GetInfoResponse, *, address: str, lane: int | None = None) -> None:
        """Raise :class:`~zephon_client.errors.PipelineMismatch` unless ``info`` (the ``GetInfo``
        answer of the server at ``address``) reports this pipeline."""
        if info.fingerprint == self.fingerprint and int(info.num_lanes) == self.num_lanes:
            return
        raise PipelineMismatch(
            address=address,
            expected_fingerprint=self.fingerprint,
            found_fingerprint=info.fingerprint,
            expected_lanes=self.num_lanes,
            found_lanes=int(info.num_lanes),
            lane=lane,
        )
