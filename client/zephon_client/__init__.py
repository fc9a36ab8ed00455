"""Zephon trainer client: streams a rank's lanes from a Zephon server.

Installs with grpcio, protobuf and numpy only; it never imports the server's engine.

* :class:`DataClient`: iterate it to get a rank's :class:`Batch` objects (numpy arrays) in
  strict round-robin over its lanes; ``state_dict``/``load_state_dict``, ``checkpoint``/
  ``resume``; reconnects on ``UNAVAILABLE`` and verifies chain digests, and stops with
  :class:`PipelineMismatch` when a server now serves another pipeline; ``lane_ends`` has each
  ended lane's :class:`LaneEnd` (documents closed after its last batch).
* :func:`merge_state_dicts`: union of several ranks' states (resume with another rank count).
* :func:`lanes_for_rank`: the rank → lanes mapping.
* ``zephon_client.torch.ZephonIterableDataset``: optional PyTorch adapter.
* ``zephon_client.tail.tail``: print a lane's batches (``zephon tail``).
"""

from .channel import AUTH_TOKEN_ENV, DEFAULT_CHANNEL_OPTIONS, TLSConfig
from .client import Batch, CheckpointInfo, DataClient
from .errors import PipelineMismatch, ZephonClientError
from .mapping import lanes_for_rank
from .state import merge_state_dicts
from .wire import CHAIN_SEED, ChainMismatch, ClosedDocument, DecodedBatch, LaneEnd, WireError

__version__ = "0.1.0"

__all__ = [
    "AUTH_TOKEN_ENV",
    "CHAIN_SEED",
    "DEFAULT_CHANNEL_OPTIONS",
    "Batch",
    "ChainMismatch",
    "CheckpointInfo",
    "ClosedDocument",
    "DataClient",
    "DecodedBatch",
    "LaneEnd",
    "PipelineMismatch",
    "TLSConfig",
    "WireError",
    "ZephonClientError",
    "__version__",
    "lanes_for_rank",
    "merge_state_dicts",
]
