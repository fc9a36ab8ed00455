"""Helpers only tests use (record builders, the S3 server, the HTTP fault proxy).

Helpers that ``tools/`` runs as well (server processes, infrastructure, the TCP fault proxy,
the reliability scenarios) live in ``tools/zephon_testing`` so that tools never import tests.
"""
