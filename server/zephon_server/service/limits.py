"""Size limits on every request field, checked before a request touches the engine.

Any caller that can reach the port could otherwise make the server store, log or iterate
whatever it sends: a 50 MiB checkpoint tag is a 50 MiB file in the state directory, a
million-entry ``positions`` list a second of CPU, a consumer name with a newline a forged log
line. Each field gets a bound far above legitimate use; a request over one is refused with
INVALID_ARGUMENT naming the field, the limit and the size found (:class:`InvalidRequest`).
Lanes and seqs need no extra bound: a lane must be one the server serves, and a seq outside
the reachable range gets OUT_OF_RANGE naming that range (the hub checks both).

The largest legitimate request is a ``Resume`` carrying checkpoint bytes, which grow with the
lanes and datasets (a few hundred bytes per lane, under a hundred per dataset per lane); the
server's ``grpc.max_receive_message_length`` is :attr:`RequestLimits.receive_max_bytes`, so
gRPC itself refuses anything larger (RESOURCE_EXHAUSTED) before it is read into memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_proto.v1 import data_service_pb2 as pb

from .errors import InvalidRequest

TAG_MAX_BYTES = 256
"""``CheckpointRequest.tag`` (stored in the checkpoint; 64 characters of it name the file)."""
CONSUMER_MAX_BYTES = 128
"""``OpenLane.consumer`` (logged and kept per open stream)."""
CHECKPOINT_ID_MAX_BYTES = 128
"""``ResumeRequest.checkpoint_id`` (ids are ``ckpt-<8 digits>[-<tag, 64 at most>]``)."""
RING_REASON_MAX_BYTES = 512
"""``RingReply.reason`` (logged)."""
STATE_BASE_BYTES = 1 << 20
STATE_LANE_BYTES = 1024
STATE_LANE_DATASET_BYTES = 256
"""A checkpoint may be ``STATE_BASE_BYTES + lanes * (STATE_LANE_BYTES + datasets *
STATE_LANE_DATASET_BYTES)``: several times what one takes (header, fingerprint components and
tag, then per lane its seqs, cursor, chain digest and work-source position per dataset)."""
RECEIVE_MIN_BYTES = 4 << 20
"""The gRPC receive limit is at least this, and above the largest checkpoint by a margin."""
RECEIVE_MARGIN_BYTES = 64 << 10


def _utf8_size(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class RequestLimits:
    """The limits for a server of ``num_lanes`` lanes (serving ``served``) and
    ``num_datasets`` datasets; the ``check_*`` methods raise :class:`InvalidRequest`."""

    num_lanes: int
    served: tuple[int, ...]
    num_datasets: int

    def __post_init__(self) -> None:
        for name in ("num_lanes", "num_datasets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"request limits: {name} must be an integer >= 1, got {value!r}")
        if not self.served or not set(self.served) <= set(range(self.num_lanes)):
            raise ValueError(
                f"request limits: served must be lanes in 0..{self.num_lanes - 1}, "
                f"got {self.served!r}"
            )

    @property
    def state_max_bytes(self) -> int:
        """Largest ``ResumeRequest.state`` accepted."""
        per_lane = STATE_LANE_BYTES + self.num_datasets * STATE_LANE_DATASET_BYTES
        return STATE_BASE_BYTES + self.num_lanes * per_lane

    @property
    def receive_max_bytes(self) -> int:
        """The server's ``grpc.max_receive_message_length``."""
        return max(RECEIVE_MIN_BYTES, self.state_max_bytes + RECEIVE_MARGIN_BYTES)

    # -- per request ------------------------------------------------------------------------

    def check_checkpoint(self, request: pb.CheckpointRequest) -> dict[int, int]:
        """The positions a CheckpointRequest asks for (lane -> next_seq), checked."""
        _check_text("CheckpointRequest.tag", request.tag, TAG_MAX_BYTES, "use a shorter tag")
        entries = request.positions
        if len(entries) > len(self.served):
            raise InvalidRequest(
                f"CheckpointRequest.positions has {len(entries)} entries; the limit is one per "
                f"lane this server serves ({len(self.served)}: lanes {list(self.served)})"
            )
        positions: dict[int, int] = {}
        for i, entry in enumerate(entries):
            field = f"CheckpointRequest.positions[{i}]"
            self._check_lane(f"{field}.lane", entry.lane)
            if entry.lane in positions:
                raise InvalidRequest(
                    f"{field}.lane is {entry.lane}, listed twice: give each lane at most once"
                )
            positions[entry.lane] = entry.next_seq
        return positions

    def check_resume(self, request: pb.ResumeRequest, kind: str) -> None:
        """A ResumeRequest whose oneof ``kind`` is set."""
        if kind == "checkpoint_id":
            size = _utf8_size(request.checkpoint_id)
            if size > CHECKPOINT_ID_MAX_BYTES:
                raise InvalidRequest(
                    f"ResumeRequest.checkpoint_id is {size} bytes; the limit is "
                    f"{CHECKPOINT_ID_MAX_BYTES} (ids look like ckpt-00000001 or "
                    "ckpt-00000001-<tag>; GetInfo lists them)"
                )
            return
        size = len(request.state)
        if size > self.state_max_bytes:
            raise InvalidRequest(
                f"ResumeRequest.state is {size} bytes; the limit is {self.state_max_bytes} "
                f"bytes for {self.num_lanes} lanes and {self.num_datasets} datasets (a "
                "checkpoint is a few hundred bytes per lane): send the bytes a Checkpoint "
                "call returned"
            )

    @staticmethod
    def check_info(request: pb.GetInfoRequest) -> None:
        """A GetInfo request: its consumer name, as an OpenLane's."""
        _check_text(
            "GetInfoRequest.consumer",
            request.consumer,
            CONSUMER_MAX_BYTES,
            "use a short name like rank3",
            printable=True,
        )

    @staticmethod
    def check_open(request: pb.OpenLane) -> None:
        """The first message of a StreamBatches call (its lane and start_seq are the hub's
        to check: it names the lanes served and the reachable range)."""
        _check_text(
            "OpenLane.consumer",
            request.consumer,
            CONSUMER_MAX_BYTES,
            "use a short name like rank3",
            printable=True,
        )

    @staticmethod
    def check_ring_reply(reply: pb.RingReply) -> None:
        """A RingReply on a StreamBatches call."""
        _check_text("RingReply.reason", reply.reason, RING_REASON_MAX_BYTES, "say it briefly")

    def _check_lane(self, field: str, lane: int) -> None:
        if lane not in self.served:
            raise InvalidRequest(
                f"{field}: lane {lane} is not served here; this server serves lanes "
                f"{list(self.served)} of {self.num_lanes}"
            )


def _check_text(field: str, value: str, limit: int, fix: str, *, printable: bool = False) -> None:
    size = _utf8_size(value)
    if size > limit:
        raise InvalidRequest(f"{field} is {size} bytes of UTF-8; the limit is {limit}: {fix}")
    if printable:
        for i, char in enumerate(value):
            if ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0:
                raise InvalidRequest(
                    f"{field} has a control character (U+{ord(char):04X}) at position {i}: {fix}"
                )
