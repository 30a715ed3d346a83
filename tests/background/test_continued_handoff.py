"""A budget that runs out before the worker got going still says where a continued run stands
(REQ-C-035, issue 22 item 16): `run_dir` at once, and progress never below the run's checkpoint.

Real processes: a run halted by a 401 after 48 committed rows, then `run` (the identical invocation)
or `resume RUN_DIR` under a budget of 100 ms or 300 ms, against a target that now holds every answer.
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.rundir import is_locked
from tests.background.jobcli import env, worker_pid
from tests.clirun import CliResult, cli_env, run_cli, start_cli
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_S, wait_for

_COMMITTED = 48
# `job cancel` waits for the request in flight, and every answer after the halt is held: a short read
# timeout answers it in seconds (the default 30 s made each test wait half a minute).
_EXECUTION = {"concurrency": 1, "timeout": {"read_seconds": 2}}


def _cli(tmp_path: Path, *args: str | Path) -> CliResult:
    return run_cli(*args, cwd=tmp_path, env=cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state")))


def _handed_off(tmp_path: Path, call: tuple[str, Path, str], budget: str, done: int) -> dict[str, Any]:
    """`run JOB` or `resume RUN_DIR` under `budget`: handed off (14), naming the run and its progress."""
    command, job, run_dir = call
    argv = ("run", job) if command == "run" else ("resume", run_dir)
    handed_off = _cli(tmp_path, *argv, "--budget", budget)
    assert handed_off.exit_code == ExitCode.INCOMPLETE, handed_off.envelope
    data: dict[str, Any] = handed_off.data
    assert data["run_dir"] == run_dir, data
    assert data["progress"]["done"] >= done, data
    assert data["progress"]["total"] == 100, data
    return data


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["100ms", "300ms"])
@pytest.mark.parametrize("command", ["run", "resume"])
def test_a_hand_off_before_the_worker_starts_names_the_run_and_its_checkpointed_progress(
    tmp_path: Path, command: str, budget: str
) -> None:
    halt_after = {"rules": [{"after": _COMMITTED, "status": 401}]}
    with TargetProcess(halt_after) as target:
        job = write_job(tmp_path, target.url, rows=100, execution=_EXECUTION)
        halted = _cli(tmp_path, "run", job, "--budget", "0")
        assert halted.error_code == "TARGET_AUTH_FAILED", halted.envelope
        run_dir = halted.data["run_dir"]
        checkpoint = json.loads((Path(run_dir) / "checkpoint.json").read_text())
        assert checkpoint["rows_done"] == _COMMITTED

        # Every answer now takes longer than a hang's bound: the job cannot end within the budget.
        target.set_plan({"rules": [{"delay_ms": int(HANG_S * 1000)}]})
        data = _handed_off(tmp_path, (command, job, run_dir), budget, _COMMITTED)

        # `job status` says the same until the relay's own progress takes over (never lower).
        status = _cli(tmp_path, "job", "status", data["job_id"])
        assert status.data["run_dir"] == run_dir
        assert status.data["progress"]["done"] >= _COMMITTED
        cancelled = _cli(tmp_path, "job", "cancel", data["job_id"], "--budget", HANG_BUDGET)
        assert cancelled.exit_code == ExitCode.SUCCESS, cancelled.envelope


def _killed_midway(tmp_path: Path, target: TargetProcess, job: Path, how: str) -> tuple[str, int]:
    """A run killed with SIGKILL after its checkpoint holds `_COMMITTED` rows (every later answer is held):
    in the foreground (`--budget 0`), or as a background job's worker (the job is then JOB_LOST).
    Its run.json still says `running`. Returns its run directory and the checkpoint's rows done."""
    if how == "foreground":
        proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, env=env(tmp_path), output="discarded")
        pid = proc.pid
    else:
        handed = _cli(tmp_path, "run", job, "--budget", "1ms")
        assert handed.exit_code == ExitCode.INCOMPLETE, handed.envelope
        pid = wait_for(lambda: _worker_of(tmp_path, handed.data["job_id"]), "the worker's pid")
    runs = tmp_path / ".bulkrelay" / "runs"
    done = wait_for(lambda: _rows_done(runs), "the checkpoint to hold the rows answered")
    os.kill(pid, signal.SIGKILL)
    if how == "foreground":
        proc.wait()
    [run_dir] = [p for p in runs.iterdir() if (p / "run.json").is_file()]
    wait_for(lambda: not is_locked(run_dir), "the killed process's lock to go")
    assert json.loads((run_dir / "run.json").read_text())["state"] == "running"
    return str(run_dir), done


def _worker_of(tmp_path: Path, job_id: str) -> int | None:
    try:
        return worker_pid(tmp_path, job_id)
    except (FileNotFoundError, ValueError):
        return None


def _rows_done(runs: Path) -> int | None:
    for checkpoint in runs.glob("*/checkpoint.json"):
        with suppress(ValueError, OSError):
            done = json.loads(checkpoint.read_text())["rows_done"]
            if done >= _COMMITTED:
                return int(done)
    return None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "budget", "how"),
    [("run", "100ms", "foreground"), ("resume", "300ms", "foreground"), ("run", "1s", "worker")],
)
def test_after_a_kill_the_continuation_names_the_run_and_its_checkpointed_progress(
    tmp_path: Path, command: str, budget: str, how: str
) -> None:
    """Issue 38 item 9: after kill -9 (or a lost job) the run stays `running` with nobody holding it; the
    hand-off of its continuation said progress 0 of null and no run directory, since only runs stopped on
    purpose were named before the worker started."""
    held = {"rules": [{"after": _COMMITTED, "delay_ms": int(HANG_S * 1000)}]}
    with TargetProcess(held) as target:
        job = write_job(tmp_path, target.url, rows=100, execution=_EXECUTION)
        run_dir, done = _killed_midway(tmp_path, target, job, how)

        data = _handed_off(tmp_path, (command, job, run_dir), budget, done)
        cancelled = _cli(tmp_path, "job", "cancel", data["job_id"], "--budget", HANG_BUDGET)
        assert cancelled.exit_code == ExitCode.SUCCESS, cancelled.envelope
