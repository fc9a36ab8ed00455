"""Code the tests and the tools share: real servers, infrastructure, fault injection, scenarios.

Tools (``tools/reliability_report.py``) never import ``tests``; the tests import this package
(``pyproject.toml`` puts ``tools/`` on pytest's ``pythonpath``). Not shipped in the wheel.
"""
