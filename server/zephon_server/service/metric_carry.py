"""Counters of this process's work that keep counting across a ``Resume`` RPC.

A ``Resume`` installs a new pipeline run in the hub, and the figures some counters are read
from (records skipped and dropped, records the replay filter dropped, seconds a lane held the
pipeline back, batches not kept or cut, stalls at sentinels) start again at zero in it.
Exported as they are, those counters went backwards (or their series vanished) without a
process restart, which Prometheus reads as a counter reset: ``increase()`` then counts the new
run's value a second time. :class:`Carry` adds, per series, what the earlier runs of this
process counted, so each stays monotonic for the life of the process, as a counter must.

Counters that follow the data stream's position instead (a lane's produced position, the
tokens per dataset, restored from the checkpoint) are not carried: after a resume to an
earlier checkpoint they read the position resumed at (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

#: The counter families (names without ``_total``) that count this process's work.
CARRIED = frozenset(
    {
        "zephon_replayed_records",
        "zephon_records_skipped",
        "zephon_records_dropped",
        "zephon_records_mask_errors",
        "zephon_lane_held_back_seconds",
        "zephon_lane_batches_not_kept",
        "zephon_lane_batches_cut",
        "zephon_stall_seconds",
        "zephon_sentinels_stalled",
    }
)
#: The counters that follow the stream's position (module docstring): a resume rewinds them.
STREAM_POSITIONS = frozenset(
    {"zephon_lane_batches_produced", "zephon_dataset_tokens", "zephon_dataset_loss_tokens"}
)

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


class Carry:
    """Adds the earlier runs' final values to :data:`CARRIED` counters (see the module)."""

    def __init__(self, names: frozenset[str] = CARRIED) -> None:
        self.names = names
        self.generation: int | None = None
        self.base: dict[SeriesKey, float] = {}  # what earlier runs counted, per series
        self.last: dict[SeriesKey, float] = {}  # what the current run counts, per series

    def apply(self, generation: int, families: Iterable[Any]) -> Iterator[Any]:
        """``families`` of run ``generation`` (the hub's), the carried counters raised by
        what earlier runs counted (a series an earlier run had is kept at its total)."""
        if generation != self.generation:
            for key, value in self.last.items():
                self.base[key] = self.base.get(key, 0.0) + value
            self.last = {}
            self.generation = generation
        for family in families:
            if family.name in self.names:
                self._raise(family)
            yield family

    def _raise(self, family: Any) -> None:
        present = set()
        samples = []
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                samples.append(sample)  # _created and the like
                continue
            key = (family.name, tuple(sorted(sample.labels.items())))
            present.add(key)
            self.last[key] = sample.value
            samples.append(sample._replace(value=sample.value + self.base.get(key, 0.0)))
        for (name, labels), value in sorted(self.base.items()):
            if name == family.name and (name, labels) not in present:
                samples.append(_sample(name)._replace(labels=dict(labels), value=value))
        family.samples = samples


def _sample(name: str) -> Any:
    """A ``<name>_total`` sample to fill in (a series the current run has not counted yet)."""
    from prometheus_client.samples import Sample

    return Sample(f"{name}_total", {}, 0.0, None, None)
