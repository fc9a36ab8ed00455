"""The inline runner: every accumulator and every worker call on the calling thread.

It is the oracle the other runners are compared with.
"""

from __future__ import annotations

from collections.abc import Iterator

from .base import ItemList, StageRunner, execute_inline


class InlineRunner(StageRunner):
    """Runs a stage synchronously on the consumer's thread."""

    kind = "inline"

    def run(self, upstream: Iterator[ItemList]) -> Iterator[ItemList]:
        drivers = self.drivers
        for items in upstream:
            for driver in drivers:
                items = execute_inline(driver.feed(items))
                if not self.ordered:
                    items.extend(execute_inline(driver.poll()))
            if items:
                yield items
        items = []
        for driver in drivers:
            items = execute_inline(driver.feed(items)) + execute_inline(driver.finish())
        if items:
            yield items
