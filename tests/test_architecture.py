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
