"""The call budget and background jobs: work outlives the call, and a caller never hangs.

`run`, `resume` and `retry-failed` have a budget (cli/commands.py resolves it). With one, the front
process (`hand_off`) starts a detached worker (`bulkrelay.background.worker`) and waits for it up to
the budget: the job's own answer when it ends in time, else INCOMPLETE (14) with the job's id and
progress. The identical invocation attaches to its live job instead of starting a second one.
`job wait|status|cancel` reach a job later.
Job state lives on disk (`bulkrelay.background.state`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

from bulkrelay.background.call import Call, RelayArgs
from bulkrelay.background.state import (
    BackgroundJob,
    BackgroundJobSpec,
    BackgroundJobState,
    BackgroundJobStatus,
    acquire_lock,
    background_job_for_key,
    background_jobs_root,
    index_locked,
    record_pid,
    remember_background_job,
    remove_expired,
)
from bulkrelay.background.worker import LOCK_FD_ENV, STOP_SIGNALS
from bulkrelay.envelope import CallMeta, CommandData, EnvelopeWarning, ErrorInfo, Result, SideChannel
from bulkrelay.errors import BulkRelayError, ExitCode, JobLost, UsageError
from bulkrelay.job.durations import LONGEST_DURATION, MAX_MS, whole_number
from bulkrelay.job.fingerprint import file_sha256
from bulkrelay.job.inputs import Spool, let_go_of_spool, spool_stdin_into
from bulkrelay.ops.invocation import invocation_key
from bulkrelay.ops.status import CRASHED, RESUMABLE, committed_progress, liveness
from bulkrelay.private import open_private
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.atomic import move_file
from bulkrelay.store.rundir import RunDir, RunState, is_locked

BUDGET_ENV = "AGENT_CALL_BUDGET_MS"
DEFAULT_BUDGET_MS = 30_000
CANCEL_WAIT_SECONDS = 60.0
_POLL_SECONDS = 0.05

KeyOf = Callable[[Path | None], str]  # spooled stdin -> the invocation key
# spooled stdin -> the run the call continues, known before any work (`resume RUN`, the identical run)
Continues = Callable[[Path | None], RunDir | None]


def resolve_budget(flag_ms: int | None, environ: Mapping[str, str], stdout_is_terminal: bool) -> int | None:
    """`--budget`, else AGENT_CALL_BUDGET_MS, else 30 s without a terminal; None: no budget at all.

    0 turns the budget off: the call runs synchronously (and says so with `meta.budget_ms` 0)."""
    if flag_ms is not None:
        return flag_ms
    raw = environ.get(BUDGET_ENV, "").strip()
    if raw:
        budget_ms = whole_number(raw)
        if budget_ms is None:
            raise UsageError(f"{BUDGET_ENV}={raw!r} is not a whole number of milliseconds")
        if budget_ms > MAX_MS:
            raise UsageError(f"{BUDGET_ENV}={raw!r} is longer than {LONGEST_DURATION}, the longest")
        return budget_ms
    return None if stdout_is_terminal else DEFAULT_BUDGET_MS


def arguments_key(call: Call, stdin: Path | None) -> str:
    """The invocation key of a call from its options: paths resolved, budget, timeout and where it
    reports left out."""
    stdin_sha256 = file_sha256(stdin) if stdin is not None else None
    return invocation_key(
        call.command, call.options.identity(), stdin_sha256=stdin_sha256, idempotency_key=None
    )


# ------------------------------------------------------------------------------- the front process


def hand_off(
    call: Call, budget_ms: int, *, started: float, key_of: KeyOf, continues: Continues | None = None
) -> Result:
    """The front process of a call with a budget: start (or attach to) the invocation's job, then wait
    for it up to the budget. `continues` names the run the call will continue, read before the hand-off:
    a job handed off before its worker got going still says where its work is and how much is committed.

    Standard input is read first, under the CLI's own signal handlers: until it is read there is no
    work to hand off, so a signal ends the call (130 / 143, nothing sent) however long stdin stays open.
    A budget that runs out first hands the job the rest of stdin to read."""
    deadline = started + budget_ms / 1000
    reads_stdin = isinstance(call.options, RelayArgs) and call.options.reads_stdin
    spool = _spool_stdin(deadline) if reads_stdin else None
    try:
        with _hand_off_on_signal() as handed_off:
            background = _job_of_invocation(call, (key_of, continues), spool)
            result = wait_for(background, budget_ms, started=started, handed_off=handed_off)
    finally:
        if spool is not None:
            spool.path.unlink(missing_ok=True)  # moved into the job, or no job took it
            let_go_of_spool(spool.path.parent)
    if result.exit_code == ExitCode.INCOMPLETE and unattended(os.environ):
        result.warnings.append(_unattended_warning(background, budget_ms))
    return result


def unattended(environ: Mapping[str, str]) -> bool:
    """No terminal on stdin or stdout and no agent's budget: cron, a timer, a script."""
    return not (sys.stdin.isatty() or sys.stdout.isatty() or environ.get(BUDGET_ENV, "").strip())


def _unattended_warning(background: BackgroundJob, budget_ms: int) -> EnvelopeWarning:
    """Said loudly (also on stderr): from cron, exit 14 with the work going on detached is rarely meant."""
    return EnvelopeWarning(
        "BUDGET_HANDOFF_UNATTENDED",
        f"no terminal and no {BUDGET_ENV}: the {budget_ms} ms call budget handed the work to background "
        f"job {background.job_id}, which goes on after this call exits 14; from cron, a systemd timer or any "
        "script that should wait for the end, run with --budget 0",
        {"job_id": background.job_id, "budget_ms": budget_ms, "use": "--budget 0"},
    )


@contextmanager
def _hand_off_on_signal() -> Iterator[Callable[[], str | None]]:
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


def _spool_stdin(deadline: float) -> Spool:
    def budget_spent() -> bool:
        return time.monotonic() >= deadline

    return spool_stdin_into(background_jobs_root() / ".spool", sys.stdin.buffer, stop=budget_spent)


def _job_of_invocation(
    call: Call, identity: tuple[KeyOf, Continues | None], spool: Spool | None
) -> BackgroundJob:
    """The identical invocation's live job, else a new one. A job given stdin before its end has no
    key yet (the key holds the stdin digest): its worker indexes it once it has read the rest."""
    key_of, continues = identity
    stdin_unfinished = spool is not None and not spool.complete
    stdin = None if spool is None else spool.path
    key = "" if stdin_unfinished else key_of(stdin)
    with index_locked():
        remove_expired()
        background = background_job_for_key(key) if key else None
        if background is None or background.state().final:
            run = None if continues is None or stdin_unfinished else _continued_run(continues, stdin)
            background = _start_background_job(call, (key, run), spool, previous=background)
    return background


def _continued_run(continues: Continues, stdin: Path | None) -> RunDir | None:
    """The run the call continues, or None; whatever is wrong with it is the worker's to report.
    A run stopped on purpose, or a crashed one (still `running` in run.json, its lock free: killed,
    out of memory, a lost job's): both are continued from their checkpoint (REQ-C-035)."""
    try:
        run = continues(stdin)
    except BulkRelayError:
        return None
    return run if run is not None and liveness(run) in (CRASHED, RESUMABLE) else None


def _start_background_job(
    call: Call,
    identity: tuple[str, RunDir | None],
    spool: Spool | None,
    previous: BackgroundJob | None,
) -> BackgroundJob:
    key, run = identity
    now = time.time()
    timeout_ms = call.options.timeout if isinstance(call.options, RelayArgs) else None
    spec = BackgroundJobSpec(
        command=call.command,
        argv=call.argv,
        cwd=os.getcwd(),
        key=key,
        created_at=now,
        deadline=now + timeout_ms / 1000 if timeout_ms is not None else None,
        stdin_rest=spool is not None and not spool.complete,
        call=call,
    )
    if previous is not None and previous.state() is BackgroundJobState.LOST and not previous.cancel_requested:
        # Only the continuation of a lost job keeps its bounds (the lifetime, and the --timeout unless a
        # new one is given). A job that ended took its deadline with it: the next call has its own.
        earlier = previous.spec()
        spec = replace(spec, created_at=earlier.created_at, previous_job=previous.job_id)
        if timeout_ms is None:
            spec = replace(spec, deadline=earlier.deadline)
    background = BackgroundJob.create(spec, _first_status(run))
    if spool is not None:
        move_file(spool.path, background.stdin_path)
    _spawn(background, spool)
    if key:
        remember_background_job(key, background)
    return background


def _first_status(run: RunDir | None) -> BackgroundJobStatus:
    """A job's status before its worker writes one: the run it continues and that run's committed
    progress, which the worker's later reports never go below (its first snapshot is the journal's)."""
    if run is None:
        return BackgroundJobStatus(BackgroundJobState.RUNNING)
    progress = None
    with suppress(BulkRelayError):  # a damaged checkpoint is the worker's to report
        progress = dict(committed_progress(run).to_dict())
    return BackgroundJobStatus(BackgroundJobState.RUNNING, progress=progress, run_dir=str(run.path))


def _spawn(background: BackgroundJob, spool: Spool | None) -> None:
    """Start the worker detached: its own session, its own stdio, the job's lock already held for it."""
    lock_fd = acquire_lock(background)
    try:
        with (
            open(background.log_path, "ab", opener=open_private) as log,
            _worker_stdin(background, spool) as stdin_file,
            _signals_held(),
        ):
            process = subprocess.Popen(
                [sys.executable, "-m", "bulkrelay", "_job-worker", background.job_id],
                start_new_session=True,
                stdin=stdin_file,
                stdout=log,
                stderr=log,
                close_fds=True,
                pass_fds=(lock_fd,),
                env={**os.environ, LOCK_FD_ENV: str(lock_fd)},
            )
        record_pid(lock_fd, process.pid)
        process.returncode = 0  # never waited for: the worker outlives this process on purpose
    finally:
        os.close(lock_fd)


@contextmanager
def _signals_held() -> Iterator[None]:
    """The worker starts with the stop signals blocked (a mask is inherited), and lets them through once
    its handlers are in place (worker.handle_stop_signals): a `job cancel` or SIGTERM that comes while it
    is still starting waits for it, instead of killing it before it can write its result (JOB_LOST).
    Here they are held only while the worker is made, then reach this process's own handlers."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def _worker_stdin(background: BackgroundJob, spool: Spool | None) -> Iterator[Any]:
    """The worker's standard input: nothing; the job's copy of the call's stdin; or, when the budget
    ran out before that stdin ended, the rest of it, which the worker appends to the copy."""
    if spool is None:
        yield subprocess.DEVNULL
    elif not spool.complete:
        yield sys.stdin.fileno()  # read with read1 only: nothing of it waits in this process's buffer
    else:
        with background.stdin_path.open("rb") as stream:
            yield stream


# ---------------------------------------------------------------------------------- waiting


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
            raise background_job_lost(background)
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


# ------------------------------------------------------------------------ job wait|status|cancel


def _open_background_job(job_id: str) -> BackgroundJob:
    with index_locked():
        remove_expired()
    return BackgroundJob.open(job_id)


def background_wait(job_id: str, budget_flag_ms: int | None) -> Result:
    budget_ms = resolve_budget(budget_flag_ms, os.environ, sys.stdout.isatty())
    background = _open_background_job(job_id)
    with _hand_off_on_signal() as handed_off:
        return wait_for(background, budget_ms, handed_off=handed_off)


def background_status(job_id: str) -> Result:
    background = _open_background_job(job_id)
    state = background.state()
    if state is BackgroundJobState.ENDED:
        return stored_result(background, None)
    if state is BackgroundJobState.LOST:
        raise background_job_lost(background)
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
