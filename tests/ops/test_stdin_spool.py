"""`run --input -` keeps what was piped to it when its spool and its run (or job) are on two file systems.

The spool is made in the tree of its final home (`<runs-dir>/.spool/`, the state dir's `jobs/.spool/`), so
taking it is a rename; a `.spool` that is a link (or a mount) to another file system makes that rename
fail with EXDEV, and the spool is then copied durably instead. These tests make that real: `.spool`
links to a directory on tmpfs while the runs and the state stay on the test's disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.private import make_private_dir
from tests.clirun import cli_env, run_cli
from tests.jobfiles import write_job
from tests.runsteps import assert_each_row_once, sent_ids
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

ROWS = 20


def _spool_elsewhere(home: Path, elsewhere: Path) -> None:
    make_private_dir(home)
    (home / ".spool").symlink_to(elsewhere, target_is_directory=True)


def test_a_run_keeps_stdin_spooled_on_another_file_system_and_its_identical_rerun_too(
    tmp_path: Path, other_file_system: Path
) -> None:
    runs = tmp_path / "runs"
    _spool_elsewhere(runs, other_file_system)
    with TargetProcess({"rules": [{"match": {"path_contains": "/items/7"}, "status": 401}]}) as target:
        job = write_job(tmp_path, target.url, rows=ROWS)
        data = (tmp_path / "data.csv").read_bytes()
        run = ("run", job, "--input", "-", "--runs-dir", runs, "--budget", "0")

        halted = run_cli(*run, cwd=tmp_path, stdin=data)  # the spool moves into the new run
        assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
        assert (Path(halted.data["run_dir"]) / "input.csv").read_bytes() == data

        target.set_plan({})
        again = run_cli(*run, cwd=tmp_path, stdin=data)  # the new spool replaces the run's copy
        assert again.exit_code == ExitCode.SUCCESS, again.envelope
        assert again.data["run_id"] == halted.data["run_id"]
        assert_each_row_once(again.data["run_dir"], ROWS)
        assert sorted(sent_ids(target), key=int) == [str(n) for n in range(1, ROWS + 1)]
    assert (Path(again.data["run_dir"]) / "input.csv").read_bytes() == data
    assert list(other_file_system.iterdir()) == []  # nothing from stdin outlives the command


def test_a_budgeted_run_keeps_stdin_spooled_on_another_file_system(
    tmp_path: Path, other_file_system: Path
) -> None:
    state = tmp_path / "state"
    _spool_elsewhere(state / "jobs", other_file_system)
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=ROWS)
        data = (tmp_path / "data.csv").read_bytes()
        result = run_cli(
            *("run", job, "--input", "-", "--runs-dir", tmp_path / "runs", "--budget", "120s"),
            cwd=tmp_path,
            stdin=data,
            env=cli_env(BULKRELAY_STATE_DIR=str(state)),
        )
        assert result.exit_code == ExitCode.SUCCESS, result.envelope
        assert len(sent_ids(target)) == ROWS
    assert (state / "jobs" / result.envelope["meta"]["job_id"] / "stdin").read_bytes() == data
    assert list(other_file_system.iterdir()) == []
