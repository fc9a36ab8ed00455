"""The deterministic streaming engine: records, work source, operators, runners, planner.

This package never imports gRPC (a test enforces it); the service layer adapts it.
"""
