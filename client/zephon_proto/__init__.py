"""Generated protobuf and gRPC code for the Zephon service.

Regenerate with ``make proto``; do not edit (tests/service/test_proto.py checks for
drift).
"""
