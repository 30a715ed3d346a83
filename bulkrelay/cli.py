"""The command line: parse, call the library, render one result, exit with its code.

This is the only catch site. In JSON mode (`--json`, or stdout not a terminal) stdout carries
exactly one envelope, whatever happens, including usage errors and unexpected exceptions.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from bulkrelay import __version__
from bulkrelay.durations import parse_duration_ms
from bulkrelay.envelope import Result, dumps_envelope, to_envelope
from bulkrelay.errors import BulkRelayError, ExitCode, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting, so usage errors get an envelope."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", suggestion=f"see `{self.prog} --help`")


def _duration(text: str) -> int:
    return parse_duration_ms(text)


def _add_input(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input", metavar="FILE", help="read records from FILE instead of the job's input; - for stdin"
    )


def _add_budget(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        type=_duration,
        metavar="DUR",
        help="hand the work to a background job after DUR (0: never); default 30s without a terminal",
    )
    parser.add_argument(
        "--timeout",
        type=_duration,
        metavar="DUR",
        help="stop at a safe point after DUR of work in all (resumable)",
    )


def _add_sync_state(sub: argparse._SubParsersAction[_Parser]) -> None:
    sync = sub.add_parser(
        "sync-state", help="a delta job's sync state: rebuild or verify it from the journals"
    )
    sync_sub = sync.add_subparsers(dest="sync_command", metavar="ACTION", parser_class=_Parser)
    for action, text in (
        ("rebuild", "replace the sync state with one built from the job's journals"),
        ("verify", "check the sync state against the job's journals (exit 4 when they differ)"),
    ):
        sp = sync_sub.add_parser(action, help=text)
        sp.add_argument("job", type=Path, metavar="JOB")
        sp.add_argument("--runs-dir", type=Path, metavar="DIR", help="where the job's runs live")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bulkrelay", description="Turn a file of records into HTTP requests, durably.")
    parser.add_argument("--json", action="store_true", help="print one JSON envelope on stdout")
    parser.add_argument("--version", action="version", version=f"bulkrelay {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("validate", help="full preflight of the job and every record; sends nothing")
    p.add_argument("job", type=Path, metavar="JOB")
    _add_input(p)

    p = sub.add_parser("render", help="show the exact requests some rows would send, secrets redacted")
    p.add_argument("job", type=Path, metavar="JOB")
    _add_input(p)
    p.add_argument("--rows", default="1-5", help="rows to render, e.g. 1-5 or 3,7-9 (default 1-5)")

    p = sub.add_parser("run", help="preflight, then relay every record")
    p.add_argument("job", type=Path, metavar="JOB")
    _add_input(p)
    p.add_argument("--runs-dir", type=Path, metavar="DIR", help="where runs live (default ./.bulkrelay/runs)")
    p.add_argument("--idempotency-key", metavar="K", help="part of the invocation's identity for re-runs")
    p.add_argument(
        "--full", action="store_true", help="a delta job: send every row once and refresh its sync state"
    )
    _add_budget(p)

    p = sub.add_parser("resume", help="continue an interrupted run; refuses on any change")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--config", type=Path, metavar="JOB", help="the job file, if it moved")
    _add_input(p)
    _add_budget(p)

    p = sub.add_parser("retry-failed", help="a new run, linked to its parent, of a run's failed rows")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--status", metavar="CODES", help="only rows that ended with these statuses, e.g. 503,504")
    p.add_argument("--classification", metavar="NAME", help="only rows with this classification")
    p.add_argument("--config", type=Path, metavar="JOB", help="the job file, if it moved")
    _add_budget(p)

    p = sub.add_parser("status", help="one run's state and counters")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")

    p = sub.add_parser("runs", help="a table of runs")
    p.add_argument("--runs-dir", type=Path, metavar="DIR")

    p = sub.add_parser("export", help="input rows joined with their latest result")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--failed", action="store_true", help="only failed rows, in the input's own format")
    p.add_argument("--format", choices=["csv", "jsonl"], help="output format (default: the input's)")
    p.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write here (default stdout summary only)"
    )

    _add_sync_state(sub)

    job = sub.add_parser("job", help="background jobs: wait, status, cancel")
    job_sub = job.add_subparsers(dest="job_command", metavar="ACTION", parser_class=_Parser)
    for action, text in (
        ("wait", "wait up to the budget for a job's result"),
        ("status", "a job's state at once"),
        ("cancel", "stop a job at its next safe point"),
    ):
        jp = job_sub.add_parser(action, help=text)
        jp.add_argument("job_id", metavar="JOB_ID")
        if action == "wait":
            jp.add_argument("--budget", type=_duration, metavar="DUR", help="how long to hold the call")

    p = sub.add_parser("demo", help="run an example job against an embedded local target")
    p.add_argument("--rows", type=int, default=3000, help="how many rows the demo sends (default 3000)")
    p.add_argument("--runs-dir", type=Path, metavar="DIR")

    p = sub.add_parser("_job-worker", help=argparse.SUPPRESS)
    p.add_argument("job_id")
    return parser


def json_mode(argv: Sequence[str]) -> bool:
    return "--json" in argv or not sys.stdout.isatty()


def dispatch(args: argparse.Namespace) -> Result:
    from bulkrelay import handlers  # the command table; imported late so `--help` stays fast

    handler: Callable[[argparse.Namespace], Result] | None = handlers.TABLE.get(_command_name(args))
    if handler is None:
        raise UsageError("a command is required", suggestion="see `bulkrelay --help`")
    return handler(args)


def _command_name(args: argparse.Namespace) -> str:
    if args.command == "job":
        return f"job {args.job_command}" if args.job_command else "job"
    if args.command == "sync-state":
        return f"sync-state {args.sync_command}" if args.sync_command else "sync-state"
    return str(args.command)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    as_json = json_mode(argv)
    try:
        # --json may stand anywhere on the line; it is read by json_mode() above.
        args = build_parser().parse_args([a for a in argv if a != "--json"])
        args.argv = argv  # a background job re-runs the same command line
        args.started = started  # the call budget counts from here
        result = dispatch(args)
    except BulkRelayError as exc:
        result = Result.from_error(exc)
    except KeyboardInterrupt:
        result = Result(
            exit_code=ExitCode.SIGINT,
            kind="error",
            error={"code": "INTERRUPTED", "message": "interrupted", "retryable": True},
        )
    except Exception as exc:  # the one place an unexpected failure becomes an answer
        result = Result.from_unexpected(exc)
    emit(result, started=started, as_json=as_json)
    sys.exit(int(result.exit_code))


def emit(result: Result, *, started: float, as_json: bool) -> None:
    duration_ms = result.meta.pop("work_duration_ms", None)
    if duration_ms is None:
        duration_ms = round((time.monotonic() - started) * 1000)
    envelope = to_envelope(result, duration_ms=int(duration_ms))
    if as_json:
        sys.stdout.buffer.write(dumps_envelope(envelope))
        sys.stdout.flush()
    else:
        from bulkrelay.human import print_human  # rich loads only when a person reads the output

        print_human(result, envelope)
