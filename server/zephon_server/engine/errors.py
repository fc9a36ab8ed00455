"""The engine's exception hierarchy: every library error derives from :class:`ZephonError`."""

from __future__ import annotations


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
