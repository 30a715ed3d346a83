"""A removal that fails midway is a `PRUNE_FAILED` warning naming the run and why, and prune goes on:
`data.removed` lists exactly the runs that went (docs/commands.md, prune). The failure is a real one: a
file in the run directory that cannot be unlinked (immutable as root, which ignores permissions; in a
read-only folder otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.rundir import RunDir, RunState
from tests.clirun import run_cli
from tests.runplans import run_plan

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def _finished_run(runs: Path, days_old: float) -> RunDir:
    run = RunDir.create(runs, run_plan("/jobs/a.yaml", name="a"))
    created = datetime.now(UTC) - timedelta(days=days_old)
    run.save(
        replace(run.manifest, state=RunState.COMPLETED, created_at=created.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    )
    return run


@contextmanager
def _unremovable(run: RunDir) -> Iterator[Path]:
    """A file in `run` that no one can remove while the block runs; removable again after it."""
    folder = run.path / "kept"
    folder.mkdir()
    stuck = folder / "stuck"
    stuck.write_bytes(b"x")
    undo: list[str | Path]
    if os.geteuid() == 0:
        chattr = shutil.which("chattr")
        if chattr is None:
            pytest.skip("root ignores permissions, and chattr (e2fsprogs) is not installed")
        made = subprocess.run([chattr, "+i", stuck], capture_output=True, check=False)
        if made.returncode != 0:
            pytest.skip(f"this file system has no immutable files: {made.stderr.decode().strip()}")
        undo = [chattr, "-i", stuck]
    else:
        folder.chmod(0o555)
        undo = ["chmod", "0755", folder]
    try:
        yield stuck
    finally:
        subprocess.run(undo, check=True)


def test_a_removal_that_fails_is_a_warning_naming_the_run_and_the_others_still_go(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old = [_finished_run(runs, days_old=30 - n) for n in range(3)]
    newest = _finished_run(runs, days_old=1)
    with _unremovable(old[1]):
        answer = run_cli("prune", "--keep", "1", "--runs-dir", runs, cwd=tmp_path)
        assert answer.exit_code == ExitCode.SUCCESS, answer.envelope
        assert sorted(answer.data["removed"]) == sorted([old[0].run_id, old[2].run_id])
        assert answer.data["kept"] == 2  # the newest, and the one that would not go
        (failed,) = [w for w in answer.envelope["warnings"] if w["code"] == "PRUNE_FAILED"]
        assert failed["context"]["run_dir"] == str(old[1].path)
        assert "stuck" in failed["context"]["reason"] and str(old[1].path) in failed["message"]
        assert not old[0].path.exists() and not old[2].path.exists()
        assert old[1].path.is_dir() and newest.path.is_dir()
    again = run_cli("prune", "--keep", "1", "--runs-dir", runs, cwd=tmp_path)  # removable once more
    assert again.exit_code == ExitCode.SUCCESS and again.data["removed"] == [old[1].run_id], again.envelope
    assert {path.name for path in runs.iterdir() if path.is_dir()} == {newest.run_id}
