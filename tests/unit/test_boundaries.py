"""Layer boundaries: the engine never imports gRPC, the delivery layer or the service; the
delivery layer imports the engine but neither the service nor gRPC; the client never imports the
server; ``zephon_wire`` (shared by both sides) imports numpy and the standard library only; the
server's layers import downwards only (engine < runtime, delivery < service < command line),
with no cycle, and the server needs the client only inside the ``zephon tail`` command.

The tests of the same topic that need a subprocess, worker processes, a socket or a real
file system limit are in ``tests/service/test_boundaries.py``.
"""

from __future__ import annotations

import ast
import sys
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


# --------------------------------------------------------------------------------------------
# the server's layers (every import, also those inside functions, relative ones resolved)
# --------------------------------------------------------------------------------------------

SERVER = ROOT / "server" / "zephon_server"


def module_of(path: Path, package_dir: Path) -> str:
    """``zephon_server.service.server`` for ``.../zephon_server/service/server.py``."""
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package_dir: Path) -> list[tuple[str, str, str]]:
    """``(module, imported module, enclosing function or "")`` for every import under
    ``package_dir``, relative imports resolved to absolute names."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module = module_of(path, package_dir)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        for func, node in _walk(tree, ""):
            if isinstance(node, ast.Import):
                found += [(module, alias.name, func) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    name = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    name = node.module or ""
                found.append((module, name, func))
                # ``from . import x`` imports the module ``x`` too (when it is one)
                found += [
                    (module, f"{name}.{alias.name}", func)
                    for alias in node.names
                    if _is_module(package_dir.parent, f"{name}.{alias.name}")
                ]
    return found


def _is_module(root: Path, name: str) -> bool:
    where = root.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _walk(node: ast.AST, func: str):
    for child in ast.iter_child_nodes(node):
        inner = func
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = f"{func}.{child.name}" if func else child.name
        yield inner, child
        yield from _walk(child, inner)


def unit(module: str) -> str:
    """The layer unit a server module belongs to: ``engine``, ``runtime``, ``service``, or a
    top-level module of the package (``cli``, ``serve_flags``, ...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


LOWER = {
    # unit: the units of zephon_server it may import
    "engine": {"engine"},
    "runtime": {"runtime", "engine"},
    "delivery": {"delivery", "engine"},
    "service": {"service", "delivery", "engine", "runtime", "stop_signals", "zephon_server"},
}
"""What the lower layers may import; the command-line modules above them may import them all."""


def layer_offenders(found: list[tuple[str, str, str]]) -> list[str]:
    bad = []
    for module, name, func in found:
        if not name.startswith("zephon_server."):
            continue
        here, there = unit(module), unit(name)
        if here in LOWER and there not in LOWER[here]:
            bad.append(f"{module} ({func or 'top level'}): imports {name}")
    return bad


def cycles(found: list[tuple[str, str, str]]) -> list[list[str]]:
    """The cycles between units (each a list of units, the first repeated last)."""
    edges: dict[str, set[str]] = {}
    for module, name, _ in found:
        if name.startswith("zephon_server.") and unit(module) != unit(name):
            edges.setdefault(unit(module), set()).add(unit(name))
    out, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                out.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return out


def test_the_server_layers_import_downwards_only():
    found = imports(SERVER)
    assert {unit(m) for m, _, _ in found} >= {"engine", "runtime", "delivery", "service", "cli"}
    assert layer_offenders(found) == []


def test_the_server_has_no_import_cycle_between_its_parts():
    # e.g. service/server.py importing cli (parse_lanes) while cli imports the service
    assert cycles(imports(SERVER)) == []


def test_the_server_uses_the_client_only_to_print_batches_as_tail_does():
    found = imports(SERVER)
    uses = {(m, f) for m, name, f in found if name.split(".")[0] == "zephon_client"}
    assert uses == {
        ("zephon_server.cli", "cmd_tail"),
        ("zephon_server.cli", "_tail_connection_arguments"),
        ("zephon_server.cli", "_decoded_printer"),  # dump --format decoded prints as tail
    }


def test_the_layer_checks_catch_a_cycle_and_a_climb():
    found = [
        ("zephon_server.service.server", "zephon_server.cli", "Server.__init__"),
        ("zephon_server.cli", "zephon_server.service.server", "cmd_serve"),
        ("zephon_server.engine.runners.processes", "zephon_server.runtime.gc_policy", ""),
    ]
    assert cycles(found) == [["cli", "service", "cli"]]
    assert layer_offenders(found) == [
        "zephon_server.service.server (Server.__init__): imports zephon_server.cli",
        "zephon_server.engine.runners.processes (top level): imports "
        "zephon_server.runtime.gc_policy",
    ]


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


def test_wire_module_needs_numpy_and_the_standard_library_only():
    """``zephon_wire`` is shared by the server's engine and the client: it imports neither,
    nor gRPC or protobuf."""

    wire = ROOT / "client" / "zephon_wire"
    assert wire.is_dir()
    for file, names in imported_modules(wire).items():
        for name in names:
            top = name.split(".")[0]
            assert top == "numpy" or top in sys.stdlib_module_names, f"{file}: imports {name}"
