"""Files a dataset listing leaves out, said out loud.

A directory (or prefix, or pattern) picks its shards by extension, so that stray files
(READMEs, ``_SUCCESS`` markers) are not read as data. But a file that *looks* like data in a
format the service does not read (``.json``, ``.ndjson``, ``.jsonl.bz2``, ``.jsonl.1``) was
left out with no word: a dataset silently smaller than its directory. Such files get a
warning naming a few of them and the fix; other files left out get one info line with their
count.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

logger = logging.getLogger(__name__)

#: Names that look like data: a JSON, JSON-lines, Parquet, Arrow or CSV extension, perhaps
#: followed by more suffixes (``.jsonl.bz2``, ``.jsonl.1``, ``.parquet.tmp``).
DATA_LIKE = re.compile(r"\.(jsonl?|ndjson|parquet|pq|arrow|csv|tsv)(\.[^./]+)*\Z", re.IGNORECASE)
#: Names shown in the warning.
SHOWN = 5


def report_ignored(
    who: str, where: str, names: Sequence[str], supported: str, root: str = ""
) -> None:
    """Log what ``where`` holds beside its shards: a warning for ``names`` that look like
    data (shown without the leading ``root``), an info line for the others."""
    if not names:
        return
    names = [n[len(root) :].lstrip("/") if root and n.startswith(root) else n for n in names]
    data = [n for n in names if DATA_LIKE.search(n.rsplit("/", 1)[-1])]
    if data:
        shown = ", ".join(data[:SHOWN]) + (
            f" and {len(data) - SHOWN} more" if len(data) > SHOWN else ""
        )
        logger.warning(
            "%s: %d file(s) in %s look like data but are not read (not a supported extension: "
            "%s): %s; rename or convert them, or select them with a glob and set format",
            who,
            len(data),
            where,
            supported,
            shown,
        )
    others = len(names) - len(data)
    if others:
        logger.info(
            "%s: %d other file(s) in %s are not shards and are not read", who, others, where
        )
