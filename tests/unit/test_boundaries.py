"""Layer boundaries: the engine never imports gRPC; the client never imports the server."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(package_dir: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package_dir: Path, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{file}: imports {name}"
        for file, names in imported_modules(package_dir).items()
        for name in sorted(names)
        if name.split(".")[0] in forbidden or name.startswith(tuple(f + "." for f in forbidden))
    ]


def test_engine_never_imports_grpc():
    engine = ROOT / "server" / "zephon_server" / "engine"
    assert engine.is_dir()
    assert offenders(engine, ("grpc", "grpc_health", "grpc_reflection", "zephon_proto")) == []


def test_client_never_imports_the_server():
    client = ROOT / "client" / "zephon_client"
    assert client.is_dir()
    assert offenders(client, ("zephon_server", "tokenizers", "pyarrow", "zstandard")) == []


@pytest.mark.parametrize("forbidden", ["grpc", "zephon_server.engine"])
def test_checker_catches_a_violation(tmp_path, forbidden):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(f"import {forbidden}\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert offenders(pkg, (forbidden.split(".")[0],)) != []
    finally:
        ROOT = saved


def test_tools_and_bench_never_import_tests():
    """Tools and benchmarks get shared code from tools/zephon_testing, never from tests/."""
    test_modules = tuple(p.stem for p in (ROOT / "tests").rglob("*.py"))
    found = [
        f"{file}: imports {name}"
        for folder in ("tools", "bench")
        for file, names in imported_modules(ROOT / folder).items()
        for name in sorted(names)
        if name.split(".")[0] in ("tests", *test_modules)
    ]
    assert test_modules and found == []
    assert "sys.path" not in (ROOT / "tools" / "reliability_report.py").read_text()
