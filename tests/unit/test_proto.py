"""The checked-in generated code matches ``proto/`` and the binding schema does not move."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN_SCRIPT = ROOT / "tools" / "gen_proto.py"


def pinned_grpcio_tools() -> str:
    match = re.search(r'"grpcio-tools==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject.toml must pin grpcio-tools==X in the dev extra"
    return match.group(1)


def test_generator_uses_the_pinned_grpcio_tools():
    pinned = pinned_grpcio_tools()
    text = GEN_SCRIPT.read_text()
    assert f'PINNED_GRPCIO_TOOLS = "{pinned}"' in text, "tools/gen_proto.py and pyproject disagree"
    installed = importlib.metadata.version("grpcio-tools")
    assert installed == pinned, (
        f"grpcio-tools {installed} is installed but the project pins {pinned}: "
        "run `make install` (generated code depends on the protoc version)"
    )


def test_service_methods():
    from zephon_proto.v1 import data_service_pb2 as pb
    from zephon_proto.v1 import data_service_pb2_grpc as pb_grpc

    service = pb.DESCRIPTOR.services_by_name["DataService"]
    assert service.full_name == "zephon.v1.DataService"
    methods = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming)
        for m in service.methods
    }
    assert methods == {
        "GetInfo": ("GetInfoRequest", "GetInfoResponse", False, False),
        "StreamBatches": ("StreamBatchesRequest", "StreamBatchesResponse", True, True),
        "Checkpoint": ("CheckpointRequest", "CheckpointResponse", False, False),
        "Resume": ("ResumeRequest", "ResumeResponse", False, False),
    }
    for name in methods:
        assert hasattr(pb_grpc.DataServiceServicer, name)


def test_dtype_enum_values():
    from zephon_proto.v1 import data_service_pb2 as pb

    assert dict(pb.DType.items()) == {
        "DTYPE_UNSPECIFIED": 0,
        "DTYPE_INT32": 1,
        "DTYPE_INT64": 2,
        "DTYPE_UINT16": 3,
        "DTYPE_UINT32": 4,
        "DTYPE_FLOAT32": 5,
        "DTYPE_BOOL": 6,
        "DTYPE_UINT8": 7,
    }


# Binding field names and numbers: fields may be added, never renamed or renumbered.
BINDING_FIELDS = {
    "Tensor": {"name": 1, "dtype": 2, "shape": 3, "data": 4, "ring_offset": 5},
    "LanePosition": {"lane": 1, "next_seq": 2},
    "GetInfoRequest": {"consumer": 1},
    "GetInfoResponse": {
        "num_lanes": 1,
        "fingerprint": 2,
        "plan": 3,
        "acknowledged": 4,
        "checkpoint_ids": 5,
        "version": 6,
        "served_lanes": 7,
        "tensor_names": 8,
        "tokenizer": 9,
        "flush_every_k_chunks": 10,
    },
    "StreamBatchesRequest": {"open": 1, "ack": 2, "ring": 3},
    "OpenLane": {
        "lane": 1,
        "start_seq": 2,
        "consumer": 3,
        "max_batches_per_message": 4,
        "shared_memory": 5,
    },
    "Ack": {"next_seq": 1},
    "StreamBatchesResponse": {"batch": 1, "end": 2, "batches": 3, "ring": 4},
    "RingOffer": {"path": 1, "size": 2, "nonce": 3},
    "RingReply": {"accepted": 1, "reason": 2},
    "BatchGroup": {"batches": 1},
    "SampleBatch": {
        "lane": 1,
        "seq": 2,
        "tensors": 3,
        "rows": 4,
        "digest": 5,
        "chain_digest": 6,
        "closed": 7,
    },
    "RowSource": {"segments": 1},
    "Segment": {"dataset": 1, "shard": 2, "row": 3, "epoch": 4, "start": 5, "length": 6},
    "ClosedDocument": {"dataset": 1, "shard": 2, "row": 3, "epoch": 4, "tombstone": 5},
    "EndOfStream": {"next_seq": 1, "chain_digest": 2},
    "CheckpointRequest": {"positions": 1, "tag": 2},
    "CheckpointResponse": {"checkpoint_id": 1, "state": 2, "positions": 3},
    "ResumeRequest": {"checkpoint_id": 1, "state": 2},
    "ResumeResponse": {"positions": 1, "fingerprint": 2},
}


@pytest.mark.parametrize("message", sorted(BINDING_FIELDS))
def test_binding_field_numbers(message):
    from zephon_proto.v1 import data_service_pb2 as pb

    desc = pb.DESCRIPTOR.message_types_by_name[message]
    fields = {f.name: f.number for f in desc.fields}
    for name, number in BINDING_FIELDS[message].items():
        assert fields.get(name) == number, f"{message}.{name} must keep field number {number}"


def test_oneofs():
    from zephon_proto.v1 import data_service_pb2 as pb

    def oneof(message: str, name: str) -> set[str]:
        desc = pb.DESCRIPTOR.message_types_by_name[message]
        return {f.name for f in desc.oneofs_by_name[name].fields}

    assert oneof("StreamBatchesRequest", "kind") == {"open", "ack", "ring"}
    assert oneof("StreamBatchesResponse", "kind") == {"batch", "end", "batches", "ring"}
    assert oneof("ResumeRequest", "source") == {"checkpoint_id", "state"}
    assert pb.DESCRIPTOR.package == "zephon.v1"


def unencoded_fields(file_descriptor) -> list[str]:
    """Fields of the messages the hand encoder writes that its field table does not cover
    (or covers with another number or wire type), and messages it reaches without a table."""
    from google.protobuf.descriptor import FieldDescriptor as F

    from zephon_server.service import encoding

    problems = []
    for message, fields in encoding.FIELDS.items():
        desc = file_descriptor.message_types_by_name[message]
        declared = {f.name: f for f in desc.fields}
        written = set(fields) | set(encoding.BUILT_WITH_PROTOBUF.get(message, ()))
        problems += [f"{message}.{name}" for name in sorted(set(declared) - written)]
        for name, (number, wire_type) in fields.items():
            f = declared.get(name)
            length = f is not None and (
                f.type in (F.TYPE_MESSAGE, F.TYPE_BYTES, F.TYPE_STRING) or f.is_repeated
            )
            if f is None or f.number != number or wire_type != (encoding.LEN if length else 0):
                problems.append(f"{message}.{name} (number or wire type)")
        for f in desc.fields:
            nested = f.message_type
            if f.name in fields and nested is not None and nested.name not in encoding.FIELDS:
                problems.append(f"{f.message_type.name} (message without a field table)")
    return problems


def test_the_hand_encoder_writes_every_field_of_its_messages():
    """service/encoding.py writes batches by hand: a field added to one of its messages in the
    .proto must fail here instead of being dropped from every message silently."""
    from zephon_proto.v1 import data_service_pb2 as pb

    assert unencoded_fields(pb.DESCRIPTOR) == []


def test_a_field_added_to_the_proto_is_caught():
    from google.protobuf import descriptor_pb2, descriptor_pool

    from zephon_proto.v1 import data_service_pb2 as pb

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    proto.name = "zephon_test/grown.proto"
    proto.package = "zephon.grown"
    del proto.service[:]  # messages only
    for message in proto.message_type:
        for field in message.field:  # point the copied type names at the copied package
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(".zephon.v1.", ".zephon.grown.")
        if message.name == "SampleBatch":
            message.field.add(name="weights", number=8, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
        if message.name == "Tensor":
            message.field.add(name="stride", number=6, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    grown = descriptor_pool.DescriptorPool().Add(proto)
    assert unencoded_fields(grown) == ["SampleBatch.weights", "Tensor.stride"]
