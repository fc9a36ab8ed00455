"""The files of a local dataset path: every file below a directory or matched by a pattern,
each real file once.

Links are followed everywhere: a link to a file, a link to a directory inside a dataset
directory, and the directories a glob pattern walks through (Python's ``glob`` follows them).
Every real directory is walked once, so a link back up the tree (``sub/up -> ..``) adds
nothing instead of listing the tree again at every level, and every real file is listed once,
under its own path when that is listed (else the first of its paths in sorted order): a
file reached through two paths would otherwise be served twice as two shards, silently.
Each dropped path is counted in one warning naming an example (docs/decisions.md, "Links
in dataset directories").
"""

from __future__ import annotations

import glob
import logging
import os

from .storage.location import glob_base, glob_regex

logger = logging.getLogger(__name__)


def walk_files(top: str) -> list[str]:
    """Every non-hidden file below directory ``top``, links to directories followed (each
    real directory walked once), sorted."""
    seen = {os.path.realpath(top)}
    files: list[str] = []
    for root, dirs, names in os.walk(top, followlinks=True):
        kept = []
        for name in sorted(dirs):
            if name.startswith("."):
                continue
            real = os.path.realpath(os.path.join(root, name))
            if real not in seen:
                seen.add(real)
                kept.append(name)
        dirs[:] = kept
        files.extend(os.path.join(root, n) for n in names if not n.startswith("."))
    return sorted(files)


def glob_files(pattern: str) -> list[str]:
    """The files ``pattern`` (an absolute path; ``**`` allowed) matches, sorted.

    A ``**`` pattern walks its fixed leading directories with :func:`walk_files` and matches
    what it finds with the glob's regex (as for object keys), since Python's ``glob`` walks a
    directory again through every link to it: a link loop listed the tree up to 40 times,
    and two loops would not end. The match is the one ``glob`` makes (hidden names match
    only a part that names them); a pattern naming a hidden part below its first wildcard
    goes to ``glob`` itself, as walks skip hidden directories."""
    parts = pattern.split("/")
    if "**" in parts:
        base = glob_base(pattern)
        rest = parts[base.count("/") :]
        if not any(part.startswith(".") for part in rest):
            regex = glob_regex(pattern)
            return [p for p in walk_files(base or "/") if regex.match(p)]
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def unique_files(who: str, files: list[str]) -> list[str]:
    """``files`` (sorted) with every real file once: under its own path when that is listed,
    else under its first path; a warning counts the paths dropped."""
    paths: dict[str, list[str]] = {}
    resolve = _RealPaths()
    for path in files:
        paths.setdefault(resolve(path), []).append(path)
    kept: list[str] = []
    dropped: list[tuple[str, str]] = []
    for real, group in paths.items():
        chosen = real if real in group else group[0]
        kept.append(chosen)
        dropped.extend((path, chosen) for path in group if path != chosen)
    if dropped:
        path, same = dropped[0]
        logger.warning(
            "%s: %d listed file path(s) lead to a file listed already (e.g. %s is %s, through "
            "a link); each file is read once, under its own path when listed, else its first",
            who,
            len(dropped),
            path,
            same,
        )
    return sorted(kept)


class _RealPaths:
    """``os.path.realpath`` of many files, one directory's resolution shared by its files: a
    file that is not a link is its real directory plus its name. Resolving each path whole
    cost an ``lstat`` per path component per file (0.4 s for 10,000 shards, a fifth of a
    warm start); this costs one ``lstat`` per file."""

    def __init__(self) -> None:
        self._dirs: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        if os.path.islink(path):
            return os.path.realpath(path)
        head, name = os.path.split(path)
        found = self._dirs.get(head)
        if found is None:
            found = self._dirs[head] = os.path.realpath(head)
        return os.path.join(found, name)
