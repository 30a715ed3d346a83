"""The background worker (`bulkrelay _job-worker ID`): runs one job's command to its end.

It re-runs the command line stored in the job's spec, synchronously, with a `JobSupervisor` that
writes the job's status as committed progress arrives and requests a stop, honoured at a safe point,
when the job is cancelled (CANCELLED), terminated (TERMINATED), makes no progress for
`execution.idle_timeout_seconds` (STALLED) or outlives its deadline (TIMEOUT). Then it writes the
final envelope to `result.json`, and only then lets go of the job's lock.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time
import traceback
from types import FrameType
from typing import Any

import anyio

from bulkrelay.envelope import Result, to_envelope
from bulkrelay.errors import BulkRelayError
from bulkrelay.jobstate import ENDED, RUNNING, JobDir, acquire_lock
from bulkrelay.preflight import Preflight
from bulkrelay.progress import Snapshot
from bulkrelay.rundir import RunDir
from bulkrelay.stopping import CANCELLED, INTERRUPTED, STALLED, TERMINATED, TIMEOUT, StopControl

LOCK_FD_ENV = "BULKRELAY_JOB_LOCK_FD"  # the job's lock, taken by the front process and inherited
STATUS_INTERVAL_SECONDS = 0.5
_POLL_SECONDS = 0.1


class JobSupervisor:
    """The worker's side of a run: status file, idle watchdog, lifetime, cancel and SIGTERM."""

    def __init__(self, job: JobDir, spec: dict[str, Any]) -> None:
        self._job = job
        self._deadline: float | None = spec.get("deadline")  # absolute, from --timeout
        self._created_at = float(spec["created_at"])
        self._snapshot: Snapshot | None = None
        self._changed_at = time.monotonic()
        self._written_at = 0.0
        self.run_dir: str | None = None
        self.signalled: str | None = None  # TERMINATED or INTERRUPTED, set by the signal handler

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signalled = INTERRUPTED if signum == signal.SIGINT else TERMINATED

    def progress(self) -> dict[str, Any] | None:
        return None if self._snapshot is None else self._snapshot.to_dict()

    def on_progress(self, snapshot: Snapshot) -> None:
        if self._snapshot is None or snapshot.done != self._snapshot.done:
            self._changed_at = time.monotonic()
        self._snapshot = snapshot
        if time.monotonic() - self._written_at >= STATUS_INTERVAL_SECONDS:
            self.write_status()

    def write_status(self, state: str = RUNNING, **extra: Any) -> None:
        self._written_at = time.monotonic()
        self._job.write_status(
            {
                "state": state,
                "progress": self.progress(),
                "run_dir": self.run_dir,
                "pid": os.getpid(),
                **extra,
            }
        )

    async def watch(self, stop: StopControl, preflight: Preflight, run: RunDir) -> None:
        """Runs beside the relay; requests a stop when one is due. Cancelled when the relay ends."""
        self.run_dir = str(run.path)
        self.write_status()
        execution = preflight.job.config.execution
        deadline = self._deadline or self._created_at + execution.max_lifetime_seconds
        idle = execution.idle_timeout_seconds
        self._changed_at = time.monotonic()  # idleness counts from the first send, not from preflight
        while not stop.requested:
            reason, detail = self._due(deadline, idle)
            if reason is not None:
                stop.request(reason, **detail)
            await anyio.sleep(_POLL_SECONDS)
        if stop.reason == STALLED:
            # Rows in flight are likely stuck too: give them one more idle period, then cancel them.
            await anyio.sleep(idle)
            stop.force()

    def _due(self, deadline: float, idle: float) -> tuple[str | None, dict[str, object]]:
        if self._job.cancel_requested:
            return CANCELLED, {"job_id": self._job.job_id}
        if self.signalled is not None:
            return self.signalled, {}
        if time.time() >= deadline:
            return TIMEOUT, {"deadline": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))}
        if time.monotonic() - self._changed_at >= idle:
            return STALLED, {"idle_timeout_seconds": idle}
        return None, {}


def run_worker(job_id: str) -> Result:
    """The whole life of a worker; the returned result also goes to the job's log."""
    job = JobDir.open(job_id)
    lock_fd = _hold_lock(job)
    try:
        spec = job.spec()
        sys.stderr.write(
            f"bulkrelay job {job_id}: worker {os.getpid()} runs: bulkrelay {shlex.join(spec['argv'])}\n"
        )
        sys.stderr.flush()
        supervisor = JobSupervisor(job, spec)
        signal.signal(signal.SIGTERM, supervisor.on_signal)
        signal.signal(signal.SIGINT, supervisor.on_signal)
        started = time.monotonic()
        result = _run_command(list(spec["argv"]), supervisor)
        envelope = to_envelope(result, duration_ms=round((time.monotonic() - started) * 1000))
        job.write_result(
            {
                "envelope": envelope,
                "exit_code": int(result.exit_code),
                "kind": result.kind,
                "ended_at": time.time(),
            }
        )
        supervisor.write_status(ENDED, exit_code=int(result.exit_code))
        return result
    finally:
        os.close(lock_fd)


def _hold_lock(job: JobDir) -> int:
    """The lock the front process took and handed down; taken here when started by hand."""
    inherited = os.environ.pop(LOCK_FD_ENV, None)
    if inherited is not None:
        return int(inherited)
    fd = acquire_lock(job)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _run_command(argv: list[str], supervisor: JobSupervisor) -> Result:
    from bulkrelay.cli import build_parser, command_args, dispatch  # late: the cli imports the command table

    try:
        args = build_parser().parse_args(command_args(argv))
        args.argv = argv
        args.quiet = "--quiet" in argv
        args.budget = 0
        args.supervisor = supervisor
        return dispatch(args)
    except BulkRelayError as exc:
        return Result.from_error(exc)
    except Exception as exc:  # the worker's only catch site: any failure still becomes the job's answer
        with contextlib.suppress(Exception):
            traceback.print_exc()
        return Result.from_unexpected(exc)
