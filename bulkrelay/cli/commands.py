"""The commands: each call's options turned into one library call, in one pipeline that reads in order.

`run_call` takes the typed call (bulkrelay.background.call) that cli/parser.py made of the command line.
The commands that relay (run, resume, retry-failed) and the demo keep a run log around their work; the
ones that relay run within the call budget, handed to a background job when they outlast it.
"""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkrelay.background import jobs
from bulkrelay.background.budget import resolve_budget
from bulkrelay.background.call import (
    Call,
    CommandArgs,
    CompletionArgs,
    DemoArgs,
    ExportArgs,
    FailuresArgs,
    JobArgs,
    PruneArgs,
    RelayArgs,
    RenderArgs,
    ReportArgs,
    ResumeArgs,
    RetryFailedArgs,
    RunArgs,
    RunsArgs,
    ShardsArgs,
    StatusArgs,
    SyncStateArgs,
    ValidateArgs,
)
from bulkrelay.cli import watching
from bulkrelay.envelope import CommandData, EnvelopeWarning, Result, SideChannel
from bulkrelay.errors import BulkRelayError, ExitCode, UsageError
from bulkrelay.job.config import Job, load_job
from bulkrelay.job.inputs import STDIN_NAME
from bulkrelay.ops import launch, preview
from bulkrelay.ops.invocation import refuse_unrecordable
from bulkrelay.ops.lifecycle import RunObserver, RunOptions, prepared_input
from bulkrelay.ops.results import RunResult
from bulkrelay.ops.runlog import RunLog, start_event
from bulkrelay.ops.sharding import ShardSpec, resolve_shard
from bulkrelay.ops.snapshot import is_query_job, parquet_input, passing_snapshot, refuse_input_override
from bulkrelay.relay.metrics import MetricsFile, MetricsPush, metrics_path, metrics_push_url
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.runs import default_runs_dir, resolve_run

if TYPE_CHECKING:
    from bulkrelay.background.worker import BackgroundSupervisor


@dataclass(frozen=True)
class Runtime:
    """What a call runs with besides its options: when it began (its budget counts from there) and, in a
    background job's worker, the supervisor that owns the job's signals and bounds."""

    started: float
    supervisor: BackgroundSupervisor | None = None


def run_call(call: Call, runtime: Runtime) -> Result:
    """The call's library function, with a run log around the ones that keep one."""
    if isinstance(call.options, RelayArgs | DemoArgs):
        return _logged(call, runtime)
    return _direct(call.command, call.options)


def _direct(command: str, options: CommandArgs) -> Result:
    """The commands that keep no run log: each one library call."""
    match options:
        case ValidateArgs():
            return _validate(options)
        case RenderArgs():
            return _render(options)
        case (
            StatusArgs() | RunsArgs() | JobArgs()
        ):  # the program's own call goes there straight (cli/main.py)
            return watching.watch(command, options)
        case ShardsArgs():
            return _shards(options)
        case ExportArgs():
            return _export(options)
        case FailuresArgs():
            return _failures(options)
        case ReportArgs():
            return _report(options)
        case PruneArgs():
            return _prune(options)
        case CompletionArgs():
            return _completion(options)
        case SyncStateArgs():
            return _sync_state(command, options)
    raise UsageError("a command is required", suggestion="see `bulkrelay --help`")


def _logged(call: Call, runtime: Runtime) -> Result:
    """A call with a run log, in the order it happens: the log's `start` line; the work
    (`_observed`); the `exit` line, also when the work raised; then `--report`, which needs the exit
    code (see bulkrelay.ops.runlog)."""
    options = call.options
    run_log = RunLog(options.log_file if isinstance(options, RelayArgs) else None)
    start_event(run_log, call.command, list(call.argv))
    try:
        result = _observed(call, runtime, run_log)
    except BulkRelayError as exc:
        result = Result.from_error(exc)
    except BaseException as exc:  # logged, then left to the CLI's catch site
        interrupted = isinstance(exc, KeyboardInterrupt)
        run_log.exit(Result(exit_code=ExitCode.SIGINT if interrupted else ExitCode.GENERAL_ERROR))
        run_log.close()
        raise
    run_log.exit(result)
    run_log.close()
    if isinstance(options, RelayArgs) and options.report:  # after the exit line: the report has the code
        _write_report(result)
    _notify(result)
    return result


def _notify(result: Result) -> None:
    """The job's `notify:` messages once its call has ended (with the report's path, when written);
    one not delivered is a warning, never a change to the exit code."""
    data = result.data
    if not isinstance(data, RunResult):
        return
    try:
        run = RunDir.open(Path(data.run_dir))
        job = load_job(Path(run.plan.job_path))
    except BulkRelayError:
        return  # the job file moved since: nothing to read its notify entries from
    if not job.config.notify:
        return
    from bulkrelay.ops.notify import notify  # loaded only for a job that notifies

    result.warnings.extend(notify(job.config, data, run.manifest.stop_reason))


def _observed(call: Call, runtime: Runtime, run_log: RunLog) -> Result:
    """The observers made, the paths the call records checked, and the shard (`--shard`, `--shards`,
    their variables) checked first, so a bad path or a typo fails before any input is read, even under
    a call budget (which copies stdin before the run starts); then the work, within the call budget."""
    options = call.options
    metrics_file = options.metrics_file if isinstance(options, RelayArgs) else None
    metrics_push = options.metrics_push if isinstance(options, RelayArgs) else None
    observers = _observers(run_log, metrics_file, metrics_push)
    refuse_unrecordable(_recorded_paths(options))
    if not isinstance(options, RelayArgs):
        assert isinstance(options, DemoArgs)
        return _demo(options, observers)
    shard = resolve_shard(options.shard, options.shards, os.environ) if isinstance(options, RunArgs) else None
    return _within_budget(_Relay(call, options, runtime, observers, shard))


def _recorded_paths(options: CommandArgs) -> list[tuple[str, Path | None]]:
    """The paths a call that makes or continues a run records (besides the working directory): a run's
    job file, input and runs directory; the run directory `resume` and `retry-failed` write in, and the
    files they are pointed at. What cannot be found or loaded is the command's to report, as before."""
    match options:
        case RunArgs():
            return [
                ("job file", options.job),
                ("input file", _input_of_run(options)),
                (_runs_dir_named(options.runs_dir), default_runs_dir(options.runs_dir)),
                ("runs directory (--output-dir)", options.output_dir),
            ]
        case ResumeArgs() | RetryFailedArgs():
            named = options.input if isinstance(options, ResumeArgs) else None
            try:
                run_dir: Path | None = resolve_run(options.run_dir, options.runs_dir)
            except BulkRelayError:
                run_dir = None
            given = Path(named) if named not in (None, "-") else None
            return [("run directory", run_dir), ("job file", options.config), ("input file", given)]
        case DemoArgs():
            return [(_runs_dir_named(options.runs_dir), default_runs_dir(options.runs_dir))]
    return []


def _input_of_run(options: RunArgs) -> Path | None:
    """`--input FILE`, else the job's own input file (none for stdin or a query)."""
    if options.input not in (None, "-"):
        return Path(options.input)
    if options.input == "-":
        return None
    try:
        job = load_job(options.job)
    except BulkRelayError:
        return None
    return None if is_query_job(job) else job.input_path


def _runs_dir_named(explicit: Path | None) -> str:
    from_env = explicit is None and os.environ.get("BULKRELAY_RUNS_DIR")
    return "runs directory (BULKRELAY_RUNS_DIR)" if from_env else "runs directory"


@dataclass(frozen=True)
class _Relay:
    """A call that relays, with what it runs with: its observers and (run) its shard."""

    call: Call
    options: RelayArgs
    runtime: Runtime
    observers: tuple[RunObserver, ...]
    shard: ShardSpec | None


def _within_budget(relay: _Relay) -> Result:
    """The work itself without a budget, or in the background job's worker (the job is the budget's
    business); with a budget, the call starts (or attaches to) its background job and waits for it up
    to the budget. Every envelope says the budget that was resolved (`meta.budget_ms`)."""
    supervisor = relay.runtime.supervisor
    if supervisor is not None:
        supervisor.index_under(lambda stdin: _key(relay, stdin))
        return _relay(relay)
    budget_ms = resolve_budget(relay.options.budget, os.environ, sys.stdout.isatty())
    try:
        if budget_ms:
            result = jobs.hand_off(
                relay.call,
                budget_ms,
                started=relay.runtime.started,
                key_of=lambda stdin: _key(relay, stdin),
                continues=lambda stdin: _continues(relay, stdin),
            )
        else:
            result = _relay(relay)
    except BulkRelayError as exc:
        result = Result.from_error(exc)
    if budget_ms is not None:
        result.meta = replace(result.meta, budget_ms=budget_ms)
    return result


def _relay(relay: _Relay) -> Result:
    options = relay.options
    match options:
        case RunArgs():
            return _run(options, relay)
        case ResumeArgs():
            return _resume(options, relay)
        case RetryFailedArgs():
            return _retry_failed(options, relay)
    raise AssertionError(f"not a command that relays: {relay.call.command}")


def _key(relay: _Relay, spooled_stdin: Path | None) -> str:
    """The background job's key of a budgeted call: the same identity the identical re-run uses."""
    if isinstance(relay.options, RunArgs):
        named = Path(relay.options.input) if relay.options.input not in (None, "-") else None
        return _run_request(relay.options, relay, spooled_stdin or named).key()
    return jobs.arguments_key(relay.call, spooled_stdin)


def _continues(relay: _Relay, spooled_stdin: Path | None) -> RunDir | None:
    """The unfinished run a budgeted call will continue (`resume RUN`, the identical `run`'s, the
    identical `retry-failed`'s child), read before the hand-off."""
    options = relay.options
    if isinstance(options, ResumeArgs):
        return RunDir.open(resolve_run(options.run_dir, options.runs_dir))
    if isinstance(options, RunArgs):
        named = Path(options.input) if options.input not in (None, "-") else None
        return launch.run_to_continue(_run_request(options, relay, spooled_stdin or named))
    if isinstance(options, RetryFailedArgs):
        from bulkrelay.ops import retry_failed as retryfailed  # loaded only for its own command

        parent = resolve_run(options.run_dir, options.runs_dir)
        return retryfailed.child_to_continue(parent, options.config, options.status, options.classification)
    return None


def _prepared_input(
    given: str | None, job: Job | None, spool_dir: Path, *, snapshot: bool = False
) -> AbstractContextManager[Path | None]:
    """The input a command reads: `--input` (`given`; stdin spooled), else the job's file (None); for a
    query job with `snapshot`, its query's snapshot (validate, render), which lives as long as the command."""
    suffix = ""
    if job is not None and is_query_job(job):
        refuse_input_override(job, given)
        return passing_snapshot(job, spool_dir) if snapshot else nullcontext(None)
    named = Path(given) if given not in (None, "-") else None
    parquet = None if job is None else parquet_input(job, named)
    if snapshot and job is not None and parquet is not None:
        return passing_snapshot(job, spool_dir, parquet)
    if job is not None:
        if job.config.input.file:
            suffix = "".join(Path(job.config.input.file).suffixes)
        elif job.config.input.format:
            suffix = f".{job.config.input.format}"
    return prepared_input(given, spool_dir, suffix)


def _input_name(given: str | None, job: Job | None = None) -> str | None:
    """What messages call the input: <stdin>, a Parquet file (not its snapshot), else its path."""
    if given == "-":
        return STDIN_NAME
    named = Path(given) if given is not None else None
    parquet = None if job is None else parquet_input(job, named)
    return None if parquet is None else str(parquet)


def _validate(options: ValidateArgs) -> Result:
    job = load_job(options.job)
    spool_dir = default_runs_dir(None) / ".spool"
    with _prepared_input(options.input, job, spool_dir, snapshot=True) as input_path:
        name = _input_name(options.input, job)
        return preview.validate(job, input_path, name, check_auth=options.check_auth)


def _render(options: RenderArgs) -> Result:
    job = load_job(options.job)
    spool_dir = default_runs_dir(None) / ".spool"
    with _prepared_input(options.input, job, spool_dir, snapshot=True) as input_path:
        name = _input_name(options.input, job)
        return preview.render(job, input_path, options.rows, name, curl=options.curl)


def _options(relay: _Relay) -> RunOptions:
    supervisor = relay.runtime.supervisor
    quiet, observers = relay.call.quiet, relay.observers
    if supervisor is not None:  # a background worker: its supervisor owns signals and the job's bounds
        return RunOptions(
            handle_signals=False,
            supervisor=supervisor,
            deadline=supervisor.deadline,
            started_at=supervisor.started_at,
            observers=observers,
            quiet=quiet,
            workers=relay.options.workers,
        )
    timeout_ms = relay.options.timeout
    return RunOptions(
        timeout_seconds=timeout_ms / 1000 if timeout_ms is not None else None,
        observers=observers,
        quiet=quiet,
        workers=relay.options.workers,
    )


def _observers(run_log: RunLog, metrics_file: Path | None, push_url: str | None) -> tuple[RunObserver, ...]:
    """The run log (always), the metrics file (`--metrics-file` or BULKRELAY_METRICS_FILE) and the push
    to a Pushgateway (`--metrics-push` or BULKRELAY_METRICS_PUSH)."""
    observers: list[RunObserver] = [run_log]
    path = metrics_path(metrics_file, os.environ)
    if path is not None:
        observers.append(MetricsFile(path))
    push = metrics_push_url(push_url, os.environ)
    if push is not None:
        observers.append(MetricsPush(push))
    return tuple(observers)


def _write_report(result: Result) -> None:
    """`--report`: the run's report beside it once the call has ended; a failure is a warning, never a
    failed run. A call handed to a background job writes it there, when the job's own call ends."""
    data = result.data
    if not isinstance(data, RunResult):
        return
    from bulkrelay.ops.report import report  # loaded only when asked for

    try:
        written = report(Path(data.run_dir))
    except BulkRelayError as exc:
        context = {"run_dir": data.run_dir}
        text = f"the run report could not be written: {exc.message}"
        result.warnings.append(EnvelopeWarning("REPORT_FAILED", text, context))
        return
    output = getattr(written.data, "output", None)
    result.data = replace(data, report=str(output))


def _runs_dir_of_run(options: RunArgs) -> Path | None:
    """`--runs-dir`, or the public alpha's `--output-dir` (the same directory of run directories)."""
    runs_dir, output_dir = options.runs_dir, options.output_dir
    if output_dir is None:
        return runs_dir
    if runs_dir is not None and runs_dir.resolve() != output_dir.resolve():
        raise UsageError(
            "--output-dir (the alpha's name for --runs-dir) and --runs-dir name different directories",
            suggestion=f"give only --runs-dir {runs_dir}",
        )
    return output_dir


def _output_dir_warning(options: RunArgs) -> list[EnvelopeWarning]:
    if options.output_dir is None:
        return []
    text = f"--output-dir is the alpha's spelling; write --runs-dir {options.output_dir}"
    return [EnvelopeWarning("DEPRECATED_FLAG", text, {"flag": "--output-dir", "use": "--runs-dir"})]


def _run_request(options: RunArgs, relay: _Relay, input_path: Path | None) -> launch.RunRequest:
    return launch.RunRequest(
        job=load_job(options.job),
        input_path=input_path,
        from_stdin=options.input == "-",
        runs_dir=default_runs_dir(_runs_dir_of_run(options)),
        idempotency_key=options.idempotency_key,
        options=replace(_options(relay), limit=options.limit),
        full=options.full,
        shard=relay.shard,
    )


def _run(options: RunArgs, relay: _Relay) -> Result:
    request = _run_request(options, relay, None)
    with _prepared_input(options.input, request.job, request.runs_dir / ".spool") as input_path:
        result = launch.run(replace(request, input_path=input_path))
    result.warnings[:0] = _output_dir_warning(options)
    _apply_retention(result, request.runs_dir)
    return result


def _apply_retention(result: Result, runs_dir: Path) -> None:
    """`.bulkrelay/config.yaml` retention, once the run's state is final; never fails the run."""
    from bulkrelay.ops.prune import retention_after_run  # loaded only at a run's end

    report = retention_after_run(runs_dir)
    result.warnings.extend(report.warnings)
    if report.removed and isinstance(result.data, RunResult):
        result.data = replace(result.data, pruned=tuple(report.removed))


def _resume(options: ResumeArgs, relay: _Relay) -> Result:
    input_path = Path(options.input) if options.input not in (None, "-") else None
    if options.input == "-":
        raise UsageError(
            "resume does not read standard input: a run that read stdin resumes from its own copy, "
            "and one that read a file takes --input FILE when the file moved",
            suggestion=f"bulkrelay resume {options.run_dir}",
        )
    run_dir = resolve_run(options.run_dir, options.runs_dir)
    return launch.resume(run_dir, options.config, input_path, _options(relay))


def _shards(options: ShardsArgs) -> Result:
    from bulkrelay.ops.shards_view import shards  # loaded only for its own command

    return shards(list(options.dirs))


def _retry_failed(options: RetryFailedArgs, relay: _Relay) -> Result:
    from bulkrelay.ops import retry_failed as retryfailed  # loaded only for its own command

    return retryfailed.retry_failed(
        resolve_run(options.run_dir, options.runs_dir),
        config=options.config,
        statuses=options.status,
        classification=options.classification,
        options=_options(relay),
    )


def _export(options: ExportArgs) -> Result:
    from bulkrelay.ops import export  # loaded only for its own command

    if options.results:
        if options.failed or options.with_reasons or options.shard_runs:
            raise UsageError("--results writes every row: --failed, --with-reasons, shards do not apply")
        run_dir = resolve_run(options.run_dir, options.runs_dir)
        return export.export_results(run_dir, fmt=options.format, output=options.output)
    return export.export(
        resolve_run(options.run_dir, options.runs_dir),
        failed_only=options.failed,
        fmt=options.format,
        output=options.output,
        with_reasons=options.with_reasons,
        shards=tuple(resolve_run(ref, options.runs_dir) for ref in options.shard_runs),
    )


def _sync_state(command: str, options: SyncStateArgs) -> Result:
    from bulkrelay.ops import sync_state  # loaded only for its own command

    job, runs_dir = load_job(options.job), default_runs_dir(options.runs_dir)
    return sync_state.sync_state_command(job, runs_dir, command.removeprefix("sync-state "))


def _prune(options: PruneArgs) -> Result:
    from bulkrelay.ops import (
        prune,  # loaded only for its own command
        settings,
    )

    if options.keep is not None or options.older_than is not None:  # flags replace the settings file's rule
        retention = settings.retention_from_flags(options.keep, options.older_than)
    else:
        retention = settings.load_settings().retention
    return prune.prune_command(default_runs_dir(options.runs_dir), retention, dry_run=options.dry_run)


@dataclass(frozen=True)
class CompletionScript(CommandData):
    """`completion SHELL`: the script itself goes to stdout alone (`Result.side.stdout_payload`)."""

    kind = "completion"

    shell: str

    def to_data(self) -> dict[str, Any]:
        return {"shell": self.shell}


def _completion(options: CompletionArgs) -> Result:
    """The shell's completion script, alone on stdout, so `source <(bulkrelay completion bash)` works."""
    from bulkrelay.cli.completion import completion_script  # shtab loads only for its own command

    script = completion_script(options.shell)
    return Result(data=CompletionScript(options.shell), side=SideChannel(stdout_payload=script))


def _failures(options: FailuresArgs) -> Result:
    from bulkrelay.ops import failures  # loaded only for its own command

    return failures.failures(resolve_run(options.run_dir, options.runs_dir))


def _report(options: ReportArgs) -> Result:
    if options.history is not None:
        from bulkrelay.ops.history import history  # loaded only for its own command

        if options.run_dir is not None:
            raise UsageError("report takes a RUN or --history JOB_NAME, not both")
        return history(options.history, default_runs_dir(options.runs_dir), options.output, options.nights)
    from bulkrelay.ops import report  # loaded only for its own command

    if options.run_dir is None:
        raise UsageError("report needs a RUN (a run directory, a run id or `latest`) or --history JOB_NAME")
    return report.report(resolve_run(options.run_dir, options.runs_dir), options.output)


def _demo(options: DemoArgs, observers: tuple[RunObserver, ...]) -> Result:
    from bulkrelay.demo import quickstart as demo  # loaded only for its own command

    return demo.run_demo(rows=options.rows, runs_dir=options.runs_dir, observers=observers)
