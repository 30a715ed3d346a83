"""The background worker (`bulkrelay _job-worker ID`): runs one job's command to its end.

It runs the call stored in the job's spec (`bulkrelay.background.call`), synchronously, with a
`BackgroundSupervisor` that writes the job's status as committed progress arrives and requests a stop,
honoured at a safe point, when the job is cancelled (CANCELLED: no new request starts, the ones in flight
are answered and journaled, bounded by the read timeout) or
terminated (TERMINATED, on SIGTERM or SIGHUP). The run itself ends a stall (STALLED) and keeps the job's
deadline (TIMEOUT), which the supervisor hands to it. Then the worker writes the final envelope to
`result.json`, and only then lets go of the job's lock.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

from bulkrelay.background.state import (
    BackgroundJob,
    BackgroundJobResult,
    BackgroundJobSpec,
    BackgroundJobState,
    BackgroundJobStatus,
    WorkerReport,
    acquire_lock,
    background_job_for_key,
    index_locked,
    remember_background_job,
)
from bulkrelay.envelope import EnvelopeWarning, ErrorInfo, Result, to_envelope
from bulkrelay.errors import BulkRelayError, ExitCode
from bulkrelay.job.inputs import append_stdin
from bulkrelay.job.preflight import Preflight
from bulkrelay.relay.progress import Snapshot
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.rundir import RunDir

# The job's stage in its status: the worker has not reached preflight yet, preflight, sending.
STARTING, PREFLIGHT, RELAY = "starting", "preflight", "relay"
LOCK_FD_ENV = "BULKRELAY_JOB_LOCK_FD"  # the job's lock, taken by the front process and inherited
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what ends a worker at a safe point
STATUS_INTERVAL_SECONDS = 0.5
_POLL_SECONDS = 0.1


class BackgroundSupervisor:
    """The worker's side of a run: status file, cancel and SIGTERM; the job's time bounds.

    The idle timeout and the time limit are the run's own (bulkrelay.ops.lifecycle, for every run);
    the supervisor hands over the job's: an absolute `--timeout` deadline and when the work began."""

    def __init__(self, background: BackgroundJob, spec: BackgroundJobSpec) -> None:
        self._background = background
        self._stdin_rest = spec.stdin_rest
        self.deadline = spec.deadline  # absolute, from --timeout
        self.started_at = spec.created_at  # max_lifetime_seconds counts from here
        self._snapshot: Snapshot | None = None
        self._written_at = 0.0
        self._unwritten = False  # a progress came that the status file does not hold yet
        # What the front read from the run this job continues (resume, the identical run), if any: its
        # progress stands until the relay's own, so a report never falls below the checkpoint's.
        first = background.status()
        self._continued: tuple[str | None, dict[str, Any] | None] = (first.run_dir, first.progress)
        self.run_dir: str | None = first.run_dir
        self.signalled: StopReason | None = None  # TERMINATED or INTERRUPTED, set by the signal handler
        self.stage = STARTING
        self.rows_read: int | None = None
        self.warnings: list[dict[str, Any]] = []  # recorded as they arise, so a hand-off carries them

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signalled = StopReason.INTERRUPTED if signum == signal.SIGINT else StopReason.TERMINATED

    def finish_stdin(self) -> Result | None:
        """When the call's budget ran out before its stdin ended, read the rest into the job's copy,
        which then becomes this process's standard input (the command reads it as `--input -`).
        A signal or `job cancel` meanwhile ends the job there, with nothing sent; None: go on."""
        if not self._stdin_rest:
            return None
        with open(0, "rb", closefd=False) as rest:
            if not append_stdin(self._background.stdin_path, rest, self._stop_asked):
                reason = StopReason.CANCELLED if self._background.cancel_requested else self.signalled
                return _stopped_reading_stdin(reason or StopReason.TERMINATED)
        fd = os.open(self._background.stdin_path, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        return None

    def index_under(self, key_for: Callable[[Path], str]) -> None:
        """A job given its stdin before the end was started without its invocation key (the key holds
        the stdin digest): index it now, so the identical invocation attaches to it, unless another
        job took that key meanwhile."""
        if not self._stdin_rest:
            return
        key = key_for(self._background.stdin_path)
        with index_locked():
            holder = background_job_for_key(key)
            if holder is None or holder.state().final:
                remember_background_job(key, self._background)

    def _stop_asked(self) -> bool:
        return self.signalled is not None or self._background.cancel_requested

    def on_rows_read(self, rows_read: int) -> None:
        """The input read so far (a query's snapshot, preflight). Written at once when preflight starts
        and at its first record, then at most every interval; a cancel or signal is looked for at the
        same pace and ends the job there, before anything is sent (a 30M-row snapshot took minutes)."""
        first = self.stage != PREFLIGHT or not self.rows_read
        self.stage, self.rows_read = PREFLIGHT, rows_read
        if first or time.monotonic() - self._written_at >= STATUS_INTERVAL_SECONDS:
            self.write_status()
            if self._stop_asked():
                reason = StopReason.CANCELLED if self._background.cancel_requested else self.signalled
                raise StoppedReadingInput(reason or StopReason.TERMINATED)

    def on_run(self, run: RunDir) -> None:
        self.run_dir = str(run.path)
        if self.run_dir != self._continued[0]:  # a fresh run after all: the old one's progress is not its
            self._continued = (None, None)
        self.write_status()

    def on_warnings(self, warnings: Sequence[EnvelopeWarning]) -> None:
        self.warnings.extend(warning.to_dict() for warning in warnings)
        discarded = any(warning.code == "CHECKPOINT_DISCARDED" for warning in warnings)
        if discarded and self.run_dir is not None and self.run_dir == self._continued[0]:
            # The run the front named is not continued after all: a fresh run follows.
            self._continued, self.run_dir = (None, None), None
        self.write_status()

    def progress(self) -> dict[str, Any] | None:
        return self._continued[1] if self._snapshot is None else dict(self._snapshot.to_dict())

    def on_progress(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._unwritten = True
        if time.monotonic() - self._written_at >= STATUS_INTERVAL_SECONDS:
            self.write_status()

    def _write_late_progress(self) -> None:
        """The last progress held back by the interval, written once it has passed: a bulk job's
        move (closed, now processing) may be the last news for hours, and must not wait for the next."""
        if self._unwritten and time.monotonic() - self._written_at >= STATUS_INTERVAL_SECONDS:
            self.write_status()

    def write_status(
        self, state: BackgroundJobState = BackgroundJobState.RUNNING, exit_code: int | None = None
    ) -> None:
        self._written_at = time.monotonic()
        self._unwritten = False
        report = WorkerReport(self.stage, self.rows_read, tuple(self.warnings), os.getpid())
        self._background.write_status(
            BackgroundJobStatus(state, self.progress(), self.run_dir, report, exit_code)
        )

    async def watch(self, stop: StopControl, preflight: Preflight, run: RunDir) -> None:
        """Runs beside the relay; requests a stop when one is due. Cancelled when the relay ends.

        A cancel is a stop at a safe point like any other: the requests in flight are answered (each
        bounded by the read timeout) and journaled before the run ends `cancelled`; aborting them would
        leave effects at the target that no journal line records (REQ-C-035)."""
        self.run_dir = str(run.path)
        self.stage = RELAY
        self.write_status()
        while not stop.requested:
            if self._background.cancel_requested:
                stop.request(StopReason.CANCELLED, job_id=self._background.job_id)
            elif self.signalled is not None:
                stop.request(self.signalled)
            self._write_late_progress()
            await anyio.sleep(_POLL_SECONDS)


# Runs a job's stored call (its spec's `call`; an earlier version's job has only its `argv`) to its end
# under a supervisor: given by the command line's own module, so the worker needs nothing from above it.
CommandRunner = Callable[[BackgroundJobSpec, "BackgroundSupervisor"], Result]


def run_worker(job_id: str, execute: CommandRunner) -> Result:
    """The whole life of a worker; the returned result also goes to the job's log."""
    background = BackgroundJob.open(job_id)
    lock_fd = _hold_lock(background)
    try:
        spec = background.spec()
        sys.stderr.write(
            f"bulkrelay job {job_id}: worker {os.getpid()} runs: bulkrelay {shlex.join(spec.argv)}\n"
        )
        sys.stderr.flush()
        supervisor = BackgroundSupervisor(background, spec)
        handle_stop_signals(supervisor.on_signal)
        started = time.monotonic()
        result = _run_command(spec, supervisor, execute)
        envelope = to_envelope(result, duration_ms=round((time.monotonic() - started) * 1000))
        background.write_result(
            BackgroundJobResult(envelope, int(result.exit_code), result.kind, ended_at=time.time())
        )
        supervisor.write_status(BackgroundJobState.ENDED, exit_code=int(result.exit_code))
        return result
    finally:
        os.close(lock_fd)


def handle_stop_signals(handler: Callable[[int, FrameType | None], None]) -> None:
    """Install the worker's handlers, then let through the stop signals it was started with blocked
    (jobs._signals_held): one sent while it started (`job cancel` right after a hand-off) arrives now."""
    for signum in STOP_SIGNALS:  # SIGHUP is handled like SIGTERM
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _stopped_reading_stdin(reason: StopReason) -> Result:
    return _stopped_before_sending(
        reason, "while still reading standard input: nothing was sent, no run was made"
    )


class StoppedReadingInput(Exception):
    """A cancel or signal while the job read its input, before a row was sent: the job ends there.
    Raised from the reader's progress callback; the snapshot and the readers remove what they began."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.name)
        self.reason = reason


def _stopped_before_sending(reason: StopReason, what: str) -> Result:
    return Result(
        exit_code=ExitCode.SIGINT if reason is StopReason.INTERRUPTED else ExitCode.SIGTERM,
        kind="error",
        error=ErrorInfo(
            reason.name, f"stopped ({reason}) {what}", retryable=reason is not StopReason.CANCELLED
        ),
    )


def _hold_lock(background: BackgroundJob) -> int:
    """The lock the front process took and handed down; taken here when started by hand."""
    inherited = os.environ.pop(LOCK_FD_ENV, None)
    if inherited is not None:
        return int(inherited)
    fd = acquire_lock(background)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _run_command(spec: BackgroundJobSpec, supervisor: BackgroundSupervisor, execute: CommandRunner) -> Result:
    try:
        return supervisor.finish_stdin() or execute(spec, supervisor)
    except StoppedReadingInput as stopped:  # an unfinished run it continues is left as it was
        return _stopped_before_sending(stopped.reason, "while reading the input: nothing was sent")
    except BulkRelayError as exc:
        return Result.from_error(exc)
    except Exception as exc:  # the worker's only catch site: any failure still becomes the job's answer
        with contextlib.suppress(Exception):
            traceback.print_exc()
        return Result.from_unexpected(exc)
