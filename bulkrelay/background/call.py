"""The typed call: one command and its typed options, built once by cli/ from the parsed command line.

No room below cli/ sees argparse: cli/'s commands, the call budget and a background job's worker are
handed a `Call`. A background job keeps its call in `spec.json` as the JSON of its fields (`to_json`),
and its worker reads the same record back (`call_from_json`), never by parsing a command line again.

Each command's options are a frozen record (`RunArgs`, `ResumeArgs`, ...), named in `OPTIONS` by the
command's name; a field is named as its flag's destination (`--runs-dir`: `runs_dir`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

# The options that say where a call reports or how long it may take, never what it does: not part
# of an invocation's identity (the identical re-run and the job it attaches to).
_NOT_IDENTITY = frozenset({"budget", "timeout", "metrics_file", "metrics_push", "log_file", "workers"})


@dataclass(frozen=True, kw_only=True)
class CommandArgs:
    """A command's options; subclasses are the commands'."""

    def identity(self) -> dict[str, str | None]:
        """The options as an invocation key holds them: paths resolved, each value as text, the
        operational ones (budget, timeout, metrics, log file, workers) left out."""
        return {
            name: str(value.resolve()) if isinstance(value, Path) else None if value is None else str(value)
            for name, value in sorted(_values(self).items())
            if name not in _NOT_IDENTITY
        }


@dataclass(frozen=True, kw_only=True)
class RelayArgs(CommandArgs):
    """The options of the commands that relay (run, resume, retry-failed): a call budget, a time
    limit, where the run reports, its report."""

    budget: int | None = None  # ms; 0: no budget
    timeout: int | None = None  # ms
    metrics_file: Path | None = None
    metrics_push: str | None = None
    log_file: Path | None = None
    report: bool = False
    workers: str | None = None  # --workers N|auto (its digits, or auto): execution.workers for this call

    @property
    def reads_stdin(self) -> bool:
        return False


@dataclass(frozen=True, kw_only=True)
class RunArgs(RelayArgs):
    job: Path
    input: str | None = None  # a path, or `-` for standard input
    runs_dir: Path | None = None
    output_dir: Path | None = None  # the public alpha's name for --runs-dir
    idempotency_key: str | None = None
    full: bool = False
    shard: str | None = None  # K/N
    shards: int | None = None
    limit: int | None = None  # --limit N: a canary of N rows (not part of the run's invocation key)

    @property
    def reads_stdin(self) -> bool:
        return self.input == "-"


@dataclass(frozen=True, kw_only=True)
class ResumeArgs(RelayArgs):
    run_dir: str  # as typed: a path, a run id, or `latest`
    runs_dir: Path | None = None
    config: Path | None = None
    input: str | None = None

    @property
    def reads_stdin(self) -> bool:
        return self.input == "-"


@dataclass(frozen=True, kw_only=True)
class RetryFailedArgs(RelayArgs):
    run_dir: str
    runs_dir: Path | None = None
    config: Path | None = None
    status: str | None = None  # e.g. 503,504
    classification: str | None = None


@dataclass(frozen=True, kw_only=True)
class ValidateArgs(CommandArgs):
    job: Path
    input: str | None = None
    check_auth: bool = False


@dataclass(frozen=True, kw_only=True)
class RenderArgs(CommandArgs):
    job: Path
    input: str | None = None
    rows: str | None = None  # e.g. 1-5 or 3,7-9
    curl: bool = False


@dataclass(frozen=True, kw_only=True)
class StatusArgs(CommandArgs):
    run_dir: str
    runs_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class FailuresArgs(CommandArgs):
    run_dir: str
    runs_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class ShardsArgs(CommandArgs):
    dirs: tuple[Path, ...]


@dataclass(frozen=True, kw_only=True)
class RunsArgs(CommandArgs):
    runs_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class ExportArgs(CommandArgs):
    run_dir: str
    runs_dir: Path | None = None
    shard_runs: tuple[str, ...] = ()
    failed: bool = False
    with_reasons: bool = False
    format: str | None = None
    output: Path | None = None  # `-`: stdout
    results: bool = False  # the results sink's columns (stdout unless `output`)


@dataclass(frozen=True, kw_only=True)
class ReportArgs(CommandArgs):
    run_dir: str | None = None  # None with --history
    runs_dir: Path | None = None
    output: Path | None = None
    history: str | None = None  # a job's name: its last nights instead of one run
    nights: int = 30


@dataclass(frozen=True, kw_only=True)
class PruneArgs(CommandArgs):
    keep: int | None = None
    older_than: str | None = None
    dry_run: bool = False
    runs_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class CompletionArgs(CommandArgs):
    shell: str


@dataclass(frozen=True, kw_only=True)
class DemoArgs(CommandArgs):
    rows: int = 3000
    runs_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class SyncStateArgs(CommandArgs):
    job: Path
    runs_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class JobArgs(CommandArgs):
    """`job wait|status|cancel`: a background job's id; `status` takes no budget."""

    job_id: str
    budget: int | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerArgs(CommandArgs):
    """`_job-worker ID`: a background job's own process."""

    job_id: str


OPTIONS: Mapping[str, type[CommandArgs]] = {
    "validate": ValidateArgs,
    "render": RenderArgs,
    "run": RunArgs,
    "resume": ResumeArgs,
    "retry-failed": RetryFailedArgs,
    "status": StatusArgs,
    "shards": ShardsArgs,
    "runs": RunsArgs,
    "export": ExportArgs,
    "failures": FailuresArgs,
    "report": ReportArgs,
    "prune": PruneArgs,
    "completion": CompletionArgs,
    "demo": DemoArgs,
    "sync-state rebuild": SyncStateArgs,
    "sync-state verify": SyncStateArgs,
    "job wait": JobArgs,
    "job status": JobArgs,
    "job cancel": JobArgs,
    "_job-worker": WorkerArgs,
}


@dataclass(frozen=True)
class Call:
    """One call of a command: its name (`run`, `job wait`), its options, and the command line as typed
    (a job's log names it, the run log's `start` line holds it). `quiet`: nothing on success."""

    command: str
    options: CommandArgs
    argv: tuple[str, ...] = ()
    quiet: bool = False

    FORM: ClassVar[int] = 1  # the stored form's version, in `spec.json`'s `call.form`

    def to_json(self) -> dict[str, Any]:
        options = {name: _jsonable(value) for name, value in _values(self.options).items()}
        return {"form": self.FORM, "command": self.command, "options": options, "quiet": self.quiet}


def _values(options: CommandArgs) -> dict[str, Any]:
    return {field.name: getattr(options, field.name) for field in dataclasses.fields(options)}


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_jsonable(item) for item in value]
    return value


class CallFormInvalid(ValueError):
    """A stored call that does not read back: `field` names where."""

    def __init__(self, field: str, want: str, value: object) -> None:
        super().__init__(f"{field}: expected {want}, found {value!r}")
        self.field, self.want, self.value = field, want, value


def call_from_json(data: object, argv: tuple[str, ...]) -> Call:
    """The call `Call.to_json` stored, read back field by field; `CallFormInvalid` names a field that
    is missing, unknown or mistyped, and a form this version does not know."""
    if not isinstance(data, dict):
        raise CallFormInvalid("call", "an object", data)
    if data.get("form") != Call.FORM:
        raise CallFormInvalid(
            "call.form", f"{Call.FORM} (the stored call's form this version reads)", data.get("form")
        )
    command = data.get("command")
    options_class = OPTIONS.get(command) if isinstance(command, str) else None
    if options_class is None or not isinstance(command, str):
        raise CallFormInvalid("call.command", "a command's name", command)
    quiet = data.get("quiet", False)
    if not isinstance(quiet, bool):
        raise CallFormInvalid("call.quiet", "true or false", quiet)
    return Call(command, read_options(options_class, data.get("options"), "call.options"), argv, quiet)


def read_options(options_class: type[CommandArgs], data: object, where: str) -> CommandArgs:
    """`options_class` from the JSON of its fields: each field checked against its type."""
    if not isinstance(data, dict):
        raise CallFormInvalid(where, "an object", data)
    hints = typing.get_type_hints(options_class)
    known = {field.name for field in dataclasses.fields(options_class)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CallFormInvalid(f"{where}.{unknown[0]}", "no such option", data[unknown[0]])
    values = {name: _read_value(hints[name], value, f"{where}.{name}") for name, value in data.items()}
    try:
        return options_class(**values)
    except TypeError as exc:  # a required option is missing
        raise CallFormInvalid(where, f"every option of {options_class.__name__}", data) from exc


_READERS: dict[object, tuple[str, Callable[[object], bool], Callable[[Any], object]]] = {
    str: ("a string", lambda v: isinstance(v, str), str),
    bool: ("true or false", lambda v: isinstance(v, bool), bool),
    int: ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool), int),
    Path: ("a path", lambda v: isinstance(v, str), Path),
}


def _read_value(hint: object, value: object, where: str) -> object:
    args = typing.get_args(hint)
    if type(None) in args:  # `X | None`
        if value is None:
            return None
        (hint,) = (arg for arg in args if arg is not type(None))
    if typing.get_origin(hint) is tuple:  # `tuple[X, ...]`
        if not isinstance(value, list):
            raise CallFormInvalid(where, "a list", value)
        return tuple(
            _read_value(typing.get_args(hint)[0], item, f"{where}[{i}]") for i, item in enumerate(value)
        )
    want, fits, make = _READERS[hint]
    if not fits(value):
        raise CallFormInvalid(where, want, value)
    return make(value)
