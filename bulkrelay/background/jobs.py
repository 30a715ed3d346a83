"""The hand-off to a background job: work outlives the call, and a caller never hangs.

`run`, `resume` and `retry-failed` have a budget (background/budget.py, resolved by cli/commands.py).
With one, the front process (`hand_off`) starts a detached worker (`bulkrelay.background.worker`) and
waits for it up to the budget (background/reach.py): the job's own answer when it ends in time, else
INCOMPLETE (14) with the job's id and progress. The identical invocation attaches to its live job
instead of starting a second one. `job wait|status|cancel` reach a job later (background/reach.py).
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
from dataclasses import replace
from pathlib import Path
from typing import Any

from bulkrelay.background.budget import BUDGET_ENV
from bulkrelay.background.call import Call, RelayArgs
from bulkrelay.background.reach import hand_off_on_signal, wait_for
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
from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import BulkRelayError, ExitCode
from bulkrelay.job.fingerprint import file_sha256
from bulkrelay.job.inputs import Spool, let_go_of_spool, spool_stdin_into
from bulkrelay.ops.invocation import invocation_key
from bulkrelay.ops.status import CRASHED, RESUMABLE, committed_progress, liveness
from bulkrelay.private import open_private
from bulkrelay.store.atomic import move_file
from bulkrelay.store.rundir import RunDir

KeyOf = Callable[[Path | None], str]  # spooled stdin -> the invocation key
# spooled stdin -> the run the call continues, known before any work (`resume RUN`, the identical run)
Continues = Callable[[Path | None], RunDir | None]


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
        with hand_off_on_signal() as handed_off:
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
