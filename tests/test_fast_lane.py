"""The fast lane (`uv run pytest -m "not slow"`) holds no real-process test: a test that starts processes
(the CLI, the target, redis-server, Chromium), itself or through a helper module, a fixture of
conftest.py or a helper or fixture of its module, is marked `slow`, test by test or for its whole
module. Without this check, one new module that forgets the mark makes the lane run for minutes."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# A server started once per test session and shared (the `postgres` fixture): its tests stay in the lane.
_STARTED_ONCE = {"tests.pgserver"}
# Modules that use subprocess for a quick, in-process-like tool (import-linter's one call).
_FAST_ALTHOUGH_THEY_SPAWN = {"test_architecture.py", "test_fast_lane.py"}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)


def _process_starters() -> dict[str, set[str]]:
    """For each module whose names start processes, those names: every name of subprocess ("*"), and,
    to a fixed point, the functions and classes of the helper modules of tests/ (tests/*.py,
    tests/<room>/*.py) that use one (tests/clirun.py's `run_cli`, tests/targetproc.py's `TargetProcess`)."""
    helpers = {
        _module_name(path): ast.parse(path.read_text())
        for path in TESTS.rglob("*.py")
        if not path.name.startswith("test_") and path.name not in ("conftest.py", "__init__.py")
    }
    starters: dict[str, set[str]] = {"subprocess": {"*"}}
    grew = True
    while grew:
        grew = False
        for name, tree in helpers.items():
            if name in _STARTED_ONCE:
                continue
            names = _process_names(tree, starters, set()) - {"subprocess"}
            if names and names != starters.get(name):
                starters[name] = names
                grew = True
    return starters


def _conftest_fixtures(starters: dict[str, set[str]]) -> dict[Path, set[str]]:
    """For each conftest.py's folder, its fixtures that start processes (`target`)."""
    found: dict[Path, set[str]] = {}
    for path in TESTS.rglob("conftest.py"):
        tree = ast.parse(path.read_text())
        fixtures = {
            node.name for node in tree.body if isinstance(node, ast.FunctionDef) and _is_fixture(node)
        }
        found[path.parent] = fixtures & _process_names(tree, starters, set())
    return found


def _is_fixture(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        "fixture" in ast.unparse(decorator) for decorator in node.decorator_list
    )


def _process_names(tree: ast.Module, starters: dict[str, set[str]], fixtures: set[str]) -> set[str]:
    """The names in a module that start processes: those imported from a process-starting module, and,
    to a fixed point, the module's own functions, classes and fixtures that use one of them or take one
    of the process-starting `fixtures` of conftest.py as an argument."""
    names = {"subprocess"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in starters:
            started = starters[node.module]
            names.update(a.asname or a.name for a in node.names if "*" in started or a.name in started)
    local = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    grew = True
    while grew:
        grew = False
        for node in local:
            if node.name not in names and _uses(node, names, fixtures):
                names.add(node.name)
                grew = True
    return names


def _uses(node: ast.AST, names: set[str], fixtures: set[str]) -> bool:
    """`node` mentions one of `names` or takes one as an argument, or, a function, takes one of
    `fixtures` as its own argument."""
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    used |= {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)}
    own = set()
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        own = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
    return bool(used & names or own & fixtures)


def _marked_slow(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def _module_marked_slow(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
        and _marked_slow(node.value)
        for node in tree.body
    )


def _unmarked_process_tests(
    tree: ast.Module, starters: dict[str, set[str]], inherited: set[str]
) -> list[str]:
    """Test functions (top level or in classes) that start processes and carry no slow mark; `inherited`
    are the process-starting fixtures of conftest.py that the module does not define itself."""
    own = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    fixtures = inherited - own
    names = _process_names(tree, starters, fixtures)
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test"):
            continue
        if _uses(node, names, fixtures) and not any(_marked_slow(d) for d in node.decorator_list):
            found.append(node.name)
    return found


def test_every_process_starting_test_is_outside_the_fast_lane() -> None:
    starters = _process_starters()
    fixtures = _conftest_fixtures(starters)
    offenders: list[str] = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.name in _FAST_ALTHOUGH_THEY_SPAWN:
            continue
        tree = ast.parse(path.read_text())
        if _module_marked_slow(tree):
            continue
        where = path.relative_to(TESTS.parent)
        inherited = {
            name for folder, names in fixtures.items() if path.is_relative_to(folder) for name in names
        }
        offenders.extend(f"{where}::{name}" for name in _unmarked_process_tests(tree, starters, inherited))
    assert not offenders, "real-process tests without @pytest.mark.slow:\n" + "\n".join(offenders)


def test_the_helpers_and_fixtures_that_start_processes_are_known() -> None:
    """The guard sees through helper modules and conftest.py, or a test using only them would pass it."""
    starters = _process_starters()
    assert {"run_cli", "CliResult"} & starters["tests.clirun"] == {"run_cli"}
    assert {"run_job", "write_job"} & starters["tests.taggedjobs"] == {"run_job"}
    assert "TargetProcess" in starters["tests.targetproc"] and "start_run" in starters["tests.spawnedruns"]
    assert "tests.jobfiles" not in starters and "tests.pgserver" not in starters
    fixtures = _conftest_fixtures(starters)[TESTS]
    assert "target" in fixtures and "postgres" not in fixtures
