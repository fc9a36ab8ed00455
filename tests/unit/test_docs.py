"""The documentation is tested: examples run, the config reference matches the code, metrics
are all documented, links resolve.

Example convention (README.md and docs/*.md)
    A fenced block whose info string is ``<lang> example [attributes]`` is an *example*. The
    examples of one page run in order, in one fresh temporary directory per page, so a page
    can chain them (write a file, then run a command that reads it):

    * ``python example``: run with the project's interpreter (``python script.py``);
    * ``bash example``: run with ``bash -euo pipefail``;
    * any language with ``file=NAME``: not run, written to ``NAME`` (e.g.
      ``yaml example file=pipeline.yaml``, ``python example file=train.py``).

    Attributes: ``exit=N`` (expected exit status, default 0), ``timeout=S`` (seconds, default
    120), ``requires=NAME[,NAME]`` (skip the block unless each NAME is an importable module or
    a command on PATH), ``server`` / ``server=CONFIG`` (the harness starts ``zephon serve``
    once per page, with the embedded default pipeline or ``--config CONFIG``, a state directory
    ``server-state`` and a free loopback port, and sets ``$ZEPHON_ADDRESS`` for the block),
    ``invalid`` (a YAML file that is wrong on purpose: the schema check expects it to fail).

    A ``text output`` block right after an example holds lines that must appear, in order, in
    that example's stdout + stderr; ``...`` in a line matches anything (timestamps, digests).
    After a block that is not an example, a ``text output`` block is only shown.

    Every example sees: ``python`` and ``zephon`` of the project's interpreter first on PATH;
    the sample corpus the server generates on first start already in
    ``zephon-data/sample-corpus`` (web: JSONL, books: JSONL.zst, code: Parquet with a
    ``content`` column); free loopback ports in ``$GRPC_PORT`` and ``$METRICS_PORT``. Pages
    write ``${GRPC_PORT:-50051}`` so that a reader can paste the commands as they are.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


# -- parsing ------------------------------------------------------------------------------


@dataclass
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    words: list[str]  # the info string after the language
    code: str

    @property
    def is_example(self) -> bool:
        return bool(self.words) and self.words[0] == "example"

    @property
    def is_output(self) -> bool:
        return self.lang == "text" and self.words[:1] == ["output"]

    @property
    def attrs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for word in self.words[1:]:
            key, _, value = word.partition("=")
            out[key] = value
        return out

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass
class Example:
    """An example block and the output lines it must print."""

    block: Block
    expected: list[str] = field(default_factory=list)


def fenced_blocks(page: Path) -> list[Block]:
    """Every fenced block of a Markdown page, in order."""
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        words = shlex.split(info) if info else []
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(m.group("indent")) :])
            j += 1
        lang = words[0] if words else ""
        blocks.append(Block(page, i + 1, lang, words[1:], "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def page_examples(page: Path) -> list[Example]:
    """The examples of a page with their expected output (see the module docstring)."""
    examples: list[Example] = []
    previous: Block | None = None
    for block in fenced_blocks(page):
        if block.is_example:
            examples.append(Example(block))
        elif block.is_output and previous is not None and previous.is_example:
            # Output after a block that is not an example is only shown, never checked.
            examples[-1].expected.extend(line for line in block.code.splitlines() if line.strip())
            continue
        previous = block
    return examples


# -- running ------------------------------------------------------------------------------


def matches(expected: list[str], actual: str) -> str | None:
    """None when the expected lines appear in order in ``actual``; else the first missing."""
    lines = [line.rstrip() for line in actual.splitlines()]
    pos = 0
    for want in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in want.rstrip().split("...")))
        while pos < len(lines) and not pattern.fullmatch(lines[pos]):
            pos += 1
        if pos == len(lines):
            return want
        pos += 1
    return None


def test_example_convention_is_used() -> None:
    """Guards the harness itself: the pages do carry examples, and attributes are known."""
    known = {"file", "exit", "timeout", "requires", "server", "invalid"}
    total = 0
    for page in PAGES:
        for example in page_examples(page):
            total += 1
            unknown = set(example.block.attrs) - known
            assert not unknown, f"{example.block.where}: unknown attributes {sorted(unknown)}"
            if "file" in example.block.attrs:
                assert not example.expected, f"{example.block.where}: a file has no output"
    assert total >= 20, f"only {total} examples found; did the fence convention change?"


def test_output_matching() -> None:
    assert matches(["a ... c", "d"], "x\na b c\nd\n") is None
    assert matches(["d", "a ... c"], "a b c\nd\n") == "a ... c"
    assert matches(["...serving 8 lanes..."], "12:00 INFO serving 8 lanes [0]") is None


# -- the generated config reference ---------------------------------------------------------


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "tools" / "gen_config_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_up_to_date() -> None:
    generated = _load_generator().generate()
    current = (DOCS / "config-reference.md").read_text()
    assert current == generated, (
        "docs/config-reference.md is out of date with the code: "
        "run python tools/gen_config_reference.py"
    )


def test_config_reference_covers_the_schema() -> None:
    """Every key and operator parameter the config loader accepts is in the reference."""
    import dataclasses

    from zephon_server.engine.config import DATASET_KEYS, TOP_LEVEL_KEYS
    from zephon_server.engine.execution import PROGRAM_FIELDS, ExecutionConfig
    from zephon_server.engine.ops import OPERATORS

    text = (DOCS / "config-reference.md").read_text()
    execution = [f.name for f in dataclasses.fields(ExecutionConfig)]
    keys = [*TOP_LEVEL_KEYS, *DATASET_KEYS, *(k for k in execution if k not in PROGRAM_FIELDS)]
    for key in keys:
        assert f"`{key}`" in text, key
    for name, cls in OPERATORS.items():
        section = text.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        for param in cls.accepted_params():
            if param != "kwargs":
                assert f"`{param}`" in section or param in (
                    "parallelism",
                    "placement",
                    "microbatch_size",
                ), (name, param)


def test_yaml_configs_in_docs_are_valid(tmp_path: Path) -> None:
    """Every YAML block that is a pipeline config passes the config loader's validation."""
    import yaml

    template = tmp_path / "chat.jinja"  # render_chat templates are files the page writes
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")

    from zephon_server.engine.config import parse_config
    from zephon_server.engine.errors import ConfigError

    checked = 0
    for page in PAGES:
        for block in fenced_blocks(page):
            if block.lang not in ("yaml", "yml"):
                continue
            data = yaml.safe_load(block.code)
            if not (isinstance(data, dict) and "pipeline" in data and "datasets" in data):
                continue
            for step in data["pipeline"]:
                if isinstance(step, dict) and isinstance(step.get("map_transform"), dict):
                    step["map_transform"]["fn"] = "builtins:dict"  # the page's module: not here
                chat = step.get("render_chat") if isinstance(step, dict) else None
                if isinstance(chat, dict) and "template" in chat:
                    chat["template"] = str(template)
            if "invalid" in block.attrs:  # a deliberate mistake (troubleshooting examples)
                with pytest.raises(ConfigError):
                    parse_config(data, source=block.where)
                continue
            try:
                parse_config(data, source=block.where)
            except Exception as exc:  # the message names the key
                raise AssertionError(f"{block.where}: {exc}") from exc
            checked += 1
    assert checked >= 3


# -- metrics ------------------------------------------------------------------------------


# -- links --------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub-style heading anchors of a page."""
    out: set[str] = set()
    in_code = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            out.add(slug)
    return out


def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for m in LINK.finditer(text):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


# -- README and the pipelines guide -----------------------------------------------------------


def _first_table_after(text: str, heading: str) -> list[str]:
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_readme_benchmark_table_matches_benchmarks_page() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- bench-table:start", 1)[1].split("<!-- bench-table:end", 1)[0]
    table = [line for line in block.splitlines() if line.startswith("|")]
    expected = _first_table_after((DOCS / "benchmarks.md").read_text(), "## Targets")
    assert table == expected, (
        "the README's benchmark table differs from the Targets table of docs/benchmarks.md; "
        "copy that table into the README between the bench-table markers"
    )


def test_pipelines_guide_covers_every_operator() -> None:
    """docs/pipelines.md has a section per built-in operator naming each of its parameters."""
    from zephon_server.engine.ops import OPERATORS
    from zephon_server.engine.ops.base import EXECUTION_PARAMS

    text = (DOCS / "pipelines.md").read_text()
    for name, cls in OPERATORS.items():
        heading = f"`{name}`"
        sections = [s for s in text.split("\n### ")[1:] if heading in s.splitlines()[0]]
        assert sections, f"docs/pipelines.md has no section for operator {name!r}"
        for param in cls.accepted_params():
            if param == "kwargs" or (
                param in EXECUTION_PARAMS and (name, param) != ("batch", "microbatch_size")
            ):
                continue
            assert f"`{param}`" in sections[0], f"docs/pipelines.md: {name} misses {param!r}"
