"""The operator contract: traits, context, and the abstract base class every operator subclasses.

An operator never knows how it is executed. The runner drives its accumulator serially and
hands micro-batches to ``process_many`` on any number of workers, so ``process_many`` must be
stateless across calls. The base class wraps the user hooks: :meth:`Operator.run_many` passes
tombstones around ``process_many`` untouched and in place and type-checks results, and
:meth:`Operator.declared_traits` turns a badly built :class:`OpTraits` into a
:class:`~..errors.ContractError` naming the operator. ``traits`` and ``process_many`` are
abstract: whether an operator keeps cursor order changes correctness, so it has no default.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import ConfigError, ContractError, UnsupportedElementError, refuse_abstract
from ..records import SampleBatch, SampleRecord
from .accumulators import Accumulator, CountingAccumulator

#: Parameters every operator accepts that only steer execution (never part of the fingerprint).
EXECUTION_PARAMS = ("parallelism", "microbatch_size", "placement")
PLACEMENTS = ("local", "remote")


@dataclass(frozen=True, kw_only=True)
class OpTraits:
    """What an operator declares to the planner (keyword arguments only).

    ``preserves_cursor_order`` (required, no default): output records leave in the order their
    inputs arrived (so the operator needs no epoch reset for replay); an operator that reorders
    must say False, and a forgotten declaration must not pass as True. ``fusable``: the
    accumulator is a plain count-based grouping and ``process_many`` is stateless, so the
    planner may run the operator in the same worker call as its neighbours.
    """

    preserves_cursor_order: bool
    fusable: bool = True

    def __post_init__(self) -> None:
        for name in ("preserves_cursor_order", "fusable"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"OpTraits.{name} must be a bool, got {getattr(self, name)!r}")


@dataclass
class OpContext:
    """Runtime services and plan metadata handed to ``setup`` and ``accumulator``."""

    op_name: str
    op_index: int
    lanes: int
    seed: int
    deterministic: bool = True
    datasets: tuple[Any, ...] = ()
    pad_id: int = 0
    worker_id: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    #: The plan's :class:`~..index_dir.IndexDir` (None: the shard index is in memory only).
    index: Any = None
    #: The spill budget (``spill_max_bytes``) of a plan without an index directory, whose
    #: spill files then go to a temporary directory (None: the default budget).
    spill_max_bytes: int | None = None

    @property
    def shard_cache(self) -> Any:
        """The process-wide shard cache of the plan's index directory (created on first use,
        so contexts pickle cheaply)."""
        return _process_shard_cache(self.index, self.spill_max_bytes)


def _process_shard_cache(index: Any, spill_max_bytes: int | None = None) -> Any:
    from ..shards import cache_for

    cache = cache_for(index)
    if index is None and spill_max_bytes is not None:  # the memory-only index's spill budget
        cache.index.store.spill_max_bytes = spill_max_bytes
    return cache


#: How to declare traits, quoted by the errors that catch a missing or bad declaration.
TRAITS_FIX = (
    "return OpTraits(preserves_cursor_order=True|False, fusable=...) from traits(): say False "
    "when output records can leave in another order than their inputs arrived"
)


class Operator(abc.ABC):
    """Abstract base class of every operator, built-in or custom.

    Subclasses set ``op_name`` and ``default_microbatch_size``, store their data-shaping
    parameters (returned by :meth:`params`) and implement the abstract :meth:`traits` and
    :meth:`process_many`; ``accumulator``, ``setup`` and ``process_one`` have defaults that
    suit a stateless operator. Instantiating a subclass that misses one raises ``TypeError``
    naming the methods.
    """

    op_name: ClassVar[str] = "operator"
    default_microbatch_size: ClassVar[int] = 64
    #: Latency bound used only in non-deterministic mode (milliseconds).
    max_latency_ms: ClassVar[float | None] = 50.0
    #: Workers for ``process_many`` when no ``parallelism`` is configured: None means the
    #: execution's ``workers``; 0 runs it in the accumulator's driver thread, for cheap
    #: vectorised work where handing micro-batches to a pool costs more than it saves.
    default_parallelism: ClassVar[int | None] = None

    def __init__(
        self,
        *,
        parallelism: int | None = None,
        microbatch_size: int | None = None,
        placement: str = "local",
    ) -> None:
        if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
            raise ConfigError(
                f"{self.op_name}: parallelism must be an integer >= 1, got {parallelism!r}"
            )
        if microbatch_size is not None and (
            not isinstance(microbatch_size, int) or microbatch_size < 1
        ):
            raise ConfigError(
                f"{self.op_name}: microbatch_size must be an integer >= 1, got {microbatch_size!r}"
            )
        if placement not in PLACEMENTS:
            raise ConfigError(
                f"{self.op_name}: placement must be one of {PLACEMENTS}, got {placement!r}"
            )
        self.parallelism = parallelism
        self.placement = placement
        self._microbatch_size = microbatch_size

    def __new__(cls, *args: Any, **kwargs: Any) -> Operator:
        refuse_abstract(cls, "operator", "docs/custom-operators.md")
        return super().__new__(cls)

    # -- contract -------------------------------------------------------------------------

    @property
    def microbatch_size(self) -> int:
        """Elements per ``process_many`` call (the accumulator's ``max_batch``)."""
        return self._microbatch_size or self.default_microbatch_size

    def params(self) -> dict[str, Any]:
        """The data-shaping parameters (they enter the fingerprint and ``explain``)."""
        return {}

    def output_tensors(self) -> tuple[str, ...]:
        """Names of the row tensors this operator adds (GetInfo's tensor schema); none here."""
        return ()

    @abc.abstractmethod
    def traits(self) -> OpTraits:
        """Declared traits, e.g. ``OpTraits(preserves_cursor_order=True)`` for an operator
        that keeps input order and groups statelessly. No default: see :class:`OpTraits`."""

    def declared_traits(self) -> OpTraits:
        """:meth:`traits`, checked: what the planner reads.

        A missing ``preserves_cursor_order``, a positional argument or something other than an
        :class:`OpTraits` raises :class:`~..errors.ContractError` naming the operator and the fix.
        """
        try:
            traits = self.traits()
        except TypeError as exc:
            if not str(exc).startswith("OpTraits.__init__()"):
                raise
            raise ContractError(
                f"operator {self.op_name!r} ({type(self).__name__}.traits): {exc}; {TRAITS_FIX}"
            ) from exc
        if not isinstance(traits, OpTraits):
            raise ContractError(
                f"operator {self.op_name!r}: traits() returned {type(traits).__name__}; "
                f"{TRAITS_FIX}"
            )
        return traits

    def stalls_at_sentinel(self) -> bool:
        """Whether this operator holds a flush sentinel back instead of flushing ("stalls").

        Not an extension point: the spec allows it for ``batch(drop_last=True)`` only, and the
        runner raises :class:`~..errors.ContractError` when any other operator answers True.
        """
        return False

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        """The accumulator grouping this operator's input into micro-batches.

        The latency bound is dropped when ``deterministic`` is set, so boundaries depend only
        on counts.
        """
        return CountingAccumulator(
            self.microbatch_size, max_latency_ms=None if deterministic else self.max_latency_ms
        )

    def check_datasets(self, datasets: Sequence[Any]) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~..errors.ConfigError` when a parameter names a dataset the pipeline
        lacks or does not fit one; ``datasets`` are the pipeline's
        :class:`~..datasets.DatasetSpec`. Called when the plan is compiled (so ``zephon
        explain`` and the server's start-up refuse it), before any ``setup``."""

    def setup(self, ctx: OpContext) -> None:
        """Runs once per worker before any data arrives."""
        self.ctx = ctx

    @abc.abstractmethod
    def process_many(self, elems: list[Any]) -> list[Any]:
        """Transform a micro-batch; stateless across calls. Must return records or batches."""

    def process_one(self, elem: Any) -> list[Any]:
        """Transform one element; by default a one-element ``process_many``."""
        return self.process_many([elem])

    # -- template wrapper used by every runner --------------------------------------------

    def run_many(self, elems: Sequence[Any]) -> list[Any]:
        """Call ``process_many`` on the live elements, keeping tombstones in place.

        Tombstones split the micro-batch into runs; each run goes to ``process_many`` (which
        is stateless, so the grouping does not matter) and the tombstones are put back where
        they were, so order is preserved exactly.
        """
        out: list[Any] = []
        run: list[Any] = []
        for elem in elems:
            if type(elem) is SampleRecord and elem.meta.tombstone:
                if run:
                    out.extend(self._checked(self._call(run)))
                    run = []
                out.append(elem)
            else:
                run.append(elem)
        if run:
            out.extend(self._checked(self._call(run)))
        return out

    def _call(self, run: list[Any]) -> list[Any]:
        if len(run) == 1:
            return self.process_one(run[0])
        return self.process_many(run)

    def _checked(self, results: Any) -> list[Any]:
        if not isinstance(results, list):
            raise UnsupportedElementError(
                f"Unsupported element type: operator {self.op_name!r} returned "
                f"{type(results).__name__} from process_many; return a list of SampleRecord "
                "or SampleBatch"
            )
        for item in results:
            if not isinstance(item, SampleRecord | SampleBatch):
                raise UnsupportedElementError(
                    f"Unsupported element type: {type(item).__name__} from operator "
                    f"{self.op_name!r}; rebuild the payload with record.with_payload(...) so the "
                    "meta (identity and order) is preserved"
                )
        return results

    def describe(self) -> str:
        """One-line description: name and data-shaping parameters."""
        params = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.op_name}({params})"

    @classmethod
    def accepted_params(cls) -> dict[str, inspect.Parameter]:
        """Keyword parameters the constructor accepts (used to validate configs)."""
        accepted: dict[str, inspect.Parameter] = {}
        for klass in reversed(cls.__mro__):
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            for name, param in inspect.signature(init).parameters.items():
                if name != "self" and param.kind in (
                    param.KEYWORD_ONLY,
                    param.POSITIONAL_OR_KEYWORD,
                ):
                    accepted[name] = param
        return accepted
