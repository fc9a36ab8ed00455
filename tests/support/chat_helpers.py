"""Chat test data: templates in three real formats and a tokenizer trained on the spot.

``CHATML`` is the ChatML template as chat models publish it (``<|im_start|>role\\n content
<|im_end|>\\n``). ``HEADERS`` follows the Llama 3 layout (BOS, header tokens, trimmed
content, ``<|eot_id|>``), ``INST`` the Mistral instruct layout (``[INST] ... [/INST]``, answers
closed by EOS, ``raise_exception`` when roles do not alternate). :func:`chat_tokenizer`
trains a small byte-level BPE on the sample corpus with the special tokens of all three and
writes ``tokenizer.json`` and ``tokenizer_config.json`` (with the template) into a directory.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from zephon_server.engine.chat_template import ChatTemplate

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

HEADERS = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

INST = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<s>",
    "</s>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

CONFIGS: dict[str, dict[str, Any]] = {
    "chatml": {"chat_template": CHATML, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "headers": {
        "chat_template": HEADERS,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
    },
    "inst": {
        "chat_template": INST,
        "bos_token": {"content": "<s>", "special": True},  # the AddedToken form
        "eos_token": "</s>",
    },
}

_TOKENIZER_CACHE: dict[str, str] = {}


def trained_tokenizer_json() -> str:
    """tokenizer.json text of a byte-level BPE (vocab 1024) trained on the sample corpus."""
    if "json" not in _TOKENIZER_CACHE:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        from zephon_server.engine.chat_corpus import chat_texts, generate_conversations

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=1024,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(chat_texts(generate_conversations(400, seed=5)), trainer=trainer)
        _TOKENIZER_CACHE["json"] = tok.to_str()
    return _TOKENIZER_CACHE["json"]


def chat_tokenizer(directory: Path, fmt: str = "chatml", **config: Any) -> str:
    """Write tokenizer.json + tokenizer_config.json (``CONFIGS[fmt]`` updated by ``config``)
    into ``directory``; returns the tokenizer.json path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(trained_tokenizer_json())
    settings = {**CONFIGS[fmt], **config}
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return str(directory / "tokenizer.json")


def render_rows(op: Any, rows: list[Any]) -> list[Any]:
    """``op.process_many`` over ``rows`` (objects, or JSONL lines as bytes) read as records
    of one shard."""
    from zephon_server.engine.records import DocRef, SampleMeta, SampleRecord

    recs = []
    for i, row in enumerate(rows):
        doc = DocRef(0, 0, i)
        raw = row if isinstance(row, bytes) else json.dumps(row).encode()
        recs.append(SampleRecord({"raw": raw}, SampleMeta(0, (0, i), 0, doc, (doc,))))
    return list(op.process_many(recs))


def decode(op: Any, ids: Any) -> str:
    """Text of ``ids`` with special tokens kept (byte tokenizer: its bytes)."""
    tok = op.tokenizer
    if hasattr(tok, "_tok"):
        return str(tok._tok.decode([int(i) for i in ids], skip_special_tokens=False))
    return bytes(int(i) for i in ids).decode("utf-8")


def trained_runs(op: Any, ids: Any, mask: Any) -> list[str]:
    """The text of every maximal run of trained tokens, in order."""
    runs: list[list[int]] = []
    previous = 0
    for token, bit in zip(ids.tolist(), mask.tolist()):
        if bit and not previous:
            runs.append([])
        if bit:
            runs[-1].append(token)
        previous = bit
    return [decode(op, run) for run in runs]


def rows_and_tombstones(run: Any, check: Any = None) -> tuple[set[int], Counter]:
    """Iterate ``run`` to its end: the rows its batches carry, and ``(row, reason)`` counts of
    every tombstone (in batches and in the lanes' tails). ``check(batch)`` sees each batch."""
    from zephon_server.engine.numbered_batch import NumberedBatch

    rows: set[int] = set()
    tombstones: Counter = Counter()
    for item in run:
        if isinstance(item, NumberedBatch):
            rows.update(m.doc.row for m in item.rows)
            tombstones.update((m.doc.row, m.tombstone) for m in item.tombstones)
            if check is not None:
                check(item)
    for log in run.logs.values():
        tombstones.update((m.doc.row, m.tombstone) for m in log.tail_tombstones)
    return rows, tombstones


class Counting(ChatTemplate):
    """A chat template that counts its renderings."""

    renders = 0

    def render(self, messages: Any, **options: Any) -> str:
        self.renders += 1
        return super().render(messages, **options)
