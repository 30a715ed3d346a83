"""The fast lane (`uv run pytest -m "not slow"`) holds no real-process test: a test module that starts
processes (the CLI, the target, redis-server) is marked `slow` as a whole or test by test. Without this
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


def _imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _marked_slow(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def _module_marked_slow(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
        and _marked_slow(node.value)
        for node in tree.body
    )


def _unmarked_tests(tree: ast.Module) -> list[str]:
    """Test functions (top level or in classes) that carry no slow mark of their own."""
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test"):
            continue
        if not any(_marked_slow(decorator) for decorator in node.decorator_list):
            found.append(node.name)
    return found


def test_every_process_starting_module_is_outside_the_fast_lane() -> None:
    offenders: list[str] = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.name in _FAST_ALTHOUGH_THEY_SPAWN:
            continue
        tree = ast.parse(path.read_text())
        if not _imported(tree) & _PROCESS_STARTERS or _module_marked_slow(tree):
            continue
        offenders.extend(f"{path.relative_to(TESTS.parent)}::{name}" for name in _unmarked_tests(tree))
    assert not offenders, "real-process tests without @pytest.mark.slow:\n" + "\n".join(offenders)
