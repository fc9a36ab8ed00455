"""Optional PyTorch adapter: a :class:`torch.utils.data.IterableDataset` over a DataClient.

``torch`` is imported only when the adapter is used, so this module imports without it::

    from zephon_client.torch import ZephonIterableDataset

    dataset = ZephonIterableDataset(lambda: DataClient("server:50051", rank=r, world_size=w))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None)  # batches come whole

Each item is a dict ``{tensor name: torch.Tensor}`` (numpy arrays shared with the received
message are read-only, so they are copied). The client already prefetches on a background
I/O thread; use ``num_workers`` 0 or 1 (several workers would each read the same lanes).
``state_dict()``/``load_state_dict()`` forward to the client (torchdata's stateful loader
protocol): a state loaded before iterating is applied to the next client made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .client import DataClient

__all__ = ["ZephonIterableDataset", "to_torch"]  # noqa: F822 (built lazily by __getattr__)

_CLASS: type | None = None


def to_torch(tensors: dict[str, Any]) -> dict[str, Any]:
    """numpy arrays → torch tensors (``torch.from_numpy``, copying read-only arrays)."""
    import torch

    return {
        name: torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        for name, arr in tensors.items()
    }


def _dataset_class() -> type:
    """Build the IterableDataset subclass once torch is importable."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch.utils.data

    class ZephonIterableDataset(torch.utils.data.IterableDataset):  # type: ignore[misc]
        """Yields this rank's batches as dicts of tensors from a fresh client per iteration.

        ``client_factory`` makes the :class:`~zephon_client.client.DataClient` (called in
        the process that iterates, e.g. a DataLoader worker); it is closed when the iteration
        ends or is abandoned. ``with_meta`` adds ``"lane"`` and ``"seq"`` (ints) to each item.
        """

        def __init__(
            self, client_factory: Callable[[], DataClient], *, with_meta: bool = False
        ) -> None:
            super().__init__()
            self.client_factory = client_factory
            self.with_meta = with_meta
            self.client: DataClient | None = None
            self._state: dict[str, Any] | None = None

        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = torch.utils.data.get_worker_info()
            if info is not None and info.num_workers > 1:
                raise ValueError(
                    "ZephonIterableDataset: use num_workers 0 or 1 (the client prefetches on "
                    f"a background thread; {info.num_workers} workers would read the same lanes)"
                )
            client = self.client_factory()
            if self._state is not None:
                client.load_state_dict(self._state)
                self._state = None
            self.client = client
            try:
                for batch in client:
                    item = to_torch(batch.tensors)
                    if self.with_meta:
                        item["lane"] = batch.lane
                        item["seq"] = batch.seq
                    yield item
            finally:
                client.close()

        def state_dict(self) -> dict[str, Any]:
            """The current client's state (or the state waiting to be loaded)."""
            if self.client is not None:
                return self.client.state_dict()
            if self._state is not None:
                return dict(self._state)
            raise RuntimeError("no client yet: iterate the dataset first")

        def load_state_dict(self, state: dict[str, Any]) -> None:
            """Start the next iteration's client from ``state``."""
            self._state = dict(state)

    _CLASS = ZephonIterableDataset
    return _CLASS


def __getattr__(name: str) -> Any:
    if name == "ZephonIterableDataset":
        return _dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
