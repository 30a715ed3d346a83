"""The command table: each entry turns parsed arguments into one library call."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bulkrelay.background import jobs
from bulkrelay.envelope import CommandData, EnvelopeWarning, Result
from bulkrelay.errors import BulkRelayError, ExitCode, UsageError
from bulkrelay.job.config import Job, load_job
from bulkrelay.job.inputs import STDIN_NAME
from bulkrelay.ops import launch, preview, status
from bulkrelay.ops.lifecycle import RunObserver, RunOptions, prepared_input
from bulkrelay.ops.results import RunResult
from bulkrelay.ops.runlog import RunLog, start_event
from bulkrelay.ops.sharding import resolve_shard
from bulkrelay.ops.snapshot import is_query_job, parquet_input, passing_snapshot, refuse_input_override
from bulkrelay.relay.metrics import MetricsFile, MetricsPush, metrics_path, metrics_push_url
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.runs import default_runs_dir


def _prepared_input(
    args: argparse.Namespace, job: Job | None, spool_dir: Path, *, snapshot: bool = False
) -> AbstractContextManager[Path | None]:
    """The input a command reads: `--input` (stdin spooled), else the job's file (None); for a query
    job with `snapshot`, its query's snapshot (validate, render), which lives as long as the command."""
    suffix = ""
    if job is not None and is_query_job(job):
        refuse_input_override(job, args.input)
        return passing_snapshot(job, spool_dir) if snapshot else nullcontext(None)
    named = Path(args.input) if args.input not in (None, "-") else None
    parquet = None if job is None else parquet_input(job, named)
    if snapshot and job is not None and parquet is not None:
        return passing_snapshot(job, spool_dir, parquet)
    if job is not None:
        if job.config.input.file:
            suffix = "".join(Path(job.config.input.file).suffixes)
        elif job.config.input.format:
            suffix = f".{job.config.input.format}"
    return prepared_input(args.input, spool_dir, suffix)


def _input_name(args: argparse.Namespace, job: Job | None = None) -> str | None:
    """What messages call the input: <stdin>, a Parquet file (not its snapshot), else its path."""
    if args.input == "-":
        return STDIN_NAME
    named = Path(args.input) if args.input is not None else None
    parquet = None if job is None else parquet_input(job, named)
    return None if parquet is None else str(parquet)


def _validate(args: argparse.Namespace) -> Result:
    job = load_job(args.job)
    with _prepared_input(args, job, default_runs_dir(None) / ".spool", snapshot=True) as input_path:
        return preview.validate(job, input_path, _input_name(args, job), check_auth=args.check_auth)


def _render(args: argparse.Namespace) -> Result:
    job = load_job(args.job)
    with _prepared_input(args, job, default_runs_dir(None) / ".spool", snapshot=True) as input_path:
        return preview.render(job, input_path, args.rows, _input_name(args, job), curl=args.curl)


def _options(args: argparse.Namespace) -> RunOptions:
    supervisor = getattr(args, "supervisor", None)
    quiet = bool(getattr(args, "quiet", False))
    observers = getattr(args, "observers", ())
    if supervisor is not None:  # a background worker: its supervisor owns signals and the job's bounds
        return RunOptions(
            handle_signals=False,
            supervisor=supervisor,
            deadline=supervisor.deadline,
            started_at=supervisor.started_at,
            observers=observers,
            quiet=quiet,
        )
    timeout_ms = getattr(args, "timeout", None)
    return RunOptions(
        timeout_seconds=timeout_ms / 1000 if timeout_ms is not None else None,
        observers=observers,
        quiet=quiet,
    )


def _observers(args: argparse.Namespace) -> tuple[RunObserver, ...]:
    """The run log (always), the metrics file (`--metrics-file` or BULKRELAY_METRICS_FILE) and the push
    to a Pushgateway (`--metrics-push` or BULKRELAY_METRICS_PUSH)."""
    observers: list[RunObserver] = []
    run_log: RunLog | None = getattr(args, "run_log", None)
    if run_log is not None:
        observers.append(run_log)
    path = metrics_path(getattr(args, "metrics_file", None), os.environ)
    if path is not None:
        observers.append(MetricsFile(path))
    push = metrics_push_url(getattr(args, "metrics_push", None), os.environ)
    if push is not None:
        observers.append(MetricsPush(push))
    return tuple(observers)


def _logged(
    command: str, handler: Callable[[argparse.Namespace], Result]
) -> Callable[[argparse.Namespace], Result]:
    """`handler` with a run log: `start` and `exit` lines around it (see bulkrelay.ops.runlog)."""

    def call(args: argparse.Namespace) -> Result:
        run_log = RunLog(getattr(args, "log_file", None))
        args.run_log = run_log
        start_event(run_log, command, list(getattr(args, "argv", [])))
        try:
            args.observers = _observers(args)  # checked here, so a bad path fails before any hand-off
            result = handler(args)
        except BulkRelayError as exc:
            result = Result.from_error(exc)
        except BaseException as exc:  # logged, then left to the CLI's catch site
            interrupted = isinstance(exc, KeyboardInterrupt)
            run_log.exit(Result(exit_code=ExitCode.SIGINT if interrupted else ExitCode.GENERAL_ERROR))
            run_log.close()
            raise
        run_log.exit(result)
        run_log.close()
        if getattr(args, "report", False):  # after the exit line, so the report has the exit code
            _write_report(result)
        return result

    return call


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


def _runs_dir_of_run(args: argparse.Namespace) -> Path | None:
    """`--runs-dir`, or the public alpha's `--output-dir` (the same directory of run directories)."""
    runs_dir: Path | None = args.runs_dir
    output_dir: Path | None = args.output_dir
    if output_dir is None:
        return runs_dir
    if runs_dir is not None and runs_dir.resolve() != output_dir.resolve():
        raise UsageError(
            "--output-dir (the alpha's name for --runs-dir) and --runs-dir name different directories",
            suggestion=f"give only --runs-dir {runs_dir}",
        )
    return output_dir


def _output_dir_warning(args: argparse.Namespace) -> list[EnvelopeWarning]:
    if args.output_dir is None:
        return []
    text = f"--output-dir is the alpha's spelling; write --runs-dir {args.output_dir}"
    return [EnvelopeWarning("DEPRECATED_FLAG", text, {"flag": "--output-dir", "use": "--runs-dir"})]


def _run_request(args: argparse.Namespace, input_path: Path | None) -> launch.RunRequest:
    return launch.RunRequest(
        job=load_job(args.job),
        input_path=input_path,
        from_stdin=args.input == "-",
        runs_dir=default_runs_dir(_runs_dir_of_run(args)),
        idempotency_key=args.idempotency_key,
        options=_options(args),
        full=args.full,
        shard=args.shard_spec,
    )


def _shard_checked(handler: Callable[[argparse.Namespace], Result]) -> Callable[[argparse.Namespace], Result]:
    """`handler` once the shard (`--shard`, `--shards`, their variables) is known good: a typo is refused
    before any input is read, even under a call budget, which copies stdin before the run starts."""

    def call(args: argparse.Namespace) -> Result:
        args.shard_spec = resolve_shard(args.shard, args.shards, os.environ)
        return handler(args)

    return call


def _run(args: argparse.Namespace) -> Result:
    request = _run_request(args, None)
    with _prepared_input(args, request.job, request.runs_dir / ".spool") as input_path:
        result = launch.run(replace(request, input_path=input_path))
    result.warnings[:0] = _output_dir_warning(args)
    _apply_retention(result, request.runs_dir)
    return result


def _apply_retention(result: Result, runs_dir: Path) -> None:
    """`.bulkrelay/config.yaml` retention, once the run's state is final; never fails the run."""
    from bulkrelay.ops.prune import retention_after_run  # loaded only at a run's end

    report = retention_after_run(runs_dir)
    result.warnings.extend(report.warnings)
    if report.removed and isinstance(result.data, RunResult):
        result.data = replace(result.data, pruned=tuple(report.removed))


def _run_key(args: argparse.Namespace, spooled_stdin: Path | None) -> str:
    """The background job's key of a budgeted `run`: the same identity the identical re-run uses."""
    named = Path(args.input) if args.input not in (None, "-") else None
    return _run_request(args, spooled_stdin or named).key()


def _run_continues(args: argparse.Namespace, spooled_stdin: Path | None) -> RunDir | None:
    """The unfinished run a budgeted `run` will continue (the identical invocation's), read before the
    hand-off."""
    named = Path(args.input) if args.input not in (None, "-") else None
    return launch.run_to_continue(_run_request(args, spooled_stdin or named))


def _resume_continues(args: argparse.Namespace, _stdin: Path | None) -> RunDir:
    return RunDir.open(_run_dir(args))


def _run_dir(args: argparse.Namespace) -> Path:
    """The run directory the RUN argument names: a path, a run id, or `latest`."""
    return _resolved(args.run_dir, args.runs_dir)


def _resolved(ref: str, runs_dir: Path | None) -> Path:
    from bulkrelay.store.runs import resolve_run

    return resolve_run(ref, runs_dir)


def _resume(args: argparse.Namespace) -> Result:
    input_path = Path(args.input) if args.input not in (None, "-") else None
    if args.input == "-":
        raise UsageError(
            "resume cannot read stdin: a run that read stdin keeps its own copy",
            suggestion=f"bulkrelay resume {args.run_dir}",
        )
    return launch.resume(_run_dir(args), args.config, input_path, _options(args))


def _status(args: argparse.Namespace) -> Result:
    return status.status(_run_dir(args))


def _shards(args: argparse.Namespace) -> Result:
    from bulkrelay.ops.shards_view import shards  # loaded only for its own command

    return shards(args.dirs)


def _runs(args: argparse.Namespace) -> Result:
    return status.runs(default_runs_dir(args.runs_dir))


def _retry_failed(args: argparse.Namespace) -> Result:
    from bulkrelay.ops import retry_failed as retryfailed  # loaded only for its own command

    return retryfailed.retry_failed(
        _run_dir(args),
        config=args.config,
        statuses=args.status,
        classification=args.classification,
        options=_options(args),
    )


def _export(args: argparse.Namespace) -> Result:
    from bulkrelay.ops import export  # loaded only for its own command

    return export.export(
        _run_dir(args),
        failed_only=args.failed,
        fmt=args.format,
        output=args.output,
        with_reasons=args.with_reasons,
        shards=tuple(_resolved(ref, args.runs_dir) for ref in args.shard_runs),
    )


def _sync_state(args: argparse.Namespace) -> Result:
    from bulkrelay.ops import sync_state  # loaded only for its own command

    return sync_state.sync_state_command(
        load_job(args.job), default_runs_dir(args.runs_dir), args.sync_command
    )


def _prune(args: argparse.Namespace) -> Result:
    from bulkrelay.ops import (
        prune,  # loaded only for its own command
        settings,
    )

    if args.keep is not None or args.older_than is not None:  # flags replace the settings file's rule
        retention = settings.retention_from_flags(args.keep, args.older_than)
    else:
        retention = settings.load_settings().retention
    return prune.prune_command(default_runs_dir(args.runs_dir), retention, dry_run=args.dry_run)


@dataclass(frozen=True)
class CompletionScript(CommandData):
    """`completion SHELL`: the script itself goes to stdout alone (`Result.meta["stdout_payload"]`)."""

    kind = "completion"

    shell: str

    def to_data(self) -> dict[str, Any]:
        return {"shell": self.shell}


def _completion(args: argparse.Namespace) -> Result:
    """The shell's completion script, alone on stdout, so `source <(bulkrelay completion bash)` works."""
    from bulkrelay.cli.completion import completion_script  # shtab loads only for its own command

    return Result(data=CompletionScript(args.shell), meta={"stdout_payload": completion_script(args.shell)})


def _failures(args: argparse.Namespace) -> Result:
    from bulkrelay.ops import failures  # loaded only for its own command

    return failures.failures(_run_dir(args))


def _report(args: argparse.Namespace) -> Result:
    from bulkrelay.ops import report  # loaded only for its own command

    return report.report(_run_dir(args), args.output)


def _demo(args: argparse.Namespace) -> Result:
    from bulkrelay.demo import quickstart as demo  # loaded only for its own command

    return demo.run_demo(rows=args.rows, runs_dir=args.runs_dir, observers=args.observers)


TABLE: dict[str, Callable[[argparse.Namespace], Result]] = {
    "validate": _validate,
    "render": _render,
    "run": _logged("run", _shard_checked(jobs.budgeted("run", _run, _run_key, _run_continues))),
    "resume": _logged("resume", jobs.budgeted("resume", _resume, continues=_resume_continues)),
    "status": _status,
    "shards": _shards,
    "runs": _runs,
    "retry-failed": _logged("retry-failed", jobs.budgeted("retry-failed", _retry_failed)),
    "export": _export,
    "failures": _failures,
    "report": _report,
    "prune": _prune,
    "completion": _completion,
    "demo": _logged("demo", _demo),
    "sync-state rebuild": _sync_state,
    "sync-state verify": _sync_state,
    "job wait": lambda args: jobs.background_wait(args.job_id, args.budget),
    "job status": lambda args: jobs.background_status(args.job_id),
    "job cancel": lambda args: jobs.background_cancel(args.job_id, args.budget),
}
