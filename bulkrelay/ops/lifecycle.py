"""One run's life: create or reopen its directory, hold its lock, relay, record how it ended.

`run`, `resume` and `retry-failed` differ only in how they find their run and start point;
from there they share `relay_locked()`, which maps the engine's outcome to a run state, a
summary and a `Result` with the exit code docs/exit-codes.md names.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Protocol

import anyio

from bulkrelay.envelope import EnvelopeWarning, ErrorInfo, Result, deprecation_warnings
from bulkrelay.errors import (
    BulkRelayError,
    ExitCode,
    StorageFailed,
    SyncStateBusy,
    SyncStateCorrupt,
    UsageError,
    sole_error,
)
from bulkrelay.job.config import JobConfig, many_rows_a_request
from bulkrelay.job.inputs import let_go_of_spool, spool_stdin_into
from bulkrelay.job.inputs.lookups import map_record
from bulkrelay.job.preflight import Preflight, RowsRead
from bulkrelay.ops.results import RunResult
from bulkrelay.ops.resultsink import RunSink, close_sink, open_sink, sink_target
from bulkrelay.ops.resume import config_sections, recover_start
from bulkrelay.ops.workers import LocalWorkers, worker_count
from bulkrelay.relay.affinity import relay_cpu
from bulkrelay.relay.engine import RelayOutcome, StartPoint, WorkerPool, relay
from bulkrelay.relay.heap import relay_collections
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.progress import CallbackReporter, FanOut, Reporter, Snapshot
from bulkrelay.relay.stopping import IdleWatchdog, RowLimit, StopControl, StopReason, stop_at, watch_signals
from bulkrelay.store.atomic import move_file, read_json, write_json_atomic
from bulkrelay.store.liverun import LiveSlot
from bulkrelay.store.manifest import InputRecord, RunPlan
from bulkrelay.store.rundir import SUMMARY, RunDir, RunState, utc_now
from bulkrelay.store.summary import RequestCounts, RunSummary, ThisCall, summarize
from bulkrelay.sync import record_deliveries

# How each stop reason ends a run: (error code, exit code, message).
_STOPS: dict[StopReason, tuple[str, ExitCode, str]] = {
    StopReason.INTERRUPTED: ("INTERRUPTED", ExitCode.SIGINT, "stopped by SIGINT at a safe point"),
    StopReason.TERMINATED: ("TERMINATED", ExitCode.SIGTERM, "stopped by SIGTERM at a safe point"),
    StopReason.TIMEOUT: ("TIMEOUT", ExitCode.TIMEOUT, "the time limit was reached; stopped at a safe point"),
    StopReason.STALLED: ("STALLED", ExitCode.TIMEOUT, "no progress for the idle timeout; stopped"),
    StopReason.HALT_AUTH: (
        "TARGET_AUTH_FAILED",
        ExitCode.AUTH_REQUIRED,
        "the target refused our credentials; halted",
    ),
    StopReason.HALT_UNAVAILABLE: (
        "TARGET_UNAVAILABLE",
        ExitCode.UNAVAILABLE,
        "the target looks down; halted",
    ),
    StopReason.HALT_LIMIT_UNAVAILABLE: (
        "SHARED_LIMIT_UNAVAILABLE",
        ExitCode.UNAVAILABLE,
        "the shared rate limit cannot be reached, and no shard sends without it; halted",
    ),
    StopReason.TOKEN_REFUSED: (
        "TARGET_AUTH_FAILED",
        ExitCode.AUTH_REQUIRED,
        "the OAuth2 token endpoint refused the client; halted",
    ),
    StopReason.TOKEN_UNAVAILABLE: (
        "TARGET_UNAVAILABLE",
        ExitCode.UNAVAILABLE,
        "no OAuth2 token could be had from the token endpoint; halted",
    ),
    StopReason.AUTH_UNUSABLE: (
        "TARGET_AUTH_FAILED",
        ExitCode.AUTH_REQUIRED,
        "request.auth has no credentials to sign with; halted",
    ),
    StopReason.SIGNATURE_REFUSED: (
        "TARGET_AUTH_FAILED",
        ExitCode.AUTH_REQUIRED,
        "the target refused the request's signature; halted",
    ),
    StopReason.HALT_FAILURE_RATE: (
        "FAILURE_RATE_EXCEEDED",
        ExitCode.PARTIAL_FAILURE,
        "too many rows failed (halt.failure_rate); halted",
    ),
    StopReason.CANCELLED: ("CANCELLED", ExitCode.SIGTERM, "the job was cancelled"),
    StopReason.WORKER_LOST: (
        "WORKER_LOST",
        ExitCode.GENERAL_ERROR,
        "a worker process of the run died; the others stopped at a safe point",
    ),
    StopReason.INPUT_CHANGED: (
        "INPUT_CHANGED",
        ExitCode.PRECONDITION,
        "the input changed during the run, so nothing more was read from it; stopped at a safe point",
    ),
}


# Stops whose detail carries a `message` saying what happened, shown as the error's detail.
_SAYS_WHY = frozenset(
    {
        StopReason.INPUT_CHANGED,
        StopReason.TOKEN_REFUSED,
        StopReason.TOKEN_UNAVAILABLE,
        StopReason.HALT_UNAVAILABLE,
        StopReason.AUTH_UNUSABLE,
        StopReason.SIGNATURE_REFUSED,
        StopReason.WORKER_LOST,
    }
)


class Supervisor(Protocol):
    """What a background worker adds to a run: it hears each step as it happens, so a hand-off can
    say where the work is (preflight and its rows read, the run directory, warnings so far), sees
    the progress, and may request a stop."""

    def on_rows_read(self, rows_read: int) -> None: ...

    def on_run(self, run: RunDir) -> None: ...

    def on_warnings(self, warnings: Sequence[EnvelopeWarning]) -> None: ...

    def on_progress(self, snapshot: Snapshot) -> None: ...

    async def watch(self, stop: StopControl, preflight: Preflight, run: RunDir) -> None: ...


class RunObserver(Protocol):
    """Something that follows a run from the outside (the metrics file, the run log).

    The seam for anything that reports on runs: it never changes what the run does."""

    def run_started(self, run: RunDir, preflight: Preflight, stats: RelayStats) -> None: ...

    def progressed(self, snapshot: Snapshot) -> None: ...  # about once a second while relaying

    def stop_requested(self, reason: StopReason, detail: dict[str, object]) -> None: ...

    def run_finished(self, run: RunDir, result: Result) -> None: ...  # may add warnings to `result`


@dataclass(frozen=True)
class RunOptions:
    """How one invocation relays. Its time limit is `--timeout` when given, else the job's
    `max_lifetime_seconds`; both belong to the invocation (a lost job's continuation carries
    its predecessor's over, through `deadline` and `started_at`)."""

    timeout_seconds: float | None = None  # --timeout, counted from the start of the relay
    handle_signals: bool = True
    supervisor: Supervisor | None = None  # set by the background job worker (bulkrelay.background.worker)
    deadline: float | None = None  # an absolute --timeout (epoch seconds), a background job's
    started_at: float | None = None  # when the work began (epoch seconds); None: now
    observers: tuple[RunObserver, ...] = ()
    quiet: bool = False  # no progress on stderr (`--quiet`)
    limit: int | None = None  # `run --limit N`: send the first N pending rows, then stop (a canary)
    workers: int | str | None = None  # `--workers N|auto`: the job's execution.workers for this call

    @property
    def rows_read(self) -> RowsRead | None:
        """Where preflight reports its rows read, when a supervisor listens."""
        return None if self.supervisor is None else self.supervisor.on_rows_read

    def announce_run(self, run: RunDir) -> None:
        if self.supervisor is not None:
            self.supervisor.on_run(run)

    def announce_warnings(self, warnings: Sequence[EnvelopeWarning]) -> None:
        if self.supervisor is not None and warnings:
            self.supervisor.on_warnings(warnings)


def _time_limit(options: RunOptions, max_lifetime_seconds: float) -> tuple[float, dict[str, object]]:
    """Seconds this relay may take, and what set them (for the TIMEOUT error's context)."""
    now = time.time()
    if options.deadline is not None:
        end, limit = options.deadline, "--timeout"
    elif options.timeout_seconds is not None:
        end, limit = now + options.timeout_seconds, "--timeout"
    else:
        began = options.started_at if options.started_at is not None else now
        end, limit = began + max_lifetime_seconds, "max_lifetime_seconds"
    deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
    return end - now, {"limit": limit, "deadline": deadline}


def plan_for(preflight: Preflight) -> RunPlan:
    """What a new run's manifest records of a preflighted job: fingerprints, paths, a query's text.
    Never a header value or a secret. The maker adds its own part (parent, invocation, shard, ...)
    by `replace`."""
    job = preflight.job
    path = str(preflight.input_spec.path.resolve())
    return RunPlan(
        name=job.config.name,
        job_path=str(job.path),
        input=InputRecord(
            path=path,
            source=preflight.input_spec.source,
            query=job.config.input.query if preflight.input_spec.query_answer else None,
            **preflight.input_fingerprint.to_dict(),
        ),
        config_sha256=preflight.config_fingerprint,
        config_sections=config_sections(job.config),
        cwd=os.getcwd(),
        lookups={name: map_record(table) for name, table in job.lookups.items()} or None,
    )


def continue_command(run: RunDir) -> str:
    return f"bulkrelay resume {shlex.quote(str(run.path))}"


async def _relay_with_stops(
    preflight: Preflight,
    run: RunDir,
    start: StartPoint,
    context: tuple[Reporter, RunOptions, StopControl | None, RelayStats],
    sink: RunSink | None = None,
    *,
    pool: WorkerPool | None = None,
) -> RelayOutcome:
    reporter, options, given_stop, stats = context
    stop = given_stop or StopControl()  # made here: anyio primitives need the running loop
    execution = preflight.job.config.execution
    delay, limit = _time_limit(options, execution.max_lifetime_seconds)
    idle = IdleWatchdog(execution.idle_timeout_seconds)  # every run, foreground or background
    reporter = FanOut(reporter, CallbackReporter(lambda snapshot: idle.progressed(snapshot.movement)))
    async with anyio.create_task_group() as watchers:
        if options.handle_signals:
            watchers.start_soon(watch_signals, stop)
        watchers.start_soon(partial(stop_at, stop, delay, StopReason.TIMEOUT, **limit))
        watchers.start_soon(idle.watch, stop)
        if options.supervisor is not None:
            watchers.start_soon(options.supervisor.watch, stop, preflight, run)
        watchers.start_soon(_announce_stop, stop, options.observers)

        def on_tick(snapshot: Snapshot) -> None:
            for observer in options.observers:
                observer.progressed(snapshot)

        on_committed = None if sink is None else sink.on_commit
        outcome = await relay(
            preflight,
            run,
            start,
            stop=stop,
            reporter=reporter,
            stats=stats,
            on_tick=on_tick,
            on_committed=on_committed,
            limit=None if options.limit is None else RowLimit(options.limit),
            pool=pool,
        )
        watchers.cancel_scope.cancel()
    return outcome


async def _announce_stop(stop: StopControl, observers: tuple[RunObserver, ...]) -> None:
    await stop.wait()
    assert stop.reason is not None  # wait() returns once a reason is set
    for observer in observers:
        observer.stop_requested(stop.reason, dict(stop.detail))


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
    target = sink_target(preflight.job)
    run.mark_running(os.getpid())
    if options.supervisor is not None:
        reporter = FanOut(reporter, CallbackReporter(options.supervisor.on_progress))
    stats = RelayStats()
    for observer in options.observers:
        observer.run_started(run, preflight, stats)
    sink = None if target is None else open_sink(target, run)
    sink_behind = None
    pool: LocalWorkers | None = None
    try:
        try:
            spared = [] if sink is None else sink.spared()  # the sink's feeder: not on the relay's CPU
            with relay_collections():
                pool = worker_pool(preflight, run, start, options)  # forked after the collection
                pin = preflight.job.config.execution.pin_cpu and pool is None  # else each worker pins
                with relay_cpu(pin, spared):
                    outcome = anyio.run(
                        partial(_relay_with_stops, pool=pool),
                        preflight,
                        run,
                        start,
                        (reporter, options, stop, stats),
                        sink,
                        backend_options={"use_uvloop": True},
                    )
        except BaseExceptionGroup as group:
            raise sole_error(group) from None
        finally:
            reporter.close()
            if pool is not None:
                pool.close()
            sink_behind = None if sink is None else close_sink(sink)
        behind = None
        if preflight.digester is not None or run.plan.mirror_deletes:
            behind = _record_deliveries(run)
        result = _conclude(preflight, run, outcome)
        result.warnings.extend(w for w in (behind, sink_behind, _skipped(preflight)) if w is not None)
    except BulkRelayError as exc:
        if isinstance(exc, StorageFailed):
            _say_how_to_continue(exc, run)
        _notify_finished(options.observers, run, Result.from_error(exc))
        raise
    result.warnings[:0] = deprecation_warnings(preflight.job.deprecations)
    _notify_finished(options.observers, run, result)
    return result


def refuse_workers_flag(config: JobConfig, workers: int | str | None) -> None:
    """`--workers N` (N > 1) for a job that sends many rows a request is refused as the job file's
    `execution.workers: N` is, before any input is read: it would run in one process without a word."""
    kind = many_rows_a_request(config)
    if kind is not None and workers not in {None, "auto", 1}:
        raise UsageError(
            f"--workers {workers}: several worker processes send rows one request each; request.{kind} "
            "sends many rows a request, in one process",
            suggestion="leave out --workers (or give --workers auto, which runs such a job in one process)",
        )


def worker_pool(
    preflight: Preflight, run: RunDir, start: StartPoint, options: RunOptions
) -> LocalWorkers | None:
    """The worker processes `execution.workers` (or `--workers`) asks for; None: this process sends
    the rows itself, as it does for one worker, for `--limit` (the first N rows are one window's), and
    for a job that sends many rows a request (a batch, a group, a bulk job)."""
    execution = preflight.job.config.execution
    count = worker_count(options.workers or execution.workers, execution.concurrency)
    many_a_request = preflight.batcher is not None or preflight.bulk is not None
    if count == 1 or options.limit is not None or many_a_request:
        return None
    return LocalWorkers(preflight, run, start, count)


def _skipped(preflight: Preflight) -> EnvelopeWarning | None:
    """LOOKUP_MISSES_SKIPPED: rows a lookup with `on_miss: skip` lacked, journaled unsent."""
    misses = preflight.lookup_misses
    if not misses:
        return None
    return EnvelopeWarning(
        "LOOKUP_MISSES_SKIPPED",
        f"{misses} row(s) had a key their lookup lacks (on_miss: skip): journaled unsent as lookup_miss; "
        "`bulkrelay retry-failed RUN --classification lookup_miss` sends them once their keys exist",
        {"rows": misses},
    )


def _record_deliveries(run: RunDir) -> EnvelopeWarning | None:
    """Apply the run's committed successes to its sync state (from the journal only; a crash before
    this is caught up later). A state that is busy or damaged does not undo a delivery: the run ends
    as it went, with a SYNC_STATE_BEHIND warning, and the next run catches the state up from this
    run's journal (or `sync-state rebuild` remakes it)."""
    try:
        record_deliveries(run)
    except (SyncStateBusy, SyncStateCorrupt) as exc:
        return EnvelopeWarning(
            "SYNC_STATE_BEHIND",
            f"{exc.message}; this run's deliveries are in its journal and reach the state on the next run",
            {"run_dir": str(run.path), "reason": exc.code, **exc.context},
        )
    return None


def _say_how_to_continue(failed: StorageFailed, run: RunDir) -> None:
    """Committed rows are safe; the rest is resumable once the disk is fixed: say where and how."""
    failed.data = {"run_id": run.run_id, "run_dir": str(run.path), "continue_command": continue_command(run)}
    failed.suggestion = failed.suggestion or f"fix the disk, then: {continue_command(run)}"


def _notify_finished(observers: tuple[RunObserver, ...], run: RunDir, result: Result) -> None:
    """The "run finished" hook: every observer hears how the run ended, whatever ended it."""
    for observer in observers:
        observer.run_finished(run, result)


def _conclude(preflight: Preflight, run: RunDir, outcome: RelayOutcome) -> Result:
    committed = outcome.committed
    if outcome.stop_reason is None:
        state = RunState.COMPLETED if committed.failed == 0 else RunState.COMPLETED_WITH_FAILURES
    elif outcome.stop_reason is StopReason.CANCELLED:
        state = RunState.CANCELLED
    else:
        state = RunState.FORCED if outcome.forced else RunState.STOPPED
    summary = write_summary(run, committed.total, outcome)
    run.mark_ended(state, outcome.stop_reason)
    data = RunResult(
        run_id=run.run_id,
        run_dir=str(run.path),
        state=state,
        progress=committed.snapshot(),
        summary=summary,
        continue_command=continue_command(run) if state.resumable else None,
    )
    if outcome.stop_reason is None or outcome.stop_reason is StopReason.LIMIT:
        return _ended_as_asked(run, data, outcome)
    code_name, exit_code, message = _stop_said(outcome.stop_reason, outcome.stop_detail, state)
    error = ErrorInfo(
        code_name,
        f"run {run.run_id}: {message}",
        retryable=state is not RunState.CANCELLED,
        context={"run_dir": str(run.path), **outcome.stop_detail},
        order=_STOP_ERROR_KEYS,
    )
    if state.resumable:
        error = replace(error, suggestion=continue_command(run))
        if outcome.stop_reason in _SAYS_WHY:  # e.g. "data.csv changed ...: size 1 -> 2", "invalid_client"
            error = replace(error, detail=str(outcome.stop_detail.get("message", "")))
        if outcome.stop_reason is StopReason.INPUT_CHANGED:
            error = replace(
                error, suggestion=f"restore the input preflight read, then: {continue_command(run)}"
            )
        if outcome.stop_reason is StopReason.HALT_UNAVAILABLE:
            error = replace(error, message=f"run {run.run_id}: {_down_message(outcome.stop_detail)}")
        if outcome.stop_reason in (StopReason.AUTH_UNUSABLE, StopReason.SIGNATURE_REFUSED):
            error = replace(
                error,
                message=f"run {run.run_id}: {outcome.stop_detail.get('message')}; halted",
                suggestion="fix request.auth or its credentials (bulkrelay validate --check-auth JOB checks "
                f"them alone), then: {continue_command(run)}",
            )
        if outcome.stop_reason is StopReason.TOKEN_REFUSED:
            error = replace(
                error,
                message=f"run {run.run_id}: {outcome.stop_detail.get('message')}; halted",
                suggestion="fix request.auth.oauth2 or its secrets (bulkrelay validate --check-auth JOB asks "
                f"the endpoint alone), then: {continue_command(run)}",
            )
    if outcome.stop_reason is StopReason.HALT_FAILURE_RATE:
        failures = f"bulkrelay failures {shlex.quote(str(run.path))}"
        error = replace(
            error,
            message=f"run {run.run_id}: {_failure_rate_message(outcome.stop_detail)}",
            suggestion=f"see `{failures}`; fix the cause, then: {continue_command(run)}",
        )
    killed = _workers_killed(outcome.stop_detail)
    return Result(data=data, exit_code=exit_code, error=error, warnings=[] if killed is None else [killed])


def _stop_said(
    reason: StopReason, detail: Mapping[str, object], state: RunState
) -> tuple[str, ExitCode, str]:
    """The stop's error code, exit code and message."""
    code_name, exit_code, message = _STOPS.get(
        reason, ("INCOMPLETE", ExitCode.GENERAL_ERROR, "the run ended early")
    )
    if reason is StopReason.TERMINATED:  # SIGTERM or SIGHUP: the signal it was
        message = message.replace("SIGTERM", str(detail.get("signal", "SIGTERM")))
    if state is RunState.FORCED:
        message = _forced_message(reason, message)
    return code_name, exit_code, message


def _workers_killed(detail: Mapping[str, object]) -> EnvelopeWarning | None:
    """A worker that had not ended within its stop's bound was killed (ops/workers.py): say which, and
    what became of its rows in flight."""
    killed = detail.get("workers_killed")
    if not isinstance(killed, list):
        return None
    which = ", ".join(f"worker {entry['worker']} (pid {entry['pid']})" for entry in killed)
    after = detail.get("workers_killed_after_seconds")
    return EnvelopeWarning(
        "WORKER_KILLED",
        f"{which} had not ended {after} s after the run was asked to stop (hung or stopped), so it was "
        "killed (SIGKILL); its rows in flight stay pending, and a resume sends them again",
        {"workers_killed": killed},
    )


def _ended_as_asked(run: RunDir, data: RunResult, outcome: RelayOutcome) -> Result:
    """Every row has its result, or `--limit` rows have: exit 0, or 3 when some of them failed."""
    if outcome.stop_reason is StopReason.LIMIT:
        return _limit_reached(run, data, outcome)
    committed = outcome.committed
    code = ExitCode.SUCCESS if data.state is RunState.COMPLETED else ExitCode.PARTIAL_FAILURE
    error = (
        None
        if code == ExitCode.SUCCESS
        else ErrorInfo(
            "PARTIAL_FAILURE",
            f"{committed.failed} of {committed.total} rows failed",
            retryable=False,
            suggestion=f"bulkrelay retry-failed {shlex.quote(str(run.path))}",
        )
    )
    return Result(data=data, exit_code=code, error=error)


def _limit_reached(run: RunDir, data: RunResult, outcome: RelayOutcome) -> Result:
    """`run --limit N` sent its rows and stopped, as asked: exit 0 with LIMIT_REACHED saying how to go
    on; exit 3 when some of the canary's rows failed, so that `run --limit 10 && run` stops there."""
    limit, failed = outcome.stop_detail.get("limit"), outcome.committed.failed
    warning = EnvelopeWarning(
        "LIMIT_REACHED",
        f"run {run.run_id} stopped after --limit {limit} rows, as asked; the identical command without "
        f"--limit continues it without sending them again, as does: {continue_command(run)}",
        {"run_dir": str(run.path), "limit": limit, "continue_command": continue_command(run)},
    )
    error = None
    if failed:
        error = ErrorInfo(
            "PARTIAL_FAILURE",
            f"{failed} of the run's {data.progress.done} rows sent so far failed",
            retryable=False,
            suggestion=f"bulkrelay failures {shlex.quote(str(run.path))}",
        )
    code = ExitCode.PARTIAL_FAILURE if failed else ExitCode.SUCCESS
    return Result(data=data, exit_code=code, error=error, warnings=[warning])


def _down_message(detail: Mapping[str, object]) -> str:
    """Why the target looks down, in the words of the last failure: a refused connection, an untrusted
    certificate and a 503 call for different fixes."""
    count = detail.get("consecutive_failures")
    return f"the target looks down ({count} failures in a row, the last: {detail['message']}); halted"


# A stop's error has always said its context first, its stop detail last (the envelope is kept to the byte).
_STOP_ERROR_KEYS = ("code", "message", "retryable", "context", "suggestion", "detail")


def _failure_rate_message(detail: dict[str, object]) -> str:
    """The halt in numbers: '41 of 50 rows failed (82%), more than 20% after 50 rows; commonest: HTTP 422'."""
    commonest = detail["commonest_error"]
    assert isinstance(commonest, dict)
    failed, rows, share, above = detail["failed"], detail["rows"], detail["failure_rate"], detail["above"]
    assert isinstance(share, float) and isinstance(above, float | int)
    what = commonest["error"] or commonest["classification"]
    return (
        f"{failed} of {rows} rows failed ({share:.0%}), more than "
        f"halt.failure_rate.above {above:.0%} "
        f"after {detail['after_rows']} rows; halted. Commonest error: {what} ({commonest['rows']} rows)"
    )


def _forced_message(stop_reason: StopReason, message: str) -> str:
    """A forced stop did not wait for a safe point: say so, and what became of the rows in flight."""
    cancelled = "the rows in flight were cancelled (state forced); resume sends them again"
    if stop_reason is StopReason.INTERRUPTED:
        return f"stopped by a second SIGINT: {cancelled}"
    return f"{message.removesuffix(' at a safe point')}; {cancelled}"


def summary_counts(run: RunDir, total_rows: int, outcome: RelayOutcome | None) -> RunSummary:
    """The relay's own counts when they cover the whole journal (it wrote every line from the
    start, and the file holds exactly the bytes it committed); else one read of the journal."""
    committed = outcome.committed if outcome is not None else None
    if committed is not None and committed.counts is not None:
        with suppress(OSError):
            if run.journal_path.stat().st_size == committed.offset:
                return committed.counts.report(total_rows)
    return summarize(run.journal_path, total_rows=total_rows)


def write_summary(run: RunDir, total_rows: int, outcome: RelayOutcome | None) -> RunSummary:
    this_call = None
    if outcome is not None:
        elapsed, committed = outcome.elapsed_seconds, outcome.committed.committed_this_run
        rate = round(committed / elapsed, 1) if elapsed else None
        this_call = ThisCall(committed, round(elapsed, 3), rate)
    requests = outcome.requests if outcome is not None else None
    earlier = _earlier_requests(run)  # the run's earlier calls', as its last summary counted them
    if earlier is not None:
        requests = earlier if requests is None else earlier.plus(requests)
    summary = replace(
        summary_counts(run, total_rows, outcome),
        requests=requests,
        run_id=run.run_id,
        # a delta run: rows it did not send because they had not changed
        skipped_unchanged=run.plan.sync.skipped_unchanged if run.plan.sync is not None else None,
        this_call=this_call,
        updated_at=utc_now(),
    )
    write_json_atomic(run.path / SUMMARY, summary.to_json(), run.storage)
    return summary


def _earlier_requests(run: RunDir) -> RequestCounts | None:
    with suppress(BulkRelayError):
        summary = read_json(run.path / SUMMARY)
        return RequestCounts.from_json(summary.get("requests")) if isinstance(summary, dict) else None
    return None


@contextmanager
def prepared_input(input_arg: str | None, spool_dir: Path, suffix: str) -> Iterator[Path | None]:
    """`--input -` is read to a private file first, so preflight and sending can both read it.

    The copy is removed when the command ends, however it ends, unless a run took it (moved it into
    its own directory): nothing read from stdin outlives the command that read it."""
    if input_arg != "-":
        yield None if input_arg is None else Path(input_arg)
        return
    spool = spool_stdin_into(spool_dir, sys.stdin.buffer, suffix).path
    try:
        yield spool
    finally:
        spool.unlink(missing_ok=True)
        let_go_of_spool(spool_dir)


def start_fresh(
    preflight: Preflight,
    runs_dir: Path,
    options: RunOptions,
    reporter: Reporter,
    *,
    slot: LiveSlot,
    plan: RunPlan,
    spooled: bool = False,
    prepare: Callable[[RunDir], None] | None = None,
    start: StartPoint | None = None,
) -> Result:
    """Create a run directory for a preflighted job and relay it, holding the job's live slot.

    A spooled stdin moves into the run and `prepare` completes it (an index entry, a selection)
    before the run appears under its own name, so a crash never leaves half a run behind."""

    def complete(run: RunDir, final: Path) -> None:
        if spooled:
            _keep_spool(run, final, preflight.input_spec.path)
        if prepare is not None:
            prepare(run)

    run = RunDir.create(runs_dir, plan, staging=slot.directory, before_publish=complete)
    if spooled:  # the run reads its own copy now
        kept = Path(run.plan.input.path)
        preflight = preflight.kept_at(kept)
    slot.claim(run)
    options.announce_run(run)
    with run.locked():
        return relay_locked(preflight, run, start or StartPoint(), options=options, reporter=reporter)


def _keep_spool(run: RunDir, final: Path, spool: Path) -> None:
    """Move the spooled stdin into the run being built; its manifest names where it will be."""
    name = f"input{''.join(spool.suffixes)}"
    move_file(spool, run.path / name, run.storage)
    run.save(replace(run.manifest, plan=run.plan.with_input_path(final.resolve() / name)))


def continue_run(
    run: RunDir, preflight: Preflight, options: RunOptions, reporter: Reporter, *, slot: LiveSlot
) -> Result:
    """Relay what a stopped or crashed run has not committed yet; the caller checked the fingerprints."""
    slot.claim(run)
    options.announce_run(run)
    with run.locked():
        start, warnings = recover_start(run, preflight.record_count)
        options.announce_warnings(warnings)
        result = relay_locked(preflight, run, start, options=options, reporter=reporter)
    result.warnings[:0] = warnings
    return result
