"""Built-in operators and the registry that configs and the builder use."""

from __future__ import annotations

from .accumulators import Accumulator, CountingAccumulator, PassthroughAccumulator
from .base import OpContext, Operator, OpTraits
from .batch import Batch
from .decode import DecodeText
from .fetch import Fetch
from .map_transform import MapTransform
from .mixture import EnsureMixture
from .pack import PackFlat, PackSequences
from .render_chat import RenderChat
from .shuffle import Shuffle
from .tokenize import Tokenize

#: Operators a pipeline config may name, by their config key.
OPERATORS: dict[str, type[Operator]] = {
    op.op_name: op
    for op in (
        DecodeText,
        Tokenize,
        RenderChat,
        MapTransform,
        PackSequences,
        PackFlat,
        EnsureMixture,
        Shuffle,
        Batch,
    )
}

__all__ = [
    "OPERATORS",
    "Accumulator",
    "Batch",
    "CountingAccumulator",
    "DecodeText",
    "EnsureMixture",
    "Fetch",
    "MapTransform",
    "OpContext",
    "OpTraits",
    "Operator",
    "PackFlat",
    "PackSequences",
    "PassthroughAccumulator",
    "RenderChat",
    "Shuffle",
    "Tokenize",
]
