"""Zephon's tests, in tiers: ``unit`` (hermetic, fast), ``service`` and ``reliability``.

A package so that test modules are imported by their full names (``tests.unit.test_pack``) and
share helpers through ``tests.support``; see ``tests/README.md`` for which tier a test goes in.
"""
