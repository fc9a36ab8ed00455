"""The inline runner: every accumulator and every worker call on the calling thread.

It is the oracle the other runners are compared with.
"""

from __future__ import annotations

from collections.abc import Iterator

from .base import ItemList, StageRunner, cascade, cascade_release


class InlineRunner(StageRunner):
    """Runs a stage synchronously on the consumer's thread."""

    kind = "inline"

    def run(self, upstream: Iterator[ItemList]) -> Iterator[ItemList]:
        for items in upstream:
            yield from cascade(self.drivers, items, ordered=self.ordered)
        items = cascade_release(self.drivers, end=True)
        if items:
            yield items
