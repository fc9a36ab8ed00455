"""A deterministic sample corpus, plus small shard writers that tests use for odd data.

:func:`write_sample_corpus` writes three datasets of English-like text (random words from a
fixed vocabulary with punctuation, varied lengths and a few non-ASCII words) in every format
the readers support: ``web`` as plain JSONL, ``books`` as zstd JSONL and ``code`` as Parquet
with several row groups per file. The same seed always gives byte-identical files.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
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
_PUNCT = ("", ",", ".", "?")
_CODE_TEMPLATES = (
    "def {a}_{b}({c}, {d}):\n    return {c} + {d}\n",
    "class {A}{B}:\n    {c} = {n}\n",
    "for {c} in range({n}):\n    {a}.append({c})\n",
    "if {a} > {n}:\n    {b} = {c}({d})\n",
    "# {a} {b} {c} {d}\n{a}_{b} = {{'{c}': {n}, '{d}': '{e}'}}\n",
    "while {a}:\n    {a} = {b}.pop()\n",
)


def _rng(seed: int, tag: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, tag])))


def _word_table() -> np.ndarray:
    """Every vocabulary word in every (capitalised, punctuation) variant; see :func:`_texts`."""
    out: list[str] = []
    for cap in (False, True):
        for p in _PUNCT:
            out.extend((w[:1].upper() + w[1:] if cap else w) + p for w in VOCABULARY)
    return np.array(out, dtype=object)


def generate_texts(n_docs: int, *, seed: int = 0, mean_words: int = 60, tag: int = 0) -> list[str]:
    """``n_docs`` deterministic English-like documents of about ``mean_words`` words."""
    rng = _rng(seed, 1000 + tag)
    table = _word_table()
    v = len(VOCABULARY)
    lengths = np.maximum(3, np.rint(rng.gamma(2.0, mean_words / 2.0, size=n_docs))).astype(np.int64)
    texts: list[str] = []
    step = 4096
    for start in range(0, n_docs, step):
        lens = lengths[start : start + step]
        total = int(lens.sum())
        words = rng.integers(0, v, size=total)
        r = rng.random(total)
        punct = np.select([r < 0.07, r < 0.085, r < 0.16], [2, 3, 1], 0)
        ends = np.cumsum(lens) - 1
        punct[ends] = 2
        cap = np.ones(total, dtype=bool)
        cap[1:] = punct[:-1] >= 2
        tokens = table[words + v * (punct + len(_PUNCT) * cap)].tolist()
        begin = 0
        for end in (ends + 1).tolist():
            texts.append(" ".join(tokens[begin:end]))
            begin = end
    return texts


def generate_code(n_docs: int, *, seed: int = 0, mean_lines: int = 8) -> list[str]:
    """``n_docs`` deterministic Python-like snippets built from the vocabulary."""
    rng = _rng(seed, 2000)
    ascii_words = [w for w in VOCABULARY if w.isascii() and w.isalpha()]
    counts = np.maximum(1, rng.poisson(mean_lines / 2, size=n_docs))
    total = int(counts.sum())
    picks = rng.integers(0, len(ascii_words), size=(total, 5)).tolist()
    kinds = rng.integers(0, len(_CODE_TEMPLATES), size=total).tolist()
    nums = rng.integers(0, 1000, size=total).tolist()
    docs: list[str] = []
    i = 0
    for c in counts.tolist():
        parts = []
        for _ in range(c):
            a, b, cc, d, e = (ascii_words[x].lower() for x in picks[i])
            parts.append(
                _CODE_TEMPLATES[kinds[i]].format(
                    a=a, b=b, c=cc, d=d, e=e, A=a.title(), B=b.title(), n=nums[i]
                )
            )
            i += 1
        docs.append("\n".join(parts))
    return docs


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


def write_jsonl_zst(
    path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any] | str | bytes]
) -> Path:
    """Write a zstd-compressed JSONL shard (see :func:`write_jsonl`)."""
    return write_jsonl(path, rows, compression="zst")


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
    return list(zip(edges[:-1], edges[1:]))


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
        rows = [{"id": f"web-{k}", "text": web[k]} for k in range(a, b)]
        write_jsonl(base / "web" / f"part-{i:05d}.jsonl", rows)

    books = generate_texts(n, seed=seed, mean_words=mean_words * 2, tag=2)
    titles = generate_texts(n, seed=seed, mean_words=3, tag=3)
    for i, (a, b) in enumerate(_split(n, 3)):
        rows = [{"title": titles[k].rstrip(".?"), "text": books[k]} for k in range(a, b)]
        write_jsonl(base / "books" / f"part-{i:05d}.jsonl.zst", rows)

    import pyarrow as pa

    code = generate_code(n, seed=seed, mean_lines=max(2, mean_words // 8))
    code_schema = pa.schema([("id", pa.int64()), ("content", pa.string())])
    for i, (a, b) in enumerate(_split(n, 2)):
        group = max(1, -(-(b - a) // 4))
        columns = {"id": list(range(a, b)), "content": code[a:b]}
        write_parquet(
            base / "code" / f"part-{i:05d}.parquet",
            columns,
            row_group_size=group,
            schema=code_schema,
        )

    logger.info("wrote sample corpus with %d docs per dataset under %s", n, base)
    return [
        DatasetSpec(name="web", path=str(base / "web"), weight=0.5),
        DatasetSpec(name="books", path=str(base / "books"), weight=0.3),
        DatasetSpec(name="code", path=str(base / "code"), weight=0.2, text_field="content"),
    ]
