"""The identical re-run (docs/resume.md): running the same command again continues its unfinished run,
starts over with CHECKPOINT_DISCARDED when the input or config changed, and starts fresh after a
completed run; `--idempotency-key` and the stdin digest are part of what makes two calls identical."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.ops.results import RunResult
from bulkrelay.relay.progress import CallbackReporter, Snapshot
from bulkrelay.store.checkpoint import read_checkpoint
from tests.clirun import CliResult, start_cli
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runsteps import (
    ROWS,
    SLOW,
    assert_each_row_once,
    rewrite_job,
    run_here,
    run_job,
    run_job_stdin,
    sent_ids,
    stop_midway,
)
from tests.spawnedruns import wait_for_lock
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = [pytest.mark.slow, pytest.mark.target_plan(SLOW)]


def _runs(cwd: Path) -> list[Path]:
    root = cwd / ".bulkrelay" / "runs"
    return sorted(path for path in root.iterdir() if (path / "run.json").is_file())


def test_the_identical_run_continues_its_stopped_run(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    stopped = stop_midway(tmp_path, job)

    again = run_job(tmp_path, job)

    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_id"] == stopped.data["run_id"]
    assert again.envelope["warnings"] == []
    assert again.data["summary"]["this_call"]["rows_committed"] == ROWS - stopped.data["progress"]["done"]
    assert_each_row_once(again.data["run_dir"], ROWS)
    assert set(sent_ids(target).values()) == {1}  # no committed row was sent twice
    assert len(sent_ids(target)) == ROWS
    assert _runs(tmp_path) == [Path(again.data["run_dir"])]


def test_a_run_stopped_by_sigint_continues_on_the_identical_run(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    target.set_plan({"rules": [{"delay_ms": 50}]})  # slow enough that SIGINT lands midway
    proc = start_cli("run", job, "--budget", "0", cwd=tmp_path)
    runs_root = tmp_path / ".bulkrelay" / "runs"
    while not runs_root.is_dir() or not _runs(tmp_path):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    run_dir = _runs(tmp_path)[0]
    wait_for_lock(run_dir, proc)
    while sum(sent_ids(target).values()) < 20:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=HANG_S)
    assert proc.returncode == ExitCode.SIGINT
    checkpoint = read_checkpoint(run_dir)
    assert checkpoint is not None and 0 < checkpoint.rows_done < ROWS

    again = run_job(tmp_path, job)

    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert Path(again.data["run_dir"]) == run_dir
    assert_each_row_once(run_dir, ROWS)
    assert set(sent_ids(target).values()) == {1}


def test_the_first_progress_of_a_continued_run_is_not_below_its_checkpoint(
    tmp_path: Path, target: TargetProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    checkpoint = read_checkpoint(run_dir)
    assert checkpoint is not None
    snapshots: list[Snapshot] = []
    monkeypatch.chdir(tmp_path)  # the same working directory: the same invocation, in-process

    result = run_here(job, reporter=CallbackReporter(snapshots.append))

    assert result.exit_code == ExitCode.SUCCESS
    assert isinstance(result.data, RunResult) and result.data.run_id == run_dir.name
    assert snapshots[0].done >= checkpoint.rows_done > 0
    assert [s.done for s in snapshots] == sorted(s.done for s in snapshots)
    assert snapshots[-1].done == ROWS


def test_a_changed_input_starts_over_with_checkpoint_discarded(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    stopped = stop_midway(tmp_path, job)
    write_csv(tmp_path / "data.csv", make_rows(ROWS, tag="-v2"))

    again = run_job(tmp_path, job)

    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_id"] != stopped.data["run_id"]
    [warning] = again.envelope["warnings"]
    assert warning["code"] == "CHECKPOINT_DISCARDED"
    assert warning["context"] == {"previous_run": stopped.data["run_id"], "reason": "INPUT_CHANGED"}
    assert "input changed" in warning["message"] and "sha256" in warning["message"]
    assert "started over" in warning["message"]
    assert_each_row_once(again.data["run_dir"], ROWS)
    assert again.data["summary"]["this_call"]["rows_committed"] == ROWS


def test_a_changed_config_starts_over_with_checkpoint_discarded(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    stopped = stop_midway(tmp_path, job)
    rewrite_job(job, retry={"max_attempts": 2})

    again = run_job(tmp_path, job)

    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_id"] != stopped.data["run_id"]
    [warning] = again.envelope["warnings"]
    assert warning["code"] == "CHECKPOINT_DISCARDED"
    assert warning["context"]["reason"] == "CONFIG_CHANGED"
    assert "retry" in warning["message"]


def test_after_a_completed_run_the_identical_run_starts_fresh(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=30)
    first = run_job(tmp_path, job)
    assert first.exit_code == ExitCode.SUCCESS

    second = run_job(tmp_path, job)

    assert second.exit_code == ExitCode.SUCCESS
    assert second.data["run_id"] != first.data["run_id"]
    assert second.envelope["warnings"] == []
    assert second.data["summary"]["this_call"]["rows_committed"] == 30
    assert set(sent_ids(target).values()) == {2}  # a fresh run sends every row again


def test_the_idempotency_key_flag_tells_invocations_apart(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    first = stop_midway(tmp_path, job, "--idempotency-key", "batch-1")

    other = run_job(tmp_path, job, "--idempotency-key", "batch-2")
    assert other.exit_code == ExitCode.SUCCESS
    assert other.data["run_id"] != first.data["run_id"]
    assert other.data["summary"]["this_call"]["rows_committed"] == ROWS

    same = run_job(tmp_path, job, "--idempotency-key", "batch-1")
    assert same.exit_code == ExitCode.SUCCESS
    assert same.data["run_id"] == first.data["run_id"]
    assert same.data["summary"]["this_call"]["rows_committed"] == ROWS - first.data["progress"]["done"]


def test_stdin_input_identical_rerun_continues_and_other_bytes_start_fresh(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS)
    data = (tmp_path / "data.csv").read_bytes()
    stopped = stop_midway_stdin(tmp_path, job, data)

    again = run_job_stdin(tmp_path, job, data)
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_id"] == stopped.data["run_id"]
    assert_each_row_once(again.data["run_dir"], ROWS)
    assert set(sent_ids(target).values()) == {1}
    assert not list((tmp_path / ".bulkrelay" / "runs" / ".spool").glob("stdin-*"))  # no spool left behind

    other = write_csv(tmp_path / "other.csv", make_rows(ROWS, tag="-b")).read_bytes()
    fresh = run_job_stdin(tmp_path, job, other)
    assert fresh.exit_code == ExitCode.SUCCESS
    assert fresh.data["run_id"] != stopped.data["run_id"]


def stop_midway_stdin(cwd: Path, job: Path, data: bytes) -> CliResult:
    result = run_job_stdin(cwd, job, data, "--timeout", "150ms")
    assert result.exit_code == ExitCode.TIMEOUT, result.envelope
    return result
