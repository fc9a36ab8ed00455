"""The engine's exception hierarchy: every library error derives from :class:`ZephonError`."""

from __future__ import annotations

import abc


class ZephonError(Exception):
    """Base class of every error the Zephon engine raises on purpose."""


class ConfigError(ZephonError, ValueError):
    """A pipeline, dataset or execution setting is invalid; raised at load/start-up time."""


class DataError(ZephonError):
    """A record or shard could not be read or decoded under the ``fail`` policy."""


class ShardChanged(DataError):
    """A shard file no longer has the identity (size, modification time) it was indexed with.

    Never skipped by ``on_error: skip``: the file is not a bad record, it is other data.
    """


class ContractError(ZephonError):
    """An operator or accumulator broke the operator contract of the spec page."""


class UnsupportedElementError(ContractError, TypeError):
    """``process_many`` returned something other than SampleRecord / SampleBatch objects."""


class WorkerError(ZephonError):
    """An operator raised inside a worker; carries the operator name and original traceback."""

    def __init__(self, op_name: str, message: str, remote_traceback: str = "") -> None:
        self.op_name = op_name
        self.remote_traceback = remote_traceback
        text = f"operator {op_name!r} failed: {message}"
        if remote_traceback:
            text += f"\n--- worker traceback ---\n{remote_traceback.rstrip()}"
        super().__init__(text)
        self._message = message

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.op_name, self._message, self.remote_traceback))


def refuse_abstract(cls: type, kind: str, guide: str) -> None:
    """Raise ``TypeError`` naming the class, its unimplemented abstract methods and the guide.

    Called from the ``__new__`` of the contract base classes (:class:`~.ops.base.Operator`,
    :class:`~.ops.accumulators.Accumulator`) so that a subclass missing a required method
    fails at construction with the fix, not deep inside a run.
    """
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing and isinstance(cls, abc.ABCMeta):
        methods = ", ".join(f"{name}()" for name in missing)
        raise TypeError(
            f"Can't instantiate {kind} class {cls.__name__}: it must implement {methods} "
            f"(see {guide})"
        )
