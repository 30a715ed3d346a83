"""The house keeps its shape: rooms import one way (the import-linter contract in pyproject.toml, drawn in
docs/architecture.md), no module imports itself back through others, and every module is in the map."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bulkrelay"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every bulkrelay module `path` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bulkrelay"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("bulkrelay"))
    return {name for name in found if name in modules}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle between modules (a package's own `__init__` re-exports aside), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if node.startswith(nxt + "."):  # a module naming its own package: the package's face
                continue
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_rooms_import_one_way() -> None:
    command = [
        sys.executable,
        "-c",
        "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())",
    ]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_no_module_imports_itself_back() -> None:
    assert _cycle(_graph()) is None


def test_a_cycle_would_be_found() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_is_in_the_architecture_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__main__.py"
        and (path.name != "__init__.py" or path.parent.name == "transport")  # a room's face says its own
        and f"`{path.relative_to(PACKAGE)}`" not in text
    ]
    assert missing == []


def test_ops_enters_the_sync_room_by_its_face() -> None:
    """`ops/` (and every room above) imports `bulkrelay.sync`, never one of its modules: the room's
    entry points stay in one place, `sync/__init__.py`."""
    graph = _graph()
    reached = {
        (name, target)
        for name, targets in graph.items()
        if not name.startswith("bulkrelay.sync")
        for target in targets
        if target.startswith("bulkrelay.sync.")
    }
    assert reached == set()


def test_every_name_of_the_sync_face_resolves_to_its_module() -> None:
    """The face loads its entry points at their first use (sync/__init__.py): each name it lists is
    found, in the module its TYPE_CHECKING import names (what mypy reads), and it lists no other."""
    import bulkrelay.sync as face

    source = ast.parse(Path(face.__file__).read_text())
    typed = {
        alias.name: node.module
        for node in ast.walk(source)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bulkrelay.sync.")
        for alias in node.names
    }
    assert sorted(typed) == sorted(face.__all__)
    for name in face.__all__:
        assert getattr(face, name).__module__.startswith("bulkrelay.sync."), name
        assert getattr(face, name).__module__ == typed[name], name


# ------------------------------------------------------------------ the tests' own shape

TESTS = ROOT / "tests"
BENCHMARKS = ROOT / "benchmarks"


def _named_modules(source: str) -> set[str]:
    """Every module an import in `source` names, at the top or inside a function: `from a.b import c`
    names `a.b` and `a.b.c` (c may be a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _test_modules_named(source: str) -> set[str]:
    """The test modules (`tests...test_*`) among the modules `source` imports."""
    named = _named_modules(source)
    return {name for name in named if name.startswith("tests.") and _is_test_module(name)}


def _is_test_module(name: str) -> bool:
    return name.rpartition(".")[2].startswith("test_")


def test_no_test_module_imports_another() -> None:
    """What tests share lives in helper modules (tests/*.py, tests/<room>/*.py not named test_*) and
    fixtures in conftest.py: a test module imported by another runs its tests' module-level code twice
    and hides a helper where nobody looks for one (CONTRIBUTING.md)."""
    reached = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in _test_modules_named(path.read_text())
    }
    assert reached == set()


def test_benchmarks_never_import_the_tests() -> None:
    """Benchmarks measure the product: what they need of a server is the product's own
    (`python -m bulkrelay.demo.target`, benchmarks/servers.py), never the tests' helpers."""
    reached = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(BENCHMARKS.rglob("*.py"))
        for name in _named_modules(path.read_text())
        if name == "tests" or name.startswith("tests.")
    }
    assert reached == set()


def test_an_import_of_a_test_module_would_be_found() -> None:
    assert _test_modules_named("from tests.ops.test_resume import resume") == {"tests.ops.test_resume"}
    assert _test_modules_named("def f():\n    from tests.ops import test_crash") == {"tests.ops.test_crash"}
    assert _test_modules_named("import tests.sync.test_delta") == {"tests.sync.test_delta"}
    assert _test_modules_named("from tests.runsteps import resume\nfrom tests import jobfiles") == set()
