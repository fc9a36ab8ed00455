"""A deterministic sample corpus, plus small shard writers that tests use for odd data.

:func:`write_sample_corpus` writes three datasets of English-like text (random words from a
fixed vocabulary with punctuation, varied lengths and a few non-ASCII words) in every format
the readers support: ``web`` as plain JSONL, ``books`` as zstd JSONL and ``code`` as Parquet
with several row groups per file. The same seed always gives byte-identical files.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from .datasets import DatasetSpec

logger = logging.getLogger(__name__)

_VOCAB = """
the of and to in a is that for it as was with be by on not he I this are or his from at which
but have an they you were her she there been one all we their has would when if so no will
more out up into do any your what some can only other time new about could these may first
then than very also after well made people many where most over such through back years much
before good great just those how work world life state being year still long house own under
part while same found day place high small large every between home water light land number
might again never city thing point child river market story system group power hand music
night field game table voice word letter school morning window garden paper mountain village
road bridge forest ocean island valley summer winter spring autumn history science language
simple quiet bright early late green blue golden silver ancient modern gentle rapid careful
open closed warm cold soft hard heavy clear dark little young old strong weak happy
walk talk run read write build carry follow bring begin learn teach watch listen remember
travel measure gather answer question reason method model data signal pattern memory engine
network record sample stream batch token shard lane chunk order random seed value number
train test model layer weight vector matrix function program compiler library server client
protocol message packet buffer queue thread process worker scheduler checkpoint resume
because although however therefore perhaps usually sometimes often rarely always almost
together against around behind beyond during within without toward across along among
north south east west center corner edge surface border harbor station tower castle temple
bread cheese apple orange coffee tea wine salt sugar honey butter soup rice fish bird horse
friend family teacher doctor farmer writer painter sailor soldier king queen student
café naïve 日本 über résumé façade Zürich 東京 señor jalapeño smörgåsbord crème brûlée déjà
Ελλάδα Москва 🙂
"""
VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(_VOCAB.split()))
_NON_ASCII_SHARE = 0.01  # share of words drawn from the non-ASCII part of the vocabulary
_PUNCT = ("", ",", ".", "?")
_POOL_SENTENCES = 1 << 15
_POOL_CODE_LINES = 1 << 13
_CODE_TEMPLATES = (
    "def {a}_{b}({c}, {d}):\n    return {c} + {d}",
    "class {A}{B}:\n    {c} = {n}",
    "for {c} in range({n}):\n    {a}.append({c})",
    "if {a} > {n}:\n    {b} = {c}({d})",
    "# {a} {b} {c} {d}\n{a}_{b} = {{'{c}': {n}, '{d}': '{e}'}}",
    "while {a}:\n    {a} = {b}.pop()",
    "{a} = [{c} for {c} in {b} if {c}.{d}]",
    "return {a}.{b}({n})",
)


def _rng(seed: int, tag: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, tag])))


def _word_probs() -> np.ndarray:
    """Word probabilities: uniform over ASCII words, non-ASCII words share a small part."""
    is_ascii = np.array([w.isascii() for w in VOCABULARY])
    probs = np.where(is_ascii, (1 - _NON_ASCII_SHARE) / is_ascii.sum(), 0.0)
    probs[~is_ascii] = _NON_ASCII_SHARE / max(1, int((~is_ascii).sum()))
    return probs / probs.sum()


def _words(rng: np.random.Generator, n: int, lengths: np.ndarray, cap_all: bool) -> list[str]:
    """Runs of random words (run ``i`` has ``lengths[i]`` words) joined by spaces.

    Title runs (``cap_all``) capitalise every word. Prose runs are sentences: capitalised
    first word, some commas, ending with ``.`` or ``?``.
    """
    v = len(VOCABULARY)
    table: list[str] = []
    for upper in (False, True):
        for p in _PUNCT:
            table.extend((w[:1].upper() + w[1:] if upper else w) + p for w in VOCABULARY)
    total = int(lengths.sum())
    words = rng.choice(v, size=total, p=_word_probs())
    ends = np.cumsum(lengths) - 1
    if cap_all:
        punct = np.zeros(total, dtype=np.int64)
        cap = np.ones(total, dtype=bool)
    else:
        r = rng.random(total)
        punct = np.select([r < 0.10], [1], 0)
        punct[ends] = np.where(rng.random(len(ends)) < 0.1, 3, 2)
        cap = np.zeros(total, dtype=bool)
        cap[ends[:-1] + 1] = True
        cap[0] = True
    tokens = np.array(table, dtype=object)[words + v * (punct + len(_PUNCT) * cap)].tolist()
    out = []
    begin = 0
    for end in (ends + 1).tolist()[:n]:
        out.append(" ".join(tokens[begin:end]))
        begin = end
    return out


def _compose(
    rng: np.random.Generator, pool: list[str], n_docs: int, mean_parts: float, sep: str
) -> list[str]:
    """``n_docs`` documents, each a varying number of random pool entries."""
    counts = np.maximum(1, np.rint(rng.gamma(2.0, mean_parts / 2.0, size=n_docs))).astype(np.int64)
    picks = rng.integers(0, len(pool), size=int(counts.sum()))
    parts = np.array(pool, dtype=object)[picks].tolist()
    docs = []
    begin = 0
    for end in np.cumsum(counts).tolist():
        docs.append(sep.join(parts[begin:end]))
        begin = end
    return docs


def generate_texts(n_docs: int, *, seed: int = 0, mean_words: int = 60, tag: int = 0) -> list[str]:
    """``n_docs`` deterministic English-like documents of about ``mean_words`` words.

    Documents are random sequences of sentences from a seeded pool of sentences of random
    words, which keeps generation fast for hundreds of thousands of documents.
    """
    rng = _rng(seed, 1000 + tag)
    lengths = 3 + rng.poisson(9, size=_POOL_SENTENCES)
    pool = _words(rng, _POOL_SENTENCES, lengths, cap_all=False)
    mean_len = float(lengths.mean())
    return _compose(rng, pool, n_docs, max(1.0, mean_words / mean_len), " ")


def generate_titles(n_docs: int, *, seed: int = 0, tag: int = 0) -> list[str]:
    """``n_docs`` deterministic short title-case titles (two to five words)."""
    rng = _rng(seed, 3000 + tag)
    return _words(rng, n_docs, rng.integers(2, 6, size=n_docs), cap_all=True)


def generate_code(n_docs: int, *, seed: int = 0, mean_lines: int = 8) -> list[str]:
    """``n_docs`` deterministic Python-like snippets built from the vocabulary."""
    rng = _rng(seed, 2000)
    ascii_words = [w.lower() for w in VOCABULARY if w.isascii() and w.isalpha()]
    picks = rng.integers(0, len(ascii_words), size=(_POOL_CODE_LINES, 5)).tolist()
    kinds = rng.integers(0, len(_CODE_TEMPLATES), size=_POOL_CODE_LINES).tolist()
    nums = rng.integers(0, 1000, size=_POOL_CODE_LINES).tolist()
    pool = []
    for kind, (a, b, c, d, e), n in zip(kinds, picks, nums):
        w = [ascii_words[x] for x in (a, b, c, d, e)]
        pool.append(
            _CODE_TEMPLATES[kind].format(
                a=w[0], b=w[1], c=w[2], d=w[3], e=w[4], A=w[0].title(), B=w[1].title(), n=n
            )
        )
    return _compose(rng, pool, n_docs, max(1.0, mean_lines / 1.6), "\n")


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\ud800-\udfff]')


def _json_str(text: str) -> str:
    """``text`` as a JSON string literal, like ``json.dumps(text, ensure_ascii=False)``."""
    if _NEEDS_ESCAPE.search(text) is None:
        return f'"{text}"'
    return json.dumps(text, ensure_ascii=False)


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _jsonl_bytes(rows: Iterable[Mapping[str, Any] | str | bytes]) -> bytes:
    parts: list[bytes] = []
    for row in rows:
        if isinstance(row, bytes):
            parts.append(row + b"\n")
        elif isinstance(row, str):
            parts.append(row.encode("utf-8") + b"\n")
        else:
            parts.append(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
    return b"".join(parts)


def write_jsonl(
    path: str | os.PathLike[str],
    rows: Iterable[Mapping[str, Any] | str | bytes],
    compression: str | None = None,
) -> Path:
    """Write one line per row: mappings as JSON, ``str``/``bytes`` verbatim (for bad data).

    ``compression`` is ``"gz"``, ``"zst"``, ``"none"`` or ``None`` (from the file extension).
    The file appears atomically. Returns the path.
    """
    target = Path(path)
    if compression is None:
        compression = {".gz": "gz", ".zst": "zst"}.get(target.suffix, "none")
    data = _jsonl_bytes(rows)
    if compression == "gz":
        data = gzip.compress(data, compresslevel=6, mtime=0)
    elif compression == "zst":
        data = zstandard.ZstdCompressor(level=3).compress(data)
    elif compression != "none":
        raise ValueError(f"compression must be 'gz', 'zst', 'none' or None, got {compression!r}")
    _atomic_write(target, data)
    return target


def write_jsonl_gz(
    path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any] | str | bytes]
) -> Path:
    """Write a gzip-compressed JSONL shard (see :func:`write_jsonl`)."""
    return write_jsonl(path, rows, compression="gz")


def write_parquet(
    path: str | os.PathLike[str],
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]],
    row_group_size: int | None = None,
    schema: Any = None,
) -> Path:
    """Write rows (a list of mappings or a mapping of columns) as a Parquet file.

    ``row_group_size`` bounds the rows per row group (small values give many row groups);
    ``schema`` (a ``pyarrow.Schema``) fixes column types, e.g. for empty files.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(rows, Mapping):
        table = pa.table({k: list(v) for k, v in rows.items()}, schema=schema)
    else:
        table = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    pq.write_table(table, tmp, row_group_size=row_group_size)
    os.replace(tmp, target)
    return target


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, parts + 1).round().astype(int).tolist()
    return list(itertools.pairwise(edges))


def write_sample_corpus(
    root: str | os.PathLike[str],
    *,
    docs_per_dataset: int = 200,
    seed: int = 0,
    mean_words: int = 60,
) -> list[DatasetSpec]:
    """Write the ``web`` (JSONL), ``books`` (JSONL.zst) and ``code`` (Parquet) datasets.

    Returns their specs (weights 0.5, 0.3, 0.2; absolute directory paths). Deterministic in
    ``seed``; existing files of the same names are replaced.
    """
    if docs_per_dataset < 1:
        raise ValueError(f"docs_per_dataset must be >= 1, got {docs_per_dataset}")
    base = Path(root).resolve()
    n = docs_per_dataset

    web = generate_texts(n, seed=seed, mean_words=mean_words, tag=1)
    for i, (a, b) in enumerate(_split(n, 4)):
        lines = [f'{{"id": "web-{k}", "text": {_json_str(web[k])}}}' for k in range(a, b)]
        write_jsonl(base / "web" / f"part-{i:05d}.jsonl", lines)

    books = generate_texts(n, seed=seed, mean_words=mean_words * 2, tag=2)
    titles = generate_titles(n, seed=seed, tag=2)
    for i, (a, b) in enumerate(_split(n, 3)):
        lines = [
            f'{{"title": {_json_str(titles[k])}, "text": {_json_str(books[k])}}}'
            for k in range(a, b)
        ]
        write_jsonl(base / "books" / f"part-{i:05d}.jsonl.zst", lines)

    import pyarrow as pa

    code = generate_code(n, seed=seed, mean_lines=max(2, mean_words // 8))
    code_schema = pa.schema([("id", pa.int64()), ("content", pa.string())])
    for i, (a, b) in enumerate(_split(n, 2)):
        group = max(1, -(-(b - a) // 4))
        columns: dict[str, list[Any]] = {"id": list(range(a, b)), "content": code[a:b]}
        write_parquet(
            base / "code" / f"part-{i:05d}.parquet",
            columns,
            row_group_size=group,
            schema=code_schema,
        )

    logger.info("wrote sample corpus with %d docs per dataset under %s", n, base)
    return sample_corpus_specs(base)


def sample_corpus_specs(root: str | os.PathLike[str]) -> list[DatasetSpec]:
    """The dataset specs of a sample corpus written under ``root`` (absolute paths).

    ``web`` 0.5, ``books`` 0.3 and ``code`` 0.2 (``code`` reads its ``content`` column).
    """
    base = Path(root).resolve()
    return [
        DatasetSpec(name="web", path=str(base / "web"), weight=0.5),
        DatasetSpec(name="books", path=str(base / "books"), weight=0.3),
        DatasetSpec(name="code", path=str(base / "code"), weight=0.2, text_field="content"),
    ]
