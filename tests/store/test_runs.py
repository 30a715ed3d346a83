"""One place finds runs (bulkrelay.store.runs): every command agrees on what runs a runs directory holds,
the public alpha's run beside ours included."""

from __future__ import annotations

import ast
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.rundir import RunDir, RunState
from tests.alpharuns import write_alpha_run
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.runplans import run_plan
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
    assert [row["run_id"] for row in listed.data["runs"]] == [
        second.data["run_id"],
        first.data["run_id"],
        alpha.name,  # made on 2026-10-01: the oldest
    ]
    pruned = run_cli("prune", "--runs-dir", runs, "--keep", "1", cwd=tmp_path)
    assert pruned.exit_code == ExitCode.SUCCESS, pruned.envelope
    # Never the alpha's, never the newest, and not night 1 either: night 2 sent nothing, so every key's
    # entry in the sync state still points at night 1's journal (docs/delta.md, the sync state).
    assert pruned.data["removed"] == []
    (kept,) = [w for w in pruned.envelope["warnings"] if w["code"] == "KEPT_FOR_SYNC_STATE"]
    assert first.data["run_id"] in kept["context"]["runs"]
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
    assert users == {"store/runs.py"}


def _made_at(runs: Path, stamp: datetime, *, mirror_deletes: bool = False) -> RunDir:
    """A completed run of no rows, made at `stamp`, with the summary every completed run has."""
    run = RunDir.create(runs, run_plan("/jobs/a.yaml", name="a", mirror_deletes=mirror_deletes))
    created = stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    (run.path / "summary.json").write_text('{"by_outcome": {"succeeded": 0, "failed": 0}}')
    run.save(replace(run.manifest, state=RunState.COMPLETED, created_at=created))
    return run


def _two_runs_in_one_second(runs: Path) -> tuple[RunDir, RunDir]:
    """(older, newer), made in the same second, the older with the greater id: id order is wrong."""
    second = datetime(2026, 12, 1, 3, 0, 0, tzinfo=UTC)
    first, other = _made_at(runs, second), _made_at(runs, second)
    high, low = sorted((first, other), key=lambda run: run.run_id, reverse=True)
    for run, micro in ((high, 1), (low, 2)):
        stamp = second.replace(microsecond=micro).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        run.save(replace(run.manifest, created_at=stamp))
    return high, low


def test_runs_lists_newest_first_by_creation_and_its_top_row_is_latest(tmp_path: Path) -> None:
    """Before, `runs` sorted by run id: two runs of one second came out in the order of their random ids."""
    runs = tmp_path / "runs"
    older, newer = _two_runs_in_one_second(runs)
    listed = run_cli("runs", "--runs-dir", runs, cwd=tmp_path)
    assert [row["run_id"] for row in listed.data["runs"]] == [newer.run_id, older.run_id]
    latest = run_cli("status", "latest", "--runs-dir", runs, cwd=tmp_path)
    assert latest.data["run_id"] == listed.data["runs"][0]["run_id"] == newer.run_id


def test_dot_slash_latest_is_the_directory_and_latest_the_newest_run(tmp_path: Path) -> None:
    """Before, `./latest` was read as a Path, which is `latest`: the newest run, not the directory."""
    runs = tmp_path / "runs"
    older, newer = _two_runs_in_one_second(runs)
    older.path.rename(tmp_path / "latest")  # a run directory that happens to be called `latest`
    by_path = run_cli("status", "./latest", "--runs-dir", runs, cwd=tmp_path)
    assert by_path.data["run_id"] == older.run_id, by_path.envelope
    by_name = run_cli("status", "latest", "--runs-dir", runs, cwd=tmp_path)
    assert by_name.data["run_id"] == newer.run_id, by_name.envelope


def test_runs_lists_a_run_linked_beside_itself_once(tmp_path: Path) -> None:
    """Before, a symbolic link to a run directory in the same runs directory listed the run twice."""
    runs = tmp_path / "runs"
    older, newer = _two_runs_in_one_second(runs)
    (runs / "nightly-latest").symlink_to(newer.path)
    moved = tmp_path / "archive" / older.run_id
    moved.parent.mkdir()
    older.path.rename(moved)
    (runs / older.run_id).symlink_to(moved)  # a run kept elsewhere, linked in: listed, once
    listed = run_cli("runs", "--runs-dir", runs, cwd=tmp_path)
    assert [row["run_id"] for row in listed.data["runs"]] == [newer.run_id, older.run_id]
    assert listed.data["runs"][0]["run_dir"] == str(newer.path)
