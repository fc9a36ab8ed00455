"""A deterministic chat corpus: conversations as JSONL for tests and the benchmark.

:func:`generate_conversations` builds OpenAI-style records ``{"messages": [{role, content},
...]}`` from the sample corpus's English-like sentences: an optional system prompt, then one
to four user/assistant exchanges of varied lengths. :func:`write_chat_corpus` writes them as
JSONL shards; the same seed always gives byte-identical files. :func:`chat_texts` gives the
same conversations as plain texts (their contents joined), the "same texts tokenized alone"
a chat pipeline's throughput is compared with. :func:`write_chatml_template` writes the ChatML
template for tokenizers without one (the benchmark's BPE, the byte tokenizer).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .corpus import generate_texts, write_jsonl

#: The ChatML chat template (``<|im_start|>ROLE``, newline, content, ``<|im_end|>``, newline,
#: per message), for a tokenizer without a template of its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "Answer briefly and precisely.",
    "You are a careful writer; explain your reasoning.",
)


def generate_conversations(
    n: int,
    *,
    seed: int = 0,
    mean_words: int = 40,
    reasoning_words: int = 0,
    tool_calls: bool = False,
) -> list[dict[str, Any]]:
    """``n`` deterministic conversations (records with a ``messages`` list); with
    ``reasoning_words``, every assistant turn has a ``reasoning_content`` of about that many
    words; with ``tool_calls``, every other exchange first calls a tool (an assistant turn with
    an empty, null or worded content and a ``tool_calls`` list, then the ``tool`` turn that
    answers it). The questions and answers are the same either way."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 4000])))
    turns = rng.integers(1, 5, size=n)
    systems = rng.integers(-1, len(SYSTEM_PROMPTS), size=n)  # -1: no system prompt
    total = int(turns.sum())
    questions = generate_texts(total, seed=seed, mean_words=max(3, mean_words // 3), tag=41)
    answers = generate_texts(total, seed=seed, mean_words=mean_words, tag=42)
    reasoning = (
        generate_texts(total, seed=seed, mean_words=reasoning_words, tag=43)
        if reasoning_words
        else None
    )
    results = (
        generate_texts(total, seed=seed, mean_words=max(3, mean_words // 2), tag=44)
        if tool_calls
        else None
    )
    out = []
    k = 0
    for i in range(n):
        messages: list[dict[str, Any]] = []
        if systems[i] >= 0:
            messages.append({"role": "system", "content": SYSTEM_PROMPTS[int(systems[i])]})
        for _ in range(int(turns[i])):
            messages.append({"role": "user", "content": questions[k]})
            if results is not None and k % 2 == 0:
                messages += _tool_exchange(k, questions[k], results[k])
            messages.append({"role": "assistant", "content": answers[k]})
            if reasoning is not None:
                messages[-1]["reasoning_content"] = reasoning[k]
            k += 1
        out.append({"messages": messages})
    return out


#: The tools the generated tool calls name.
TOOLS = ("search", "lookup", "calculate")


def _tool_exchange(k: int, question: str, result: str) -> list[dict[str, Any]]:
    """Exchange ``k``'s tool call (content empty, null or worded, in turn) and its answer."""
    call = {
        "type": "function",
        "function": {"name": TOOLS[k % 3], "arguments": {"query": " ".join(question.split()[:4])}},
    }
    content = ("", None, "Let me check that.")[k % 3]
    return [
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "content": result},
    ]


def chat_texts(conversations: list[dict[str, Any]]) -> list[str]:
    """Each conversation's contents joined by newlines (the texts without any template)."""
    return ["\n".join(m["content"] or "" for m in c["messages"]) for c in conversations]


def write_chatml_template(path: str | os.PathLike[str]) -> Path:
    """Write :data:`CHATML_TEMPLATE` to ``path`` (for ``render_chat: {template: PATH}``)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(CHATML_TEMPLATE, encoding="utf-8")
    return target


def write_chat_corpus(
    root: str | os.PathLike[str], *, conversations: int = 1000, shards: int = 2, seed: int = 0
) -> list[Path]:
    """Write ``conversations`` records as ``shards`` JSONL files ``chat-00000.jsonl``, ...
    under ``root``; returns the paths."""
    records = generate_conversations(conversations, seed=seed)
    directory = Path(root)
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(records), shards + 1).astype(int).tolist()
    return [
        write_jsonl(directory / f"chat-{s:05d}.jsonl", records[bounds[s] : bounds[s + 1]])
        for s in range(shards)
    ]
