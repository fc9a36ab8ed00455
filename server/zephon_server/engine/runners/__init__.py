"""Runners: execute a stage's steps (inline, threads, processes, ray)."""
