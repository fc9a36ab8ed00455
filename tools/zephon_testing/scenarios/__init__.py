"""The reliability scenarios: each checks what its test checks and returns what it measured.

The reliability tests (``tests/reliability``) assert on them; ``tools/reliability_report.py``
runs the same functions without pytest and renders their figures into ``docs/reliability.md``.
"""
