"""One run's life: create or reopen its directory, hold its lock, relay, record how it ended.

`run`, `resume` and `retry-failed` differ only in how they find their run and start point;
from there they share `relay_locked()`, which maps the engine's outcome to a run state, a
summary and a `Result` with the exit code DESIGN §3 names.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import anyio

from bulkrelay.atomic import write_json_atomic
from bulkrelay.delta import record_deliveries
from bulkrelay.engine import RelayOutcome, StartPoint, relay
from bulkrelay.envelope import Result
from bulkrelay.errors import ExitCode, sole_error
from bulkrelay.inputs import spool_stdin_into
from bulkrelay.preflight import Preflight
from bulkrelay.progress import CallbackReporter, FanOut, Reporter, Snapshot
from bulkrelay.resume import config_sections, recover_start
from bulkrelay.rundir import (
    CANCELLED as CANCELLED_STATE,
)
from bulkrelay.rundir import (
    COMPLETED,
    COMPLETED_WITH_FAILURES,
    FORCED,
    RUNNING,
    STOPPED,
    SUMMARY,
    RunDir,
    utc_now,
)
from bulkrelay.stopping import (
    CANCELLED,
    HALT_AUTH,
    HALT_UNAVAILABLE,
    INTERRUPTED,
    STALLED,
    TERMINATED,
    TIMEOUT,
    StopControl,
    stop_at,
    watch_signals,
)
from bulkrelay.summary import summarize

# How each stop reason ends a run: (error code, exit code, message).
_STOPS: dict[str, tuple[str, ExitCode, str]] = {
    INTERRUPTED: ("INTERRUPTED", ExitCode.SIGINT, "stopped by SIGINT at a safe point"),
    TERMINATED: ("TERMINATED", ExitCode.SIGTERM, "stopped by SIGTERM at a safe point"),
    TIMEOUT: ("TIMEOUT", ExitCode.TIMEOUT, "the time limit was reached; stopped at a safe point"),
    STALLED: ("STALLED", ExitCode.TIMEOUT, "no progress for the idle timeout; stopped"),
    HALT_AUTH: ("TARGET_AUTH_FAILED", ExitCode.AUTH_REQUIRED, "the target refused our credentials; halted"),
    HALT_UNAVAILABLE: ("TARGET_UNAVAILABLE", ExitCode.UNAVAILABLE, "the target looks down; halted"),
    CANCELLED: ("CANCELLED", ExitCode.SIGTERM, "the job was cancelled"),
}


class Supervisor(Protocol):
    """What a background worker adds to a run: it sees the progress and may request a stop."""

    def on_progress(self, snapshot: Snapshot) -> None: ...

    async def watch(self, stop: StopControl, preflight: Preflight, run: RunDir) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    timeout_seconds: float | None = None
    handle_signals: bool = True
    supervisor: Supervisor | None = None  # set by the background job worker (bulkrelay.worker)


def manifest_for(preflight: Preflight, extra: dict[str, Any]) -> dict[str, Any]:
    """The run manifest: ids, fingerprints, paths. Never a header value or a secret."""
    job = preflight.job
    return {
        "name": job.config.name,
        "job_path": str(job.path),
        "input": {"path": str(preflight.input_spec.path.resolve()), **preflight.input_fingerprint.to_dict()},
        "config_sha256": preflight.config_fingerprint,
        "config_sections": config_sections(job.config),
        "cwd": os.getcwd(),
        **extra,
    }


def continue_command(run: RunDir) -> str:
    return f"bulkrelay resume {shlex.quote(str(run.path))}"


async def _relay_with_stops(
    preflight: Preflight,
    run: RunDir,
    start: StartPoint,
    context: tuple[Reporter, RunOptions, StopControl | None],
) -> RelayOutcome:
    reporter, options, given_stop = context
    stop = given_stop or StopControl()  # made here: anyio primitives need the running loop
    async with anyio.create_task_group() as watchers:
        if options.handle_signals:
            watchers.start_soon(watch_signals, stop)
        if options.timeout_seconds is not None:
            watchers.start_soon(stop_at, stop, options.timeout_seconds, TIMEOUT)
        if options.supervisor is not None:
            watchers.start_soon(options.supervisor.watch, stop, preflight, run)
        outcome = await relay(preflight, run, start, stop=stop, reporter=reporter)
        watchers.cancel_scope.cancel()
    return outcome


def relay_locked(
    preflight: Preflight,
    run: RunDir,
    start: StartPoint,
    *,
    options: RunOptions,
    reporter: Reporter,
    stop: StopControl | None = None,
) -> Result:
    """Relay with the run's lock already held and turn the outcome into the command's result."""
    run.set_state(RUNNING, pid=os.getpid())
    if options.supervisor is not None:
        reporter = FanOut(reporter, CallbackReporter(options.supervisor.on_progress))
    try:
        outcome = anyio.run(
            _relay_with_stops,
            preflight,
            run,
            start,
            (reporter, options, stop),
            backend_options={"use_uvloop": True},
        )
    except BaseExceptionGroup as group:
        raise sole_error(group) from None
    finally:
        reporter.close()
    if preflight.digester is not None or run.manifest.get("mirror_deletes"):
        record_deliveries(run)  # from the committed journal only; a crash before this is caught up later
    return _conclude(preflight, run, outcome)


def _conclude(preflight: Preflight, run: RunDir, outcome: RelayOutcome) -> Result:
    committed = outcome.committed
    if outcome.stop_reason is None:
        state = COMPLETED if committed.failed == 0 else COMPLETED_WITH_FAILURES
    elif outcome.stop_reason == CANCELLED:
        state = CANCELLED_STATE
    else:
        state = FORCED if outcome.forced else STOPPED
    summary = write_summary(run, committed.total, outcome)
    run.set_state(state, stop_reason=outcome.stop_reason, pid=None)
    data = {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "state": state,
        "progress": committed.snapshot().to_dict(),
        "summary": summary,
    }
    if state in (STOPPED, FORCED):
        data["continue_command"] = continue_command(run)
    if outcome.stop_reason is None:
        code = ExitCode.SUCCESS if state == COMPLETED else ExitCode.PARTIAL_FAILURE
        error = (
            None
            if code == ExitCode.SUCCESS
            else {
                "code": "PARTIAL_FAILURE",
                "message": f"{committed.failed} of {committed.total} rows failed",
                "retryable": False,
                "suggestion": f"bulkrelay retry-failed {shlex.quote(str(run.path))}",
            }
        )
        return Result(data=data, exit_code=code, error=error, kind="run")
    code_name, exit_code, message = _STOPS.get(
        outcome.stop_reason, ("INCOMPLETE", ExitCode.GENERAL_ERROR, "the run ended early")
    )
    error = {
        "code": code_name,
        "message": f"run {run.run_id}: {message}",
        "retryable": state != CANCELLED_STATE,
        "context": {"run_dir": str(run.path), **outcome.stop_detail},
    }
    if state in (STOPPED, FORCED):
        error["suggestion"] = continue_command(run)
    return Result(data=data, exit_code=exit_code, error=error, kind="run")


def write_summary(run: RunDir, total_rows: int, outcome: RelayOutcome | None) -> dict[str, Any]:
    summary = summarize(run.journal_path, total_rows=total_rows)
    summary["run_id"] = run.run_id
    if "sync" in run.manifest:  # a delta run: rows it did not send because they had not changed
        summary["skipped_unchanged"] = run.manifest["sync"]["skipped_unchanged"]
    if outcome is not None:
        elapsed = outcome.elapsed_seconds
        summary["this_call"] = {
            "rows_committed": outcome.committed.committed_this_run,
            "elapsed_seconds": round(elapsed, 3),
            "rows_per_second": round(outcome.committed.committed_this_run / elapsed, 1) if elapsed else None,
        }
    summary["updated_at"] = utc_now()
    write_json_atomic(run.path / SUMMARY, summary, run.storage)
    return summary


def prepare_input(input_arg: str | None, spool_dir: Path, suffix: str) -> Path | None:
    """`--input -` is read to a file first, so preflight and sending can both read it."""
    if input_arg is None:
        return None
    if input_arg != "-":
        return Path(input_arg)
    return spool_stdin_into(spool_dir, sys.stdin.buffer, suffix)


def start_fresh(
    preflight: Preflight,
    runs_dir: Path,
    options: RunOptions,
    reporter: Reporter,
    *,
    manifest: dict[str, Any],
    spooled: bool = False,
    on_created: Callable[[RunDir], None] | None = None,
    start: StartPoint | None = None,
) -> Result:
    """Create a run directory for a preflighted job and relay it. A spooled stdin moves into the run."""
    run = RunDir.create(runs_dir, manifest_for(preflight, {"parent_run": None, **manifest}))
    if on_created is not None:
        on_created(run)
    if spooled:
        preflight = _keep_spool(run, preflight)
    with run.locked():
        return relay_locked(preflight, run, start or StartPoint(), options=options, reporter=reporter)


def _keep_spool(run: RunDir, preflight: Preflight) -> Preflight:
    spool = preflight.input_spec.path
    kept = run.path / f"input{''.join(spool.suffixes)}"
    os.replace(spool, kept)
    run.manifest["input"]["path"] = str(kept.resolve())
    run.save()
    return replace(preflight, input_spec=replace(preflight.input_spec, path=kept))


def continue_run(run: RunDir, preflight: Preflight, options: RunOptions, reporter: Reporter) -> Result:
    """Relay what a stopped or crashed run has not committed yet; the caller checked the fingerprints."""
    with run.locked():
        start, warnings = recover_start(run, preflight.record_count)
        result = relay_locked(preflight, run, start, options=options, reporter=reporter)
    result.warnings[:0] = warnings
    return result
