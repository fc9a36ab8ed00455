"""The benchmark page (bench/report.py): a ``bench.run`` keeps the sections other commands
publish (``bench.chat_bench``'s "Chat pipeline"), in their place before "Other figures"."""

from __future__ import annotations

from bench import report

CHAT = "## Chat pipeline\n\nshort 0.61, long 0.78\n"


def test_a_regenerated_page_keeps_the_chat_section_before_other_figures():
    old = f"# Benchmarks\n\n## Targets\n\nold\n\n{CHAT}\n## Other figures\n\nx\n"
    new = "# Benchmarks\n\n## Targets\n\nnew\n\n## Other figures\n\ny\n"
    page = report.with_kept(new, report.kept_sections(old))
    assert page == f"# Benchmarks\n\n## Targets\n\nnew\n\n{CHAT}\n## Other figures\n\ny\n"


def test_nothing_is_added_when_the_old_page_has_no_chat_section():
    new = "# Benchmarks\n\n## Other figures\n"
    assert report.kept_sections("# Benchmarks\n\n## Targets\n") == []
    assert report.with_kept(new, []) == new
