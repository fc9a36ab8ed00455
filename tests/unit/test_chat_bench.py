"""The chat benchmark's verdicts (bench/chat_bench.py): a case meets the target on its
steady-state ratio, and a corpus too small for a steady window says so instead of passing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import chat_bench
from zephon_server.engine.chat_corpus import generate_conversations

BASE = {
    "shape": "short",
    "conversations": 48000,
    "tokenizer": "BPE",
    "rounds": [0.8, 0.9, 0.85],
    "whole_run_ratio": 0.7,
    "alone_tokens_s": 2e6,
}


def rows(**case: object) -> list[str]:
    result = {"rounds": 3, "cases": [{**BASE, **case}]}
    return [r for r in chat_bench.markdown(result, "run").split("\n") if r.startswith("| short")]


def test_the_reservoir_share_follows_the_corpus_size():
    tokens = 10_000_000
    share = chat_bench.reservoir_share(tokens)
    rows_per_lane = tokens / chat_bench.MAX_LENGTH / chat_bench.LANES
    assert share == chat_bench.SHUFFLE_ROWS / rows_per_lane
    assert chat_bench.reservoir_share(2 * tokens) == share / 2


def test_the_verdict_is_on_the_steady_ratio_and_shows_the_whole_run():
    (met,) = rows(ratio=0.85, reservoir_share=0.10)
    assert "| 0.850 |" in met and "| 0.700 |" in met and met.endswith("| meets |")
    (missed,) = rows(ratio=0.79, reservoir_share=0.10)
    assert missed.endswith("| misses |")


def test_a_corpus_too_small_for_a_steady_window_is_flagged():
    (row,) = rows(ratio=0.85, reservoir_share=chat_bench.STEADY_SHARE + 0.01)
    assert "not steady" in row


def test_the_flush_periods_follow_the_corpus_size():
    per_lane_before_a_flush = chat_bench.FLUSH_EVERY * chat_bench.CHUNK_SIZE
    assert chat_bench.flush_periods(chat_bench.LANES * per_lane_before_a_flush) == 0.0
    period = chat_bench.LANES * per_lane_before_a_flush
    assert chat_bench.flush_periods(10 * period) == 5.0
    assert chat_bench.flush_periods(chat_bench.CONVERSATIONS["short"]) >= chat_bench.STEADY_PERIODS


def test_a_window_spanning_too_few_flush_periods_is_flagged():
    (row,) = rows(ratio=0.85, reservoir_share=0.05, flush_periods=1.5)
    assert "not steady: the window spans 1.5 flush periods" in row
    (ok,) = rows(ratio=0.85, reservoir_share=0.05, flush_periods=5.9)
    assert ok.endswith("| meets |") and "| 5.9 |" in ok
    (none,) = rows(ratio=0.85, reservoir_share=0.05, flush_periods=0.0)
    assert none.endswith("| meets |")


def test_the_section_names_the_allocator_it_measured():
    """The ratio depends on the allocator (mimalloc speeds the tokenizer up more than the
    pipeline's Python): the section says which one the figures ran on."""
    case = {**BASE, "ratio": 0.85, "reservoir_share": 0.05, "flush_periods": 6.0}
    result = {"rounds": 3, "cases": [case], "allocator": "mimalloc"}
    text = chat_bench.markdown(result, "run")
    assert "Memory allocator: mimalloc, preloaded with the server's tuning" in text
    glibc = chat_bench.markdown({**result, "allocator": "glibc"}, "run")
    assert "Memory allocator: glibc malloc (`--allocator system`, or no mimalloc" in glibc


def test_the_benchmark_runs_on_the_servers_default_allocator(monkeypatch):
    """``main`` asks for the allocator as ``zephon serve`` does: re-executing the command line
    only when run as a program (``argv`` None), never inside a test process."""
    calls = []

    def fake_ensure(choice, exec_argv):
        calls.append((choice, exec_argv))
        raise SystemExit(0)

    monkeypatch.setattr(chat_bench.allocator, "ensure_allocator", fake_ensure)
    for argv in ([], ["--allocator", "system"]):
        try:
            chat_bench.main(argv)
        except SystemExit:
            pass
    assert calls == [("auto", None), ("system", None)]


def test_every_shape_has_a_corpus_size_and_options_the_generator_takes():
    assert set(chat_bench.CONVERSATIONS) == set(chat_bench.SHAPES)
    assert set(chat_bench.QWEN3_SHAPES) <= set(chat_bench.SHAPES)
    for shape, options in chat_bench.SHAPE_OPTIONS.items():
        convs = generate_conversations(4, seed=1, mean_words=chat_bench.SHAPES[shape], **options)
        assert convs != generate_conversations(4, seed=1, mean_words=chat_bench.SHAPES[shape])


def test_the_tokenizer_alone_reads_tool_calling_records_as_render_chat_does():
    # A tool-calling turn's null content is the empty content for render_chat; Qwen3's
    # template fails on a null, so the texts compared with must be rendered the same way.
    if not Path(chat_bench.QWEN3).exists():
        pytest.fail(f"{chat_bench.QWEN3} is missing: run `make tokenizers` (`make test` does)")
    convs = generate_conversations(6, seed=1, mean_words=10, tool_calls=True)
    assert any(m["content"] is None for c in convs for m in c["messages"])
    texts = chat_bench.rendered_texts(chat_bench.QWEN3, convs)
    assert len(texts) == 6 and sum(t.count("<tool_call>") for t in texts) >= 3


def test_the_short_and_long_shapes_run_three_tokenizers_and_only_selects_cases():
    # Llama 3.2 (a 128k vocabulary, a dated system turn) beside the trained BPE and Qwen3; the
    # reasoning and tool shapes on Qwen3 alone, whose template writes both.
    assert list(chat_bench.tokenizers_of("short")) == [
        "BPE 8k (trained)",
        "Qwen3 (real)",
        "Llama 3.2 (real)",
    ]
    assert list(chat_bench.tokenizers_of("tools")) == ["Qwen3 (real)"]
    with pytest.raises(SystemExit):  # a part of the section is never published
        chat_bench.main(["--only", "llama", "--publish"])
