"""Layer boundaries: engine < delivery < service; the client never imports the server.

The engine imports neither the delivery layer, the service nor gRPC; the delivery layer
imports the engine but neither the service nor gRPC/protobuf; the client imports none of the
server's packages; ``zephon_wire`` (shared by both sides) imports numpy and the standard
library only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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


GRPC = ("grpc", "grpc_health", "grpc_reflection", "zephon_proto", "google")
SERVER = ROOT / "server" / "zephon_server"


def relative_offenders(package_dir: Path, forbidden: tuple[str, ...]) -> list[str]:
    """Relative imports (``from ..service import x``) of a sibling package in ``forbidden``."""
    out = []
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                top = (node.module or "").split(".")[0]
                names = [top] if top else [alias.name for alias in node.names]
                out += [f"{path.relative_to(ROOT)}: imports ..{n}" for n in names if n in forbidden]
    return out


def test_engine_never_imports_grpc_delivery_or_service():
    engine = SERVER / "engine"
    assert engine.is_dir()
    above = ("zephon_server.delivery", "zephon_server.service")
    assert offenders(engine, GRPC) == []
    assert [o for o in offenders(engine, ("zephon_server",)) if o.endswith(above)] == []
    assert relative_offenders(engine, ("delivery", "service")) == []


def test_delivery_imports_the_engine_but_never_the_service_or_grpc():
    delivery = SERVER / "delivery"
    assert delivery.is_dir()
    assert offenders(delivery, GRPC) == []
    assert relative_offenders(delivery, ("service",)) == []
    assert any("..engine" in o for o in relative_offenders(delivery, ("engine",)))


def test_client_never_imports_the_server():
    client = ROOT / "client" / "zephon_client"
    assert client.is_dir()
    assert offenders(client, ("zephon_server", "tokenizers", "pyarrow", "zstandard")) == []


def test_checker_catches_a_relative_import_of_a_layer_above(tmp_path):
    global ROOT
    pkg = tmp_path / "engine"
    pkg.mkdir()
    (pkg / "mod.py").write_text("from ..delivery.hub import LaneHub\nfrom .. import service\n")
    saved, ROOT = ROOT, tmp_path
    try:
        assert relative_offenders(pkg, ("delivery", "service")) == [
            "engine/mod.py: imports ..delivery",
            "engine/mod.py: imports ..service",
        ]
    finally:
        ROOT = saved


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


def test_wire_module_needs_numpy_and_the_standard_library_only():
    """``zephon_wire`` is shared by the server's engine and the client: it imports neither,
    nor gRPC or protobuf."""
    import sys

    wire = ROOT / "client" / "zephon_wire"
    assert wire.is_dir()
    for file, names in imported_modules(wire).items():
        for name in names:
            top = name.split(".")[0]
            assert top == "numpy" or top in sys.stdlib_module_names, f"{file}: imports {name}"
