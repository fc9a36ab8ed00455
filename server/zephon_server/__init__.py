"""Zephon service: a deterministic streaming data loader for LLM training.

The server distribution holds the engine (:mod:`zephon_server.engine`, never imports gRPC),
the gRPC service adapter and the ``zephon`` command line. Users import from
:mod:`zephon_server.api` only; every other module is internal.
"""

__version__ = "0.2.0"
