"""The deterministic streaming engine: records, work source, operators, runners, planner.

This package never imports gRPC (a test enforces it); the service layer adapts it. Importing
it has no side effects: process tuning (malloc arenas, garbage collector, tokenizer threading)
is :mod:`zephon_server.runtime`'s, applied by the command line.
"""
