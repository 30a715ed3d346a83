"""The command line's grammar: every command and flag, global flags in any position, and `--help` and
`--version` answered as results (text, or an envelope with `--json`). Parsing only: `main` runs what
this parses."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from itertools import pairwise
from pathlib import Path
from typing import Any, NoReturn

from bulkrelay._version import __version__
from bulkrelay.background.call import OPTIONS, Call
from bulkrelay.envelope import CommandData, Result, printable
from bulkrelay.errors import UsageError
from bulkrelay.job.durations import parse_duration_ms, whole_number

# The flags that may stand before or after the subcommand: dest -> (flag, value when not given).
_GLOBAL_FLAGS: dict[str, tuple[str, object]] = {
    "json": ("--json", False),
    "budget": ("--budget", None),
    "timeout": ("--timeout", None),
    "runs_dir": ("--runs-dir", None),
    "quiet": ("--quiet", False),
    "human": ("--human", False),
    "metrics_file": ("--metrics-file", None),
    "metrics_push": ("--metrics-push", None),
    "log_file": ("--log-file", None),
    "workers": ("--workers", None),
}


@dataclass(frozen=True)
class HelpText(CommandData):
    """`--help`: the parser's own text."""

    kind = "help"

    help: str

    def to_data(self) -> dict[str, Any]:
        return {"help": self.help}


@dataclass(frozen=True)
class VersionInfo(CommandData):
    kind = "version"

    name: str
    version: str

    def to_data(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


class Answered(Exception):  # not a failure: `--help` or `--version` answered the call
    """Raised while parsing when the command line is fully answered, so the answer gets an envelope."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.kind)
        self.result = result


class _HelpAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        raise Answered(Result(data=HelpText(parser.format_help())))


class _VersionAction(_HelpAction):
    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        raise Answered(Result(data=VersionInfo("bulkrelay", __version__)))


# A hidden subcommand (`_job-worker`) as argparse's "invalid choice" message lists it.
_HIDDEN_CHOICE = re.compile(r", '_[\w-]+'")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting, so usage errors, `--help` and
    `--version` all get an envelope. Every parser takes `--json`, wherever it stands."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["add_help"] = False  # our own -h/--help, which answers with a result
        super().__init__(*args, **kwargs)
        self.add_argument("-h", "--help", action=_HelpAction, help="show this help and exit")
        _add_global(self, "--json", action="store_true", help="print one JSON envelope on stdout")
        _add_global(
            self,
            "--quiet",
            action="store_true",
            help="print nothing on success; the human summary on failure",
        )
        _add_global(
            self, "--human", action="store_true", help="human output even when stdout is not a terminal"
        )

    def error(self, message: str) -> NoReturn:
        message = _HIDDEN_CHOICE.sub("", message)  # argparse lists hidden subcommands among the choices
        raise UsageError(f"{self.prog}: {message}", suggestion=f"see `{self.prog} --help`")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """A mistyped command or choice gets "did you mean" (`rnu`: `run`), the nearest one by spelling."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as invalid:
            choices = [str(choice) for choice in action.choices or () if not str(choice).startswith("_")]
            near = get_close_matches(str(value), choices, n=1)
            if not near:
                raise
            raise UsageError(
                f"{self.prog}: {_HIDDEN_CHOICE.sub('', str(invalid))}",
                suggestion=f"did you mean `{near[0]}`? (see `{self.prog} --help`)",
                context={"given": str(value), "did_you_mean": near[0]},
            ) from None


def _add_global(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> None:
    """A global flag: set only when given, so the subcommand's parser never overwrites the
    value given before the subcommand with its default (`_settle_globals` fills those in).
    Each parser also records which global flags it takes; the innermost parser's record wins."""
    action = parser.add_argument(flag, default=argparse.SUPPRESS, **kwargs)
    accepted = parser.get_default("accepted_globals") or frozenset()
    parser.set_defaults(accepted_globals=accepted | {action.dest})


def _count(flag: str, most: int) -> Callable[[str], int]:
    """A flag's whole number from 1 to `most`: argparse's `int` would take a number of any length,
    which nothing downstream can use (and orjson cannot even echo in the envelope)."""

    def parse(text: str) -> int:
        number = whole_number(text)
        if number is None or not 1 <= number <= most:
            raise UsageError(f"{flag}: expected a whole number from 1 to {most}, not {text!r}")
        return number

    return parse


def _file_path(flag: str) -> Callable[[str], Path]:
    """A flag's file: `Path("")` would be the working directory, so an empty value is refused here."""

    def parse(text: str) -> Path:
        if not text:
            raise UsageError(f"{flag}: expected a file's path, not an empty value")
        return Path(text)

    return parse


def _shard_count(text: str) -> int:
    from bulkrelay.ops.sharding import MAX_SHARDS  # loaded only when the flag is given

    return _count("--shards", most=MAX_SHARDS)(text)


def _workers(text: str) -> str:
    """`auto`, or a count as its digits (a call's options keep it as text: background/call.py)."""
    from bulkrelay.job.config import MAX_WORKERS  # loaded only when the flag is given

    if text.strip() == "auto":
        return "auto"
    number = whole_number(text)
    if number is None or not 1 <= number <= MAX_WORKERS:
        raise UsageError(f"--workers: expected auto or a whole number from 1 to {MAX_WORKERS}, not {text!r}")
    return str(number)


def _duration(text: str) -> int:
    return parse_duration_ms(text)


def _classification(name: str) -> str:
    from bulkrelay.relay.retry import CLASSIFICATIONS  # loaded only when the flag is given

    if name not in CLASSIFICATIONS:
        raise UsageError(
            f"--classification {name!r} is not a classification; use one of: {', '.join(CLASSIFICATIONS)}",
            context={"classification": name, "valid": list(CLASSIFICATIONS)},
        )
    return name


def _add_job_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", type=Path, metavar="JOB", help="the job file (YAML, version 1)")


def _add_input(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input", metavar="FILE", help="read records from FILE instead of the job's input; - for stdin"
    )


def _add_budget(parser: argparse.ArgumentParser) -> None:
    _add_global(
        parser,
        "--budget",
        type=_duration,
        metavar="DUR",
        help="hand the work to a background job after DUR (0: never); default 30s without a terminal",
    )
    _add_global(
        parser,
        "--timeout",
        type=_duration,
        metavar="DUR",
        help="stop at a safe point after DUR of work in all (resumable)",
    )
    _add_operational(parser)  # the commands with a budget are the ones that relay


def _add_operational(parser: argparse.ArgumentParser) -> None:
    """Where a run reports, never what it does: not part of its fingerprint or invocation identity."""
    _add_global(
        parser,
        "--metrics-file",
        type=_file_path("--metrics-file"),
        metavar="PATH",
        help="keep Prometheus metrics of the run in PATH (every ~10s, at the end); BULKRELAY_METRICS_FILE",
    )
    _add_global(
        parser,
        "--metrics-push",
        metavar="URL",
        help="push the same metrics to a Pushgateway at URL when the run ends; BULKRELAY_METRICS_PUSH",
    )
    _add_global(
        parser,
        "--log-file",
        type=Path,
        metavar="PATH",
        help="append the run log's JSON lines to PATH too (for cron)",
    )
    _add_global(
        parser,
        "--workers",
        type=_workers,
        metavar="N|auto",
        help="relay in N processes, each on a CPU of its own (auto: one a CPU, at most 8); execution.workers",
    )


def _add_runs_dir(parser: argparse.ArgumentParser) -> None:
    _add_global(
        parser, "--runs-dir", type=Path, metavar="DIR", help="where runs live (default ./.bulkrelay/runs)"
    )


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="preflight, then relay every record")
    _add_job_file(p)
    _add_input(p)
    _add_runs_dir(p)
    p.add_argument(
        "--output-dir", type=Path, metavar="DIR", help="the public alpha's name for --runs-dir (deprecated)"
    )
    p.add_argument("--idempotency-key", metavar="K", help="part of the invocation's identity for re-runs")
    p.add_argument(
        "--full", action="store_true", help="a delta job: send every row once and refresh its sync state"
    )
    p.add_argument("--shard", metavar="K/N", help="relay only shard K of N (from 0; also BULKRELAY_SHARD)")
    p.add_argument(
        "--shards",
        type=_shard_count,
        metavar="N",
        help="one of N shards, K from JOB_COMPLETION_INDEX (a Kubernetes Indexed Job)",
    )
    p.add_argument(
        "--limit",
        type=_count("--limit", most=10**12),
        metavar="N",
        help="a canary: send the first N pending rows, then stop; the same command without it continues",
    )
    _add_report_flag(p)
    _add_budget(p)


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
        _add_job_file(sp)
        _add_runs_dir(sp)


def _add_run_ref(parser: argparse.ArgumentParser) -> None:
    """The run a command works on: a run directory, a run id, or `latest` (see `runref`)."""
    # As typed, not a Path: Path("./latest") is "latest", the newest run, not the directory named so.
    parser.add_argument("run_dir", metavar="RUN", help="a run directory, a run id, or `latest`")
    _add_runs_dir(parser)


def _add_export_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--failed", action="store_true", help="only failed rows, in the input's own format")
    parser.add_argument(
        "--with-reasons", action="store_true", help="with --failed: add _status, _error, _attempts columns"
    )
    parser.add_argument("--format", choices=["csv", "jsonl"], help="output format (default: the input's)")
    parser.add_argument(
        "--results",
        action="store_true",
        help="each row's latest outcome in the results sink's columns (default: stdout, CSV)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="write here; - for stdout (the envelope then goes to stderr); default: in the run directory",
    )


def _add_report_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report", action="store_true", help="write the run report (report.html in the run) at the end"
    )


def _add_operations(sub: Any) -> None:
    """The commands of unattended operation: what failed, the report, what to keep, shell completion."""
    p = sub.add_parser("failures", help="a run's failed rows grouped by status and classification")
    _add_run_ref(p)

    p = sub.add_parser("report", help="write a run's report (or a job's history): a self-contained HTML page")
    p.add_argument("run_dir", metavar="RUN", nargs="?", help="a run directory, a run id, or `latest`")
    _add_runs_dir(p)
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="write here; - for stdout (the envelope then goes to stderr); default: report.html in the run",
    )
    p.add_argument(
        "--history", metavar="JOB_NAME", help="the job's last nights on one page, instead of a run"
    )
    p.add_argument(
        "--nights",
        type=_count("--nights", most=100_000),
        default=30,
        metavar="N",
        help="with --history: how many nights (default 30)",
    )

    p = sub.add_parser("prune", help="remove finished runs that retention no longer keeps")
    p.add_argument(
        "--keep",
        type=_count("--keep", most=1_000_000),
        metavar="N",
        help="keep the newest N finished runs of each job",
    )
    p.add_argument("--older-than", metavar="AGE", help="remove only runs older than AGE, e.g. 30d")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    _add_runs_dir(p)

    p = sub.add_parser("completion", help="print a shell completion script: bash, zsh or fish")
    p.add_argument("shell", choices=["bash", "zsh", "fish"], help="the shell to complete in")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bulkrelay", description="Turn a file of records into HTTP requests, durably.")
    parser.add_argument("--version", action=_VersionAction, help="show the version and exit")
    _add_budget(parser)
    _add_runs_dir(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_preflight_commands(sub)
    _add_run(sub)
    _add_continuing_commands(sub)
    _add_reading_commands(sub)
    _add_operations(sub)
    _add_sync_state(sub)
    _add_job_commands(sub)
    p = sub.add_parser("demo", help="run an example job against an embedded local target")
    p.add_argument(
        "--rows",
        type=_count("--rows", most=1_000_000),
        default=3000,
        help="how many rows the demo sends (default 3000, at most 1000000)",
    )
    _add_runs_dir(p)
    p = sub.add_parser("_job-worker")  # no help=: a hidden subcommand is never listed
    p.add_argument("job_id")
    return parser


def _add_preflight_commands(sub: Any) -> None:
    """The commands that send nothing: validate and render."""
    p = sub.add_parser("validate", help="full preflight of the job and every record; sends nothing")
    _add_job_file(p)
    _add_input(p)
    p.add_argument(
        "--check-auth",
        action="store_true",
        help="then prove request.auth's credentials load (OAuth2: fetch one token) without sending a row",
    )

    p = sub.add_parser("render", help="show the exact requests some rows would send, secrets redacted")
    _add_job_file(p)
    _add_input(p)
    p.add_argument("--rows", help="rows to render, e.g. 1-5 or 3,7-9 (default: the first five)")
    p.add_argument(
        "--curl", action="store_true", help="show each request as a curl command line (secrets as ***)"
    )


def _add_continuing_commands(sub: Any) -> None:
    """The commands that continue a run's work: resume and retry-failed."""
    p = sub.add_parser("resume", help="continue an interrupted run; refuses on any change")
    _add_run_ref(p)
    p.add_argument("--config", type=Path, metavar="JOB", help="the job file, if it moved")
    _add_input(p)
    _add_report_flag(p)
    _add_budget(p)

    p = sub.add_parser("retry-failed", help="a new run, linked to its parent, of a run's failed rows")
    _add_run_ref(p)
    p.add_argument("--status", metavar="CODES", help="only rows that ended with these statuses, e.g. 503,504")
    p.add_argument(
        "--classification", type=_classification, metavar="NAME", help="only rows with this classification"
    )
    p.add_argument("--config", type=Path, metavar="JOB", help="the job file, if it moved")
    _add_report_flag(p)
    _add_budget(p)


def _add_reading_commands(sub: Any) -> None:
    """The commands that read runs: status, shards, runs, export."""
    p = sub.add_parser("status", help="one run's state and counters")
    _add_run_ref(p)

    p = sub.add_parser("shards", help="the shards of one job (--shard K/N runs) summed into one view")
    p.add_argument(
        "dirs", type=Path, nargs="+", metavar="DIR", help="each shard's runs directory or run directory"
    )

    p = sub.add_parser("runs", help="a table of runs")
    _add_runs_dir(p)

    p = sub.add_parser("export", help="input rows joined with their latest result")
    _add_run_ref(p)
    p.add_argument(
        "shard_runs",
        nargs="*",
        metavar="RUN",
        help="more runs: the other shards of one input, joined",
    )
    _add_export_flags(p)


def _add_job_commands(sub: Any) -> None:
    job = sub.add_parser("job", help="background jobs: wait, status, cancel")
    job_sub = job.add_subparsers(dest="job_command", metavar="ACTION", parser_class=_Parser)
    for action, text in (
        ("wait", "wait up to the budget for a job's result"),
        ("status", "a job's state at once"),
        ("cancel", "stop a job at a safe point (its requests in flight answered); wait up to the budget"),
    ):
        jp = job_sub.add_parser(action, help=text)
        jp.add_argument(
            "job_id", metavar="JOB_ID", help="the job_id a budgeted call returned, e.g. run-0123456789"
        )
        if action in ("wait", "cancel"):
            _add_global(jp, "--budget", type=_duration, metavar="DUR", help="how long to hold the call")


def parse_command_line(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line, global flags settled wherever they stood."""
    _refuse_undecodable(argv)
    parser = build_parser()
    args, leftover = parser.parse_known_args(argv)
    if leftover:
        _refuse_misplaced_global(args, leftover)
        parser.error(f"unrecognized arguments: {' '.join(leftover)}")
    _settle_globals(args)
    return args


def _refuse_undecodable(argv: Sequence[str]) -> None:
    """A word that is not UTF-8 (a Latin-1 file name) could not be written into the JSON that records
    it (the envelope, `run.json`, `run.log`, a job's state): refused before anything, named readably."""
    for word in argv:
        shown = printable(word)
        if shown != word:
            raise UsageError(
                f"argument '{shown}' is not valid UTF-8",
                context={"argument": shown},
                suggestion="rename the file or directory to a UTF-8 name (a link to it does not help: a run"
                " records the path the link leads to)",
            )


def _refuse_misplaced_global(args: argparse.Namespace, leftover: list[str]) -> None:
    """A global flag after a subcommand that does not take it is left over (and its value may have
    passed for a positional): name the flag and the command, as `_settle_globals` does before it."""
    for flag, _ in _GLOBAL_FLAGS.values():
        if any(word == flag or word.startswith(f"{flag}=") for word in leftover):
            raise _not_taken(flag, args)


def _settle_globals(args: argparse.Namespace) -> None:
    """Fill in the global flags the command takes; refuse one it does not take."""
    accepted = vars(args).pop("accepted_globals")
    for dest, (flag, default) in _GLOBAL_FLAGS.items():
        if dest in accepted:
            if not hasattr(args, dest):
                setattr(args, dest, default)
        elif hasattr(args, dest):
            raise _not_taken(flag, args)
    vars(args).pop("json")  # read before parsing by json_mode(), so even a usage error is JSON


def _not_taken(flag: str, args: argparse.Namespace) -> UsageError:
    command = command_name(args)
    return UsageError(
        f"{flag} does not apply to `bulkrelay {command}`", suggestion=f"see `bulkrelay {command} --help`"
    )


def exports_to_stdout(argv: Sequence[str]) -> bool:
    """`export ... -o -` (or `report ... -o -`): stdout carries the rows (the page), so the call's envelope
    goes to stderr, whatever it says. Read from the raw words, so even a command line that does not
    parse keeps stdout clean."""
    if "export" not in argv and "report" not in argv:
        return False
    given = any(flag in ("-o", "--output") and value == "-" for flag, value in pairwise(argv))
    output_named = any(word in ("-o", "--output") or word.startswith(("-o", "--output=")) for word in argv)
    results = "export" in argv and "--results" in argv and not output_named  # stdout by default
    return given or results or "--output=-" in argv or "-o-" in argv


def parse_call(argv: Sequence[str]) -> Call:
    """The command line as the typed call every layer below gets: the parsed arguments go no further."""
    return call_of(parse_command_line(argv), argv)


def call_of(args: argparse.Namespace, argv: Sequence[str]) -> Call:
    command = command_name(args)
    options = OPTIONS.get(command)
    if options is None:  # `bulkrelay`, `bulkrelay job`: a command or an action is missing
        raise UsageError("a command is required", suggestion="see `bulkrelay --help`")
    values = {  # an option a command does not take (`job status --budget`) keeps its default
        field.name: tuple(value) if isinstance(value := getattr(args, field.name), list) else value
        for field in dataclasses.fields(options)
        if hasattr(args, field.name)
    }
    return Call(command, options(**values), tuple(argv), quiet=bool(getattr(args, "quiet", False)))


def command_name(args: argparse.Namespace) -> str:
    if args.command == "job":
        return f"job {args.job_command}" if args.job_command else "job"
    if args.command == "sync-state":
        return f"sync-state {args.sync_command}" if args.sync_command else "sync-state"
    return str(args.command)
