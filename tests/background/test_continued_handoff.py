"""A budget that runs out before the worker got going still says where a continued run stands
(REQ-C-035, issue 22 item 16): `run_dir` at once, and progress never below the run's checkpoint.

Real processes: a run halted by a 401 after 48 committed rows, then `run` (the identical invocation)
or `resume RUN_DIR` under a budget of 100 ms or 300 ms, against a target that now holds every answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, cli_env, run_cli
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_S

_COMMITTED = 48


def _cli(tmp_path: Path, *args: str | Path) -> CliResult:
    return run_cli(*args, cwd=tmp_path, env=cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state")))


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["100ms", "300ms"])
@pytest.mark.parametrize("command", ["run", "resume"])
def test_a_hand_off_before_the_worker_starts_names_the_run_and_its_checkpointed_progress(
    tmp_path: Path, command: str, budget: str
) -> None:
    halt_after = {"rules": [{"after": _COMMITTED, "status": 401}]}
    with TargetProcess(halt_after) as target:
        job = write_job(tmp_path, target.url, rows=100, execution={"concurrency": 1})
        halted = _cli(tmp_path, "run", job, "--budget", "0")
        assert halted.error_code == "TARGET_AUTH_FAILED", halted.envelope
        run_dir = halted.data["run_dir"]
        checkpoint = json.loads((Path(run_dir) / "checkpoint.json").read_text())
        assert checkpoint["rows_done"] == _COMMITTED

        # Every answer now takes longer than a hang's bound: the job cannot end within the budget.
        target.set_plan({"rules": [{"delay_ms": int(HANG_S * 1000)}]})
        argv = ("run", job) if command == "run" else ("resume", run_dir)
        handed_off = _cli(tmp_path, *argv, "--budget", budget)
        assert handed_off.exit_code == ExitCode.INCOMPLETE, handed_off.envelope
        data = handed_off.data
        assert data["run_dir"] == run_dir, data
        assert data["progress"]["done"] >= _COMMITTED, data
        assert data["progress"]["total"] == 100, data

        # `job status` says the same until the relay's own progress takes over (never lower).
        status = _cli(tmp_path, "job", "status", data["job_id"])
        assert status.data["run_dir"] == run_dir
        assert status.data["progress"]["done"] >= _COMMITTED
        cancelled = _cli(tmp_path, "job", "cancel", data["job_id"], "--budget", HANG_BUDGET)
        assert cancelled.exit_code == ExitCode.SUCCESS, cancelled.envelope
