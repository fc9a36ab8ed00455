"""Zephon trainer client: streams a rank's lanes from a Zephon server.

Installs with grpcio, protobuf and numpy only; it never imports the server's engine.
"""

__version__ = "0.1.0"
