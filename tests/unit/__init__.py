"""The hermetic tier: no sockets, no subprocesses, no sleeps (enforced in conftest.py)."""
