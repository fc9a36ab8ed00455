from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_UINT16: _ClassVar[DType]
    DTYPE_UINT32: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
DTYPE_UNSPECIFIED: DType
DTYPE_INT32: DType
DTYPE_INT64: DType
DTYPE_UINT16: DType
DTYPE_UINT32: DType
DTYPE_FLOAT32: DType
DTYPE_BOOL: DType
DTYPE_UINT8: DType

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data", "ring_offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RING_OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    ring_offset: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., ring_offset: _Optional[int] = ...) -> None: ...

class LanePosition(_message.Message):
    __slots__ = ("lane", "next_seq")
    LANE_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    lane: int
    next_seq: int
    def __init__(self, lane: _Optional[int] = ..., next_seq: _Optional[int] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ("consumer",)
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    def __init__(self, consumer: _Optional[str] = ...) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("num_lanes", "fingerprint", "plan", "acknowledged", "checkpoint_ids", "version", "served_lanes", "tensor_names", "tokenizer", "flush_every_k_chunks", "end_of_data", "common_end_seq")
    NUM_LANES_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_IDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVED_LANES_FIELD_NUMBER: _ClassVar[int]
    TENSOR_NAMES_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    FLUSH_EVERY_K_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    COMMON_END_SEQ_FIELD_NUMBER: _ClassVar[int]
    num_lanes: int
    fingerprint: str
    plan: str
    acknowledged: _containers.RepeatedCompositeFieldContainer[LanePosition]
    checkpoint_ids: _containers.RepeatedScalarFieldContainer[str]
    version: str
    served_lanes: _containers.RepeatedScalarFieldContainer[int]
    tensor_names: _containers.RepeatedScalarFieldContainer[str]
    tokenizer: str
    flush_every_k_chunks: int
    end_of_data: str
    common_end_seq: int
    def __init__(self, num_lanes: _Optional[int] = ..., fingerprint: _Optional[str] = ..., plan: _Optional[str] = ..., acknowledged: _Optional[_Iterable[_Union[LanePosition, _Mapping]]] = ..., checkpoint_ids: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., served_lanes: _Optional[_Iterable[int]] = ..., tensor_names: _Optional[_Iterable[str]] = ..., tokenizer: _Optional[str] = ..., flush_every_k_chunks: _Optional[int] = ..., end_of_data: _Optional[str] = ..., common_end_seq: _Optional[int] = ...) -> None: ...

class StreamBatchesRequest(_message.Message):
    __slots__ = ("open", "ack", "ring")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    open: OpenLane
    ack: Ack
    ring: RingReply
    def __init__(self, open: _Optional[_Union[OpenLane, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., ring: _Optional[_Union[RingReply, _Mapping]] = ...) -> None: ...

class OpenLane(_message.Message):
    __slots__ = ("lane", "start_seq", "consumer", "max_batches_per_message", "shared_memory")
    LANE_FIELD_NUMBER: _ClassVar[int]
    START_SEQ_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHES_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    lane: int
    start_seq: int
    consumer: str
    max_batches_per_message: int
    shared_memory: bool
    def __init__(self, lane: _Optional[int] = ..., start_seq: _Optional[int] = ..., consumer: _Optional[str] = ..., max_batches_per_message: _Optional[int] = ..., shared_memory: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("next_seq",)
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    next_seq: int
    def __init__(self, next_seq: _Optional[int] = ...) -> None: ...

class StreamBatchesResponse(_message.Message):
    __slots__ = ("batch", "end", "batches", "ring")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RING_FIELD_NUMBER: _ClassVar[int]
    batch: SampleBatch
    end: EndOfStream
    batches: BatchGroup
    ring: RingOffer
    def __init__(self, batch: _Optional[_Union[SampleBatch, _Mapping]] = ..., end: _Optional[_Union[EndOfStream, _Mapping]] = ..., batches: _Optional[_Union[BatchGroup, _Mapping]] = ..., ring: _Optional[_Union[RingOffer, _Mapping]] = ...) -> None: ...

class RingOffer(_message.Message):
    __slots__ = ("path", "size", "nonce")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    nonce: bytes
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class RingReply(_message.Message):
    __slots__ = ("accepted", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class BatchGroup(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[SampleBatch]
    def __init__(self, batches: _Optional[_Iterable[_Union[SampleBatch, _Mapping]]] = ...) -> None: ...

class SampleBatch(_message.Message):
    __slots__ = ("lane", "seq", "tensors", "rows", "digest", "chain_digest", "closed")
    LANE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHAIN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    lane: int
    seq: int
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    rows: _containers.RepeatedCompositeFieldContainer[RowSource]
    digest: bytes
    chain_digest: bytes
    closed: _containers.RepeatedCompositeFieldContainer[ClosedDocument]
    def __init__(self, lane: _Optional[int] = ..., seq: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[RowSource, _Mapping]]] = ..., digest: _Optional[bytes] = ..., chain_digest: _Optional[bytes] = ..., closed: _Optional[_Iterable[_Union[ClosedDocument, _Mapping]]] = ...) -> None: ...

class RowSource(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    def __init__(self, segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("dataset", "shard", "row", "epoch", "start", "length")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    dataset: int
    shard: int
    row: int
    epoch: int
    start: int
    length: int
    def __init__(self, dataset: _Optional[int] = ..., shard: _Optional[int] = ..., row: _Optional[int] = ..., epoch: _Optional[int] = ..., start: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class ClosedDocument(_message.Message):
    __slots__ = ("dataset", "shard", "row", "epoch", "tombstone")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONE_FIELD_NUMBER: _ClassVar[int]
    dataset: int
    shard: int
    row: int
    epoch: int
    tombstone: str
    def __init__(self, dataset: _Optional[int] = ..., shard: _Optional[int] = ..., row: _Optional[int] = ..., epoch: _Optional[int] = ..., tombstone: _Optional[str] = ...) -> None: ...

class EndOfStream(_message.Message):
    __slots__ = ("next_seq", "chain_digest", "closed")
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    CHAIN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    next_seq: int
    chain_digest: bytes
    closed: _containers.RepeatedCompositeFieldContainer[ClosedDocument]
    def __init__(self, next_seq: _Optional[int] = ..., chain_digest: _Optional[bytes] = ..., closed: _Optional[_Iterable[_Union[ClosedDocument, _Mapping]]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("positions", "tag")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[LanePosition]
    tag: str
    def __init__(self, positions: _Optional[_Iterable[_Union[LanePosition, _Mapping]]] = ..., tag: _Optional[str] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("checkpoint_id", "state", "positions")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    state: bytes
    positions: _containers.RepeatedCompositeFieldContainer[LanePosition]
    def __init__(self, checkpoint_id: _Optional[str] = ..., state: _Optional[bytes] = ..., positions: _Optional[_Iterable[_Union[LanePosition, _Mapping]]] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("checkpoint_id", "state")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: str
    state: bytes
    def __init__(self, checkpoint_id: _Optional[str] = ..., state: _Optional[bytes] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("positions", "fingerprint")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[LanePosition]
    fingerprint: str
    def __init__(self, positions: _Optional[_Iterable[_Union[LanePosition, _Mapping]]] = ..., fingerprint: _Optional[str] = ...) -> None: ...
