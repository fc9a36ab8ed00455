"""The public API is one module: it exports exactly the names docs/api.md documents, each with a
docstring of its own, and the custom-operator page and the examples import nothing else."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
from pathlib import Path

import pytest

import zephon_server.api as api

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = "zephon_server.api"
TABLE_ROW = re.compile(r"^\| `(?P<name>[A-Za-z_][A-Za-z0-9_]*)` \|")
PYTHON_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.M | re.S)


def documented_names() -> list[str]:
    """The first-column names of the tables in docs/api.md."""
    text = (ROOT / "docs" / "api.md").read_text()
    return [m["name"] for line in text.splitlines() if (m := TABLE_ROW.match(line))]


def server_imports(source: str, where: str) -> list[str]:
    """Every module under ``zephon_server`` that ``source`` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "zephon_server"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] if node.module.split(".")[0] == "zephon_server" else []
    return found


def test_module_exports_exactly_the_documented_names():
    documented = documented_names()
    assert len(documented) == len(set(documented)), "a name is documented twice"
    assert sorted(documented) == sorted(api.__all__)
    # Nothing public by accident: every public attribute of the module is in __all__.
    public = {
        name
        for name, value in vars(api).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    public.discard("annotations")  # from __future__
    assert public == set(api.__all__)


@pytest.mark.parametrize("name", api.__all__)
def test_every_public_name_has_its_own_docstring(name):
    obj = getattr(api, name)
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
    assert doc and doc.strip(), f"{name} has no docstring of its own"
    # A dataclass without one gets its signature as __doc__: not a docstring.
    assert not doc.startswith(f"{name}("), f"{name} has only the generated dataclass docstring"


def test_module_docstring_says_everything_else_is_internal():
    assert "internal" in api.__doc__


def test_the_names_are_the_engine_objects_not_copies():
    from zephon_server.engine.ops.base import Operator
    from zephon_server.engine.pipeline import Pipeline

    assert api.Operator is Operator and api.Pipeline is Pipeline


def test_checker_finds_internal_imports():
    source = (
        "import zephon_server.engine\ndef f():\n    from zephon_server.engine.ops import Batch\n"
    )
    assert server_imports(source, "x.py") == ["zephon_server.engine", "zephon_server.engine.ops"]


def test_custom_operator_page_imports_only_the_public_module():
    text = (ROOT / "docs" / "custom-operators.md").read_text()
    blocks = PYTHON_BLOCK.findall(text)
    assert any("from zephon_server.api import" in b for b in blocks)
    # Indented snippets (a method shown alone) are dedented before parsing.
    imported = [m for b in blocks for m in server_imports(textwrap.dedent(b), "page")]
    assert imported and set(imported) == {PUBLIC}


def test_examples_import_only_the_public_modules():
    files = sorted((ROOT / "examples").glob("*.py"))
    assert files
    offenders = {
        f"{path.name}: {module}"
        for path in files
        for module in server_imports(path.read_text(), str(path))
        if module != PUBLIC
    }
    assert offenders == set()
    # The trainer side imports the client package itself, not its modules.
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zephon_client"):
                assert node.module == "zephon_client", f"{path.name}: {node.module}"
