"""The gRPC service layer: a thin adapter from the engine to the ``zephon.v1`` protocol.

The engine never imports this package (or gRPC); this package converts engine objects to
protocol messages (:mod:`.wire`) and serves them.
"""
