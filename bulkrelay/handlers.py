"""The command table: each entry turns parsed arguments into one library call."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from bulkrelay import commands, jobs, launch, worker
from bulkrelay.config import Job, load_job
from bulkrelay.envelope import Result
from bulkrelay.errors import UsageError
from bulkrelay.lifecycle import RunOptions, prepare_input
from bulkrelay.rundir import default_runs_dir


def _input_path(args: argparse.Namespace, job: Job | None, spool_dir: Path) -> Path | None:
    suffix = ""
    if job is not None:
        if job.config.input.file:
            suffix = "".join(Path(job.config.input.file).suffixes)
        elif job.config.input.format:
            suffix = f".{job.config.input.format}"
    return prepare_input(args.input, spool_dir, suffix)


def _validate(args: argparse.Namespace) -> Result:
    job = load_job(args.job)
    return commands.validate(job, _input_path(args, job, default_runs_dir(None) / ".spool"))


def _render(args: argparse.Namespace) -> Result:
    job = load_job(args.job)
    return commands.render(job, _input_path(args, job, default_runs_dir(None) / ".spool"), args.rows)


def _options(args: argparse.Namespace) -> RunOptions:
    supervisor = getattr(args, "supervisor", None)
    if supervisor is not None:  # a background worker: its supervisor owns signals and the deadline
        return RunOptions(handle_signals=False, supervisor=supervisor)
    timeout_ms = getattr(args, "timeout", None)
    return RunOptions(timeout_seconds=timeout_ms / 1000 if timeout_ms is not None else None)


def _run_request(args: argparse.Namespace, spooled_stdin: Path | None = None) -> launch.RunRequest:
    runs_dir = default_runs_dir(args.runs_dir)
    job = load_job(args.job)
    return launch.RunRequest(
        job=job,
        input_path=spooled_stdin or _input_path(args, job, runs_dir / ".spool"),
        from_stdin=args.input == "-",
        runs_dir=runs_dir,
        idempotency_key=args.idempotency_key,
        options=_options(args),
        full=args.full,
    )


def _run(args: argparse.Namespace) -> Result:
    return launch.run(_run_request(args))


def _run_key(args: argparse.Namespace, spooled_stdin: Path | None) -> str:
    """The job key of a budgeted `run`: the same identity the identical re-run uses."""
    return _run_request(args, spooled_stdin).key()


def _resume(args: argparse.Namespace) -> Result:
    input_path = Path(args.input) if args.input not in (None, "-") else None
    if args.input == "-":
        raise UsageError(
            "resume cannot read stdin: a run that read stdin keeps its own copy",
            suggestion=f"bulkrelay resume {args.run_dir}",
        )
    return launch.resume(args.run_dir, args.config, input_path, _options(args))


def _status(args: argparse.Namespace) -> Result:
    return commands.status(args.run_dir)


def _runs(args: argparse.Namespace) -> Result:
    return commands.runs(default_runs_dir(args.runs_dir))


def _retry_failed(args: argparse.Namespace) -> Result:
    from bulkrelay import retryfailed  # loaded only for its own command

    return retryfailed.retry_failed(
        args.run_dir,
        config=args.config,
        statuses=args.status,
        classification=args.classification,
        options=_options(args),
    )


def _export(args: argparse.Namespace) -> Result:
    from bulkrelay import export  # loaded only for its own command

    return export.export(args.run_dir, failed_only=args.failed, fmt=args.format, output=args.output)


def _sync_state(args: argparse.Namespace) -> Result:
    from bulkrelay import syncstate  # loaded only for its own command

    job = load_job(args.job)
    if job.config.execution.sync == "full":
        raise UsageError(
            f"job {args.job} is not a delta job (execution.sync is full); it keeps no sync state"
        )
    identity = syncstate.job_identity(job.config.name, job.path)
    action = syncstate.rebuild_state if args.sync_command == "rebuild" else syncstate.verify_state
    return Result(data=action(default_runs_dir(args.runs_dir), identity), kind="generic")


def _demo(args: argparse.Namespace) -> Result:
    from bulkrelay import demo  # loaded only for its own command

    return demo.run_demo(rows=args.rows, runs_dir=args.runs_dir)


TABLE: dict[str, Callable[[argparse.Namespace], Result]] = {
    "validate": _validate,
    "render": _render,
    "run": jobs.budgeted("run", _run, _run_key),
    "resume": jobs.budgeted("resume", _resume),
    "status": _status,
    "runs": _runs,
    "retry-failed": jobs.budgeted("retry-failed", _retry_failed),
    "export": _export,
    "demo": _demo,
    "sync-state rebuild": _sync_state,
    "sync-state verify": _sync_state,
    "job wait": lambda args: jobs.job_wait(args.job_id, args.budget),
    "job status": lambda args: jobs.job_status(args.job_id),
    "job cancel": lambda args: jobs.job_cancel(args.job_id),
    "_job-worker": lambda args: worker.run_worker(args.job_id),
}
