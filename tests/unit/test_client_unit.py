"""DataClient unit tests against a fake DataService served by a real ``grpc.server``: the hermetic
tests.

The tests of the same topic that need a subprocess, worker processes, a socket or the wall clock are
in ``tests/service/test_client_unit.py``.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from zephon_client.batch_text import Detokenizer, byte_decode, print_batch
from zephon_client.options import consumer_name
from zephon_client.stream import (
    CORE_INTERNAL_DETAILS,
    _Item,
    _retryable,
)
from zephon_client.wire import DecodedBatch

pytestmark = pytest.mark.timeout(20)


class _Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "received", "retry"),
    [
        (grpc.StatusCode.UNAVAILABLE, "Connection reset by peer", 0, True),
        # grpc.aio's status when the client core failed to write on a broken connection
        (grpc.StatusCode.INTERNAL, CORE_INTERNAL_DETAILS, 0, True),
        # the server's own INTERNAL before any batch is final: reopening would fail again
        (grpc.StatusCode.INTERNAL, "pipeline failed: worker 1 died", 0, False),
        (grpc.StatusCode.INTERNAL, "RST_STREAM with error code 2", 3, True),
        (grpc.StatusCode.CANCELLED, "Cancelled", 0, False),
        (grpc.StatusCode.OUT_OF_RANGE, "seq 0 is no longer reachable", 5, False),
    ],
)
def test_which_failed_calls_are_reopened(code, details, received, retry):
    item = _Item("error", error=_Status(code, details))
    assert _retryable(item, SimpleNamespace(received=received)) is retry


def test_byte_decode_marks_special_ids():
    assert byte_decode([104, 105, 256, 0xC3, 0xA9, 257]) == "hi<256>é<257>"


def _chat_batch(**extra: np.ndarray) -> DecodedBatch:
    """Two packed rows of byte tokens: row 0 holds two documents and padding, row 1 one."""
    texts = [("Q:hi|", "A:yo|"), ("Q:x|", "A:zz|")]
    ids = np.zeros((3, 24), dtype=np.int32)
    mask = np.zeros((3, 24), dtype=np.uint8)
    segments = np.zeros((3, 24), dtype=np.int32)
    layout = [[texts[0], texts[1]], [texts[1]], []]
    for row, docs in enumerate(layout):
        at = 0
        for number, (prompt, answer) in enumerate(docs, 1):
            for text, trained in ((prompt, 0), (answer, 1)):
                ids[row, at : at + len(text)] = list(text.encode())
                mask[row, at : at + len(text)] = trained
                segments[row, at : at + len(text)] = number
                at += len(text)
    tensors = {"input_ids": ids, "loss_mask": mask, "segment_ids": segments, **extra}
    return DecodedBatch(0, 7, tensors)


def test_tail_marks_what_trains_document_by_document():
    out = io.StringIO()
    print_batch(_chat_batch(), out, detokenize=lambda ids: repr(byte_decode(ids)))
    lines = out.getvalue().splitlines()
    assert lines[1:] == [
        "  row 0: 2 documents, 19 tokens, 10 trained",
        "    doc 0: 'Q:hi|' train:'A:yo|'",
        "    doc 1: 'Q:x|' train:'A:zz|'",
        "  row 1: 1 document, 9 tokens, 5 trained",
        "    doc 0: 'Q:x|' train:'A:zz|'",
        "  row 2: 0 documents, 0 tokens, 0 trained",
    ]
    # cu_seqlens says where documents end when the batch has it
    cu = np.array([[0, 10, 19, 19], [0, 9, 9, 9], [0, 0, 0, 0]], dtype=np.int32)
    docs = np.array([2, 1, 0], dtype=np.int32)
    out = io.StringIO()
    print_batch(_chat_batch(cu_seqlens=cu, num_docs=docs), out, detokenize=repr)
    assert "    doc 1: [81, 58, 120, 124] train:[65, 58, 122, 122, 124]" in out.getvalue()


def test_runs_decode_as_one_text_keeping_a_leading_space_and_split_characters():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "\u2581say": 1, "\u2581hi": 2, "\u2581with": 3, "\u2581a": 4}
    sentencepiece = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    sentencepiece.pre_tokenizer = pre_tokenizers.Metaspace()
    sentencepiece.decoder = decoders.Metaspace()  # drops the space a text starts with
    show = Detokenizer(sentencepiece.decode)
    assert show([3, 4]) == "'with a'"  # decoded alone, the run loses its space
    assert show.pieces([1, 2, 3, 4], [0, 2, 4]) == ["'say hi'", "' with a'"]
    # a character whose two bytes two runs share shows whole where it is completed
    show = Detokenizer(byte_decode)
    ids = list("caf\u00e9s".encode())
    assert show.pieces(ids, [0, 4, 6]) == ["'caf'", "'\u00e9s'"]
    assert Detokenizer(None).pieces([5, 6, 7], [0, 1, 3]) == ["[5]", "[6, 7]"]


def test_torch_module_imports_without_torch():
    import importlib

    module = importlib.import_module("zephon_client.torch")
    assert callable(module.to_torch)


@pytest.mark.parametrize(
    ("name", "says"),
    [("r" * 129, "129 bytes of UTF-8; the limit is 128"), ("rank\n0", "control character")],
)
def test_a_consumer_name_the_server_would_refuse_fails_at_construction(name, says):
    from zephon_client import DataClient

    # Checked before any connection: the address is never dialled.
    with pytest.raises(ValueError, match=says):
        DataClient("127.0.0.1:1", consumer=name)
    assert consumer_name("rank3") == "rank3" and consumer_name("é" * 64) == "é" * 64
