"""`job cancel` with real processes: a background job whose rows hang on a slow target.

The cancel stops the job at a safe point: no new request, the ones in flight answered and journaled
(so every effect at the target has its journal line), then `cancelled`; it answers within its own call
budget with the job's true state, and the worker process is gone soon after.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.background.jobcli import cli as _cli
from tests.background.jobcli import worker_pid as _worker_pid
from tests.taggedjobs import journal, tag_rule, write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_BUDGET_MS, HANG_S, wait_for

_SLOW_MS = 3000  # rows 5 and on: on the wire while the tests cancel, each answered within the read timeout
HANGING = {"rules": [tag_rule("slow", delay_ms=_SLOW_MS)]}
# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = [pytest.mark.slow, pytest.mark.target_plan(HANGING)]


def _process_gone(pid: int) -> bool:
    """Ended: no such process, or a zombie nobody has reaped yet (the worker is not our child)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _start_hanging_job(tmp_path: Path, target: TargetProcess) -> tuple[str, int]:
    """A background job with rows 1-4 done and rows 5-8 on the wire, waiting on the target."""
    tags = {n: "slow" for n in range(5, 41)}
    job = write_job(
        tmp_path,
        target.url,
        rows=40,
        tags=tags,
        execution={"concurrency": 4, "timeout": {"read_seconds": HANG_S}},
    )
    started = _cli(tmp_path, "run", job, "--budget", "500ms")
    assert started.exit_code == ExitCode.INCOMPLETE, started.envelope
    job_id = started.data["job_id"]
    wait_for(lambda: target.stats()["requests"] >= 8, "four rows in flight")
    return job_id, _worker_pid(tmp_path, job_id)


def test_cancel_stops_at_a_safe_point_with_every_effect_journaled(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Issue 38 item 10: the cancel aborted the four requests in flight, which the target had applied
    (8 effects, 4 journaled rows); it must let them be answered and journaled, and start none after."""
    job_id, worker = _start_hanging_job(tmp_path, target)
    assert _cli(tmp_path, "job", "status", job_id).data["state"] == "running"

    cancel = _cli(tmp_path, "job", "cancel", job_id, AGENT_CALL_BUDGET_MS=str(HANG_BUDGET_MS))
    assert cancel.exit_code == ExitCode.SUCCESS, cancel.envelope
    assert (cancel.data["state"], cancel.data["run_state"]) == ("cancelled", "cancelled")
    assert cancel.envelope["meta"]["budget_ms"] == HANG_BUDGET_MS
    wait_for(lambda: _process_gone(worker), "the worker to exit")

    ended = _cli(tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET)
    assert ended.error_code == "CANCELLED" and ended.data["state"] == "cancelled"
    rows = journal(cancel.data["run_dir"])
    # Every request the target applied has its journal line, a success: none was cut off midway.
    stats = target.stats()
    assert stats["effects"] == stats["requests"] == len(rows), (stats, rows)
    assert all(row["success"] for row in rows), rows
    # The four on the wire when the cancel came were answered: rows 1-8 at least, and not the whole input
    # (a cancel that came late on a loaded machine meets the next four on the wire: they end the same way).
    assert sorted(row["row_number"] for row in rows) == list(range(1, len(rows) + 1))
    assert 8 <= len(rows) < 40


def test_status_says_cancelling_until_the_worker_has_ended(tmp_path: Path, target: TargetProcess) -> None:
    job_id, worker = _start_hanging_job(tmp_path, target)
    os.kill(worker, signal.SIGSTOP)  # a worker that cannot reach its end within the cancel's budget
    try:
        cancel = _cli(tmp_path, "job", "cancel", job_id, "--budget", "1s")
        assert cancel.exit_code == ExitCode.INCOMPLETE, cancel.envelope
        assert cancel.data["state"] == "cancelling"
        assert cancel.data["continue_command"] == f"bulkrelay job wait {job_id}"
        assert cancel.envelope["meta"]["budget_ms"] == 1000
        status = _cli(tmp_path, "job", "status", job_id)
        assert (status.exit_code, status.data["state"]) == (ExitCode.INCOMPLETE, "cancelling")
    finally:
        os.kill(worker, signal.SIGCONT)
    ended = _cli(tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET)
    assert ended.error_code == "CANCELLED" and ended.data["state"] == "cancelled"
    wait_for(lambda: _process_gone(worker), "the worker to exit")
    again = _cli(tmp_path, "job", "cancel", job_id)
    assert (again.exit_code, again.data["state"]) == (ExitCode.SUCCESS, "cancelled")


# Holds a job's worker at interpreter start-up, before it has imported BulkRelay (and so before it
# handles any signal), until the test opens the gate: the moment a cancel right after a hand-off meets.
_STARTUP_GATE = """\
import os, sys, time
if "_job-worker" in sys.orig_argv:
    here = os.path.dirname(os.path.abspath(__file__))
    open(os.path.join(here, "reached"), "w").close()
    deadline = time.monotonic() + {bound}
    while not os.path.exists(os.path.join(here, "open")) and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def test_a_cancel_before_the_worker_handles_signals_still_ends_the_job_cancelled(
    tmp_path: Path, target: TargetProcess
) -> None:
    """`job cancel` signals the worker's process group to wake it from preflight; a worker that had not
    reached its own signal handlers yet died of that SIGTERM without a result, so the cancel answered
    `cancelled` with no exit code and `job wait` then said JOB_LOST (exit 1) instead of CANCELLED."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "sitecustomize.py").write_text(_STARTUP_GATE.format(bound=HANG_S))
    job = write_job(tmp_path, target.url, rows=4)
    started = _cli(tmp_path, "run", job, "--budget", "1ms", PYTHONPATH=str(gate))
    assert started.exit_code == ExitCode.INCOMPLETE, started.envelope
    job_id = started.data["job_id"]
    wait_for((gate / "reached").exists, "the worker held at start-up")

    asked = _cli(tmp_path, "job", "cancel", job_id, "--budget", "1ms")  # signals, then answers at once
    assert asked.exit_code == ExitCode.INCOMPLETE and asked.data["state"] == "cancelling", asked.envelope
    (gate / "open").touch()

    ended = _cli(tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET)
    assert ended.exit_code == ExitCode.SIGTERM, ended.envelope
    assert ended.error_code == "CANCELLED", ended.envelope
    again = _cli(tmp_path, "job", "cancel", job_id)
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["state"] == "cancelled" and again.data["job_exit_code"] == ExitCode.SIGTERM
    assert target.stats()["requests"] == 0  # nothing was sent
