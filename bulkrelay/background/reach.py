"""Reaching a background job: waiting for it (the front process of a call, `job wait`), asking after it
(`job status`), cancelling it (`job cancel`), and the answer each gives: the job's own result once it
ended, INCOMPLETE (14) while it goes on, JOB_LOST when its worker died without one.

Loaded without the job file's schema or the relay, so that an agent polling `job status` pays about a
third of the start-up of a call that relays (tests/cli/test_startup_imports.py keeps it so).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bulkrelay.background.budget import resolve_budget
from bulkrelay.background.state import BackgroundJob, BackgroundJobState, index_locked, remove_expired
from bulkrelay.envelope import CallMeta, CommandData, EnvelopeWarning, ErrorInfo, Result, SideChannel
from bulkrelay.errors import BulkRelayError, ExitCode, JobLost
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.rundir import RunDir, RunState, is_locked

CANCEL_WAIT_SECONDS = 60.0
_POLL_SECONDS = 0.05


@contextmanager
def hand_off_on_signal() -> Iterator[Callable[[], str | None]]:
    """SIGTERM (or SIGINT, SIGHUP) to the front before the budget ends: answer at once, the job goes on.
    Yields a function naming the first signal received, or None."""
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield lambda: signal.Signals(received[0]).name if received else None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_for(
    background: BackgroundJob,
    budget_ms: int | None,
    *,
    started: float | None = None,
    handed_off: Callable[[], str | None] = lambda: None,
) -> Result:
    """The job's own answer if it ends within the budget, else INCOMPLETE. None or 0 (`--budget 0`
    turns the budget off, as for every command): no limit."""
    started = time.monotonic() if started is None else started
    deadline = None if not budget_ms else started + budget_ms / 1000
    while True:
        state = background.state()
        if state is BackgroundJobState.ENDED:
            return stored_result(background, budget_ms)
        if state is BackgroundJobState.LOST:
            return lost(background, budget_ms)
        signalled = handed_off()
        if signalled or (deadline is not None and time.monotonic() >= deadline):
            return incomplete(background, budget_ms, handed_off_on=signalled)
        time.sleep(_POLL_SECONDS)


def stored_result(background: BackgroundJob, budget_ms: int | None) -> Result:
    """The job's final envelope as the job wrote it; `duration_ms` stays the work's."""
    stored = background.result()
    assert stored is not None
    envelope = stored.envelope
    error = envelope["error"]
    return Result(
        data=envelope["data"],
        exit_code=ExitCode(stored.exit_code),
        error=None if error is None else ErrorInfo.from_dict(error),
        warnings=_warnings(envelope["warnings"]),
        meta=CallMeta(job_id=background.job_id, budget_ms=budget_ms),
        kind=stored.kind,
        side=SideChannel(work_duration_ms=envelope["meta"]["duration_ms"]),
    )


def _warnings(stored: list[dict[str, Any]]) -> list[EnvelopeWarning]:
    return [EnvelopeWarning(w["code"], w["message"], w.get("context")) for w in stored]


@dataclass(frozen=True)
class BackgroundJobGoesOn(CommandData):
    """Exit 14's data: a background job still at work. `rows_read` appears while it preflights."""

    kind = "job"

    state: BackgroundJobState
    stage: str
    job_id: str
    progress: dict[str, Any]  # the job's status file's, as its worker last wrote it
    run_dir: str | None
    continue_command: str
    cancel_command: str
    rows_read: int | None = None

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "state": self.state,
            "stage": self.stage,
            "job_id": self.job_id,
            "progress": self.progress,
            "run_dir": self.run_dir,
            "continue_command": self.continue_command,
            "cancel_command": self.cancel_command,
        }
        if self.rows_read is not None:
            data["rows_read"] = self.rows_read
        return data


@dataclass(frozen=True)
class BackgroundJobEnded(CommandData):
    """`job cancel` of a job that has ended: `cancelled` when its run was, else `ended`."""

    kind = "job"

    job_id: str
    state: BackgroundJobState
    run_dir: str | None
    run_state: str | None
    job_exit_code: int | None

    def to_data(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "run_dir": self.run_dir,
            "run_state": self.run_state,
            "job_exit_code": self.job_exit_code,
        }


def incomplete(
    background: BackgroundJob, budget_ms: int | None, *, handed_off_on: str | None = None
) -> Result:
    """Exit 14: the job goes on. Says where it is (its stage, the rows preflight read, its run
    directory once that exists), the warnings it met so far, and why the call let go of it."""
    status = background.status()
    worker = status.worker
    continue_command = f"bulkrelay job wait {background.job_id}"
    state = BackgroundJobState.CANCELLING if background.cancel_requested else BackgroundJobState.RUNNING
    stage = worker.stage if worker is not None else "starting"
    data = BackgroundJobGoesOn(
        state=state,
        stage=stage,
        job_id=background.job_id,
        progress=status.progress or {"done": 0, "total": None, "unit": "rows"},
        run_dir=status.run_dir,
        continue_command=continue_command,
        cancel_command=f"bulkrelay job cancel {background.job_id}",
        rows_read=((worker.rows_read if worker is not None else None) or 0) if stage == "preflight" else None,
    )
    why = _why_incomplete(state, budget_ms, handed_off_on)
    goes_on = (
        "its worker has not ended yet"
        if state is BackgroundJobState.CANCELLING
        else "it goes on in the background"
    )
    error = ErrorInfo(
        "INCOMPLETE",
        f"job {background.job_id} {why}; {goes_on}",
        retryable=True,
        suggestion=continue_command,
        context=None if handed_off_on is None else {"handed_off_on": handed_off_on},
        order=("code", "message", "retryable", "suggestion", "context"),
    )
    return Result(
        data=data,
        exit_code=ExitCode.INCOMPLETE,
        error=error,
        warnings=_warnings(list(worker.warnings) if worker is not None else []),
        meta=CallMeta(job_id=background.job_id, budget_ms=budget_ms),
    )


def _why_incomplete(state: BackgroundJobState, budget_ms: int | None, handed_off_on: str | None) -> str:
    if handed_off_on is not None:
        return f"was handed off on {handed_off_on}"
    if budget_ms is not None:
        return f"is still {state} after the call budget of {budget_ms} ms"
    return f"is still {state}"


def lost(background: BackgroundJob, budget_ms: int | None) -> Result:
    """JOB_LOST (1): the job's worker ended without writing a result. Like every answer about a job, it
    names the job in `meta.job_id`, which a caller that handed its work off knows it by."""
    result = Result.from_error(background_job_lost(background))
    result.meta = CallMeta(job_id=background.job_id, budget_ms=budget_ms)
    return result


def background_job_lost(background: BackgroundJob) -> JobLost:
    run_dir = None
    with suppress(BulkRelayError):  # a damaged status must not hide that the worker is gone
        run_dir = background.status().run_dir
    return JobLost(
        f"job {background.job_id} ended without a result; its worker exited",
        detail=background.log_tail() or "(the job's log is empty)",
        context={"job_id": background.job_id, "log": str(background.log_path), "run_dir": run_dir},
        suggestion="run the same command again: it continues the run from its journal",
    )


def _open_background_job(job_id: str) -> BackgroundJob:
    with index_locked(wait=False) as ours:  # housekeeping in passing: never behind a hand-off's lock
        if ours:
            remove_expired()
    return BackgroundJob.open(job_id)


def background_wait(job_id: str, budget_flag_ms: int | None) -> Result:
    budget_ms = resolve_budget(budget_flag_ms, os.environ, sys.stdout.isatty())
    background = _open_background_job(job_id)
    with hand_off_on_signal() as handed_off:
        return wait_for(background, budget_ms, handed_off=handed_off)


def background_status(job_id: str) -> Result:
    background = _open_background_job(job_id)
    state = background.state()
    if state is BackgroundJobState.ENDED:
        return stored_result(background, None)
    if state is BackgroundJobState.LOST:
        return lost(background, None)
    return incomplete(background, None)


def background_cancel(job_id: str, budget_flag_ms: int | None = None) -> Result:
    """Ask the job to stop at a safe point (its rows in flight answered and journaled, each bounded by
    the read timeout); wait for its end up to the call budget.

    The answer is the job's true state: `cancelled` once the worker has ended, else 14 with the
    job `cancelling` and the command that waits for it."""
    started = time.monotonic()
    budget_ms = resolve_budget(budget_flag_ms, os.environ, sys.stdout.isatty())
    background = _open_background_job(job_id)
    if background.state() is BackgroundJobState.ENDED:
        return _cancel_answer(background, budget_ms)
    background.request_cancel()
    pid = background.worker_pid()
    if pid is not None and background.is_live():
        # Wakes a worker still in preflight; once relaying, its supervisor reads the cancel file. The
        # job's process alone: its run's worker processes (execution.workers) share its process group,
        # and signalled themselves they stopped as terminated before the job read its cancel, so the run
        # ended `stopped` (and the identical call continued it) instead of `cancelled`.
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = started + (budget_ms / 1000 if budget_ms else CANCEL_WAIT_SECONDS)
    while background.is_live() and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    if background.is_live():
        return incomplete(background, budget_ms)
    if background.result() is None:
        _cancel_lost_run(background)
    return _cancel_answer(background, budget_ms)


def _cancel_lost_run(background: BackgroundJob) -> None:
    """A dead worker left its run `running`; cancelling the job cancels that run too."""
    run_dir = background.status().run_dir
    if run_dir and not is_locked(Path(run_dir)):
        with suppress(BulkRelayError):
            run = RunDir.open(Path(run_dir))
            if run.state is RunState.RUNNING:
                run.mark_ended(RunState.CANCELLED, StopReason.CANCELLED)


def _cancel_answer(background: BackgroundJob, budget_ms: int | None) -> Result:
    """A job that has ended: `cancelled` when its run was (or a lost worker's run now is), or when the
    cancel ended it while it still read its input (no run made), else `ended`."""
    stored = background.result()
    envelope = stored.envelope if stored else None
    run_data = envelope["data"] if envelope and isinstance(envelope["data"], dict) else {}
    run_state = run_data.get("state") if stored else RunState.CANCELLED
    error = envelope["error"] if envelope and isinstance(envelope["error"], dict) else {}
    cancelled = run_state == RunState.CANCELLED or error.get("code") == StopReason.CANCELLED.name
    data = BackgroundJobEnded(
        job_id=background.job_id,
        state=BackgroundJobState.CANCELLED if cancelled else BackgroundJobState.ENDED,
        run_dir=run_data.get("run_dir") or background.status().run_dir,
        run_state=run_state,
        job_exit_code=stored.exit_code if stored else None,
    )
    return Result(data=data, meta=CallMeta(budget_ms=budget_ms))
