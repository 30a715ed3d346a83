"""The fast lane (`uv run pytest -m "not slow"`) holds no real-process test: a test that starts processes
(the CLI, the target, redis-server, Chromium), itself or through a helper or fixture of its module, is
marked `slow`, test by test or for its whole module. Without this
check, one new module that forgets the mark makes the lane run for minutes."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# What a test module imports when it starts real processes.
_PROCESS_STARTERS = {
    "subprocess",
    "tests.clirun",
    "tests.targetproc",
    "tests.redisproc",
    "tests.pgproc",
    "tests.chromium",
}
# Modules that use subprocess for a quick, in-process-like tool (import-linter's one call).
_FAST_ALTHOUGH_THEY_SPAWN = {"test_architecture.py", "test_fast_lane.py"}


def _process_names(tree: ast.Module) -> set[str]:
    """The names in a module that start processes: those imported from a process-starting module, and,
    to a fixed point, the module's own functions, classes and fixtures that use one of them."""
    names = {"subprocess"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in _PROCESS_STARTERS:
            names.update(alias.asname or alias.name for alias in node.names)
    local = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    grew = True
    while grew:
        grew = False
        for node in local:
            if node.name not in names and _uses(node, names):
                names.add(node.name)
                grew = True
    return names


def _uses(node: ast.AST, names: set[str]) -> bool:
    """`node` mentions one of `names`, or takes one as an argument (a fixture)."""
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    used |= {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)}
    return bool(used & names)


def _marked_slow(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def _module_marked_slow(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
        and _marked_slow(node.value)
        for node in tree.body
    )


def _unmarked_process_tests(tree: ast.Module) -> list[str]:
    """Test functions (top level or in classes) that start processes and carry no slow mark."""
    starters = _process_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test"):
            continue
        if _uses(node, starters) and not any(_marked_slow(d) for d in node.decorator_list):
            found.append(node.name)
    return found


def test_every_process_starting_test_is_outside_the_fast_lane() -> None:
    offenders: list[str] = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.name in _FAST_ALTHOUGH_THEY_SPAWN:
            continue
        tree = ast.parse(path.read_text())
        if _module_marked_slow(tree):
            continue
        where = path.relative_to(TESTS.parent)
        offenders.extend(f"{where}::{name}" for name in _unmarked_process_tests(tree))
    assert not offenders, "real-process tests without @pytest.mark.slow:\n" + "\n".join(offenders)
