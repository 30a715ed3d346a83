"""One place finds runs (bulkrelay.ops.runref): every command agrees on what runs a runs directory holds,
the public alpha's run beside ours included."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.ops.test_alpha_migration import write_alpha_run
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

PACKAGE = Path(__file__).resolve().parents[2] / "bulkrelay"
DELTA: dict[str, Any] = {"input": {"key": "id"}, "execution": {"concurrency": 2, "sync": "delta"}}


def test_a_delta_job_latest_prune_and_runs_agree_beside_an_alpha_run(tmp_path: Path) -> None:
    """Before, a delta job's earlier runs were listed with the alpha's among them: KeyError 'job_path'."""
    runs = tmp_path / "runs"
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=5, **DELTA)
        alpha = write_alpha_run(runs, job)
        first = run_cli("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
        second = run_cli("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
    assert first.exit_code == ExitCode.SUCCESS, first.envelope
    assert second.exit_code == ExitCode.SUCCESS, second.envelope
    assert second.data["summary"]["skipped_unchanged"] == 5  # night 2 read night 1 through the state

    latest = run_cli("status", "latest", "--runs-dir", runs, cwd=tmp_path)
    assert latest.data["run_id"] == second.data["run_id"], latest.envelope
    listed = run_cli("runs", "--runs-dir", runs, cwd=tmp_path)
    assert [row["run_id"] for row in listed.data["runs"]] == sorted(
        [first.data["run_id"], second.data["run_id"], alpha.name], reverse=True
    )
    pruned = run_cli("prune", "--runs-dir", runs, "--keep", "1", cwd=tmp_path)
    assert pruned.exit_code == ExitCode.SUCCESS, pruned.envelope
    assert pruned.data["removed"] == [first.data["run_id"]]  # never the alpha's, never the newest
    assert alpha.is_dir() and Path(second.data["run_dir"]).is_dir()


def _names_imported_from(module: str) -> dict[str, set[str]]:
    """For each module of the package, the names it imports from `module`."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                found.setdefault(str(path.relative_to(PACKAGE)), set()).update(a.name for a in node.names)
    return found


def test_only_runref_opens_a_runs_directory_s_entries() -> None:
    """What tells a run directory (its `run.json`) and opens any run, alpha or ours, has one user."""
    finders = {"MANIFEST", "open_listed"}
    imported = _names_imported_from("bulkrelay.store.rundir")
    users = {module for module, names in imported.items() if names & finders}
    assert users == {"ops/runref.py"}
