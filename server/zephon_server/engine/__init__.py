"""The deterministic streaming engine: records, work source, operators, runners, planner.

This package never imports gRPC (a test enforces it); the service layer adapts it.
"""

from .arenas import widen_malloc_arenas

# Before the process starts its threads: tokenizer threads sharing a malloc arena serialize.
widen_malloc_arenas()
