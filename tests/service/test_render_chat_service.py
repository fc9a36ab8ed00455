"""A chat pipeline served over gRPC: the trainer receives ``loss_mask`` with every batch, and
the stream equals what ``zephon dump`` prints for the same config."""

from __future__ import annotations

import ast
import io
import re
from itertools import pairwise

import numpy as np
import pytest
import yaml

from tests.support.chat_helpers import chat_tokenizer
from zephon_client import DataClient
from zephon_client.tail import tail
from zephon_proto.v1 import data_service_pb2 as pb
from zephon_server.engine.chat_corpus import write_chat_corpus
from zephon_testing.servers import dump_digests, server

pytestmark = [pytest.mark.service, pytest.mark.timeout(300)]

RUN = re.compile(r"""(train:)?('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")  # tail's runs


def test_chat_pipeline_streams_loss_mask_like_dump(tmp_path):
    write_chat_corpus(tmp_path / "chat", conversations=120, shards=2, seed=8)
    tokenizer = chat_tokenizer(tmp_path / "tok")
    config = tmp_path / "chat.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "lanes": 2,
                "chunk_size": 8,
                "datasets": [{"name": "chat", "path": "chat", "weight": 1.0}],
                "pipeline": [
                    {"render_chat": {"tokenizer": tokenizer, "max_length": 512}},
                    {"pack_flat": {"max_length": 256}},
                    {"shuffle": {"buffer_size": 8}},
                    {"batch": {"microbatch_size": 2}},
                ],
                "execution": {"runner": "threads", "workers": 2},
            }
        )
    )
    expected = dump_digests(config, 1000)
    got: dict[int, list[str]] = {}
    with server(["--config", str(config)], tmp_path) as srv:
        info = srv.stub().GetInfo(pb.GetInfoRequest())
        assert info.tokenizer == tokenizer and "loss_mask" in info.tensor_names
        with DataClient(srv.address) as client:
            for batch in client:
                got.setdefault(batch.lane, []).append(batch.chain_digest.hex())
                mask = batch.tensors["loss_mask"]
                pad = batch.tensors["padding_mask"]
                assert mask.dtype == np.uint8 and mask.shape == batch.tensors["input_ids"].shape
                assert 0 < int(mask.sum()) < int(pad.sum()) and not np.any(mask[~pad])
        # zephon tail shows what trains, decoded by the pipeline's own tokenizer: every
        # trained run of a ChatML conversation is an answer ending in its end of turn.
        out = io.StringIO()
        assert tail(srv.address, 0, 1, out=out) == 1
    assert got == expected and all(len(v) >= 3 for v in got.values())
    runs = [RUN.findall(line) for line in out.getvalue().splitlines() if line.startswith("    doc")]
    assert len(runs) >= 2 and all(runs)
    for line in runs:  # pack_flat cuts documents: a row may start or end inside one
        for (mark, text), _ in pairwise(line):  # a trained run is closed by its end of turn
            assert not mark or ast.literal_eval(text).endswith("<|im_end|>")
        assert not any(mark and "<|im_start|>" in text for mark, text in line)
    headers = [ast.literal_eval(t) for line in runs for (m, t), (n, _) in pairwise(line) if n]
    assert headers and all(h.endswith("<|im_start|>assistant\n") for h in headers)
