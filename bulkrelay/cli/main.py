"""The command line: parse, call the library, render one result, exit with its code.

This is the only catch site. In JSON mode (`--json`, or stdout not a terminal) stdout carries
exactly one envelope, whatever happens, including usage errors and unexpected exceptions; but
`--help` and `--version` are text wherever stdout goes, unless `--json` asks for their envelope.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from bulkrelay.background.call import Call, JobArgs, RunsArgs, StatusArgs, WorkerArgs
from bulkrelay.cli.parser import Answered, HelpText, VersionInfo, exports_to_stdout, parse_call
from bulkrelay.cli.process_exit import exit_process
from bulkrelay.envelope import ErrorInfo, Result, dumps_envelope, to_envelope
from bulkrelay.errors import BulkRelayError, ExitCode, UsageError
from bulkrelay.private import no_core_dumps

if TYPE_CHECKING:
    from bulkrelay.background.state import BackgroundJobSpec
    from bulkrelay.background.worker import BackgroundSupervisor


def json_mode(argv: Sequence[str]) -> bool:
    """`--json`, else JSON when stdout is not a terminal, unless `--human` or `--quiet` asks for people."""
    if "--json" in argv:
        if "--human" in argv:
            raise UsageError(
                "--json and --human ask for two different outputs", suggestion="give one of them"
            )
        return True
    return not sys.stdout.isatty() and "--human" not in argv and "--quiet" not in argv


def dispatch(call: Call, started: float) -> Result:
    """The call to its command; `started`: when the call began (its budget counts from there)."""
    if isinstance(call.options, WorkerArgs):
        with _no_collection():
            from bulkrelay.background import worker  # a background job's own process
        return worker.run_worker(call.options.job_id, run_stored_call)
    if isinstance(call.options, StatusArgs | RunsArgs | JobArgs):  # no job file's schema, no relay
        with _no_collection():
            from bulkrelay.cli import watching
        return watching.watch(call.command, call.options)
    with _no_collection():
        from bulkrelay.cli import commands  # the commands; imported late so `--help` stays fast
    return commands.run_call(call, commands.Runtime(started))


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No garbage collection while the commands are imported: that makes some 90,000 objects (classes,
    the job file's schema), none of them garbage, which the collector scanned again and again. A one-row
    `run` takes 0.97 of the time without it (farm-bench, 20 pairs, median).

    Then they are frozen (`gc.freeze`): they live as long as the process, and left young, the first
    collection after the import walked them all (25 ms), and the full one before the relay
    (relay/heap.py) again (20-28 ms). The import leaves about 700 objects of garbage in cycles
    (functions and classes that `dataclass(slots=True)` replaced, no files), now kept, a few hundred
    KiB. A one-row `run` takes 0.86 of the time with the freeze (farm-bench, 20 pairs, median)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def run_stored_call(spec: BackgroundJobSpec, supervisor: BackgroundSupervisor) -> Result:
    """A background job's call, run to its end in its worker: no budget (it is the job), and the
    supervisor owns its signals and bounds. A job an earlier version wrote holds only its command
    line, parsed again here as that version's worker did."""
    with _no_collection():  # the worker's import of the commands, as the front process's (dispatch)
        from bulkrelay.cli import commands

    call = spec.call if spec.call is not None else parse_call(spec.argv)
    return commands.run_call(call, commands.Runtime(time.monotonic(), supervisor))


class _Terminated(BaseException):
    """SIGTERM or SIGHUP outside the relay (start-up, preflight): end there, still with an envelope.

    The relay, the budget's front process and a job's worker install their own handlers meanwhile,
    so there the signal stops the work at a safe point instead."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise _Terminated(signum)


def _open_closed_standard_streams() -> None:
    """A closed stdin, stdout or stderr (`bulkrelay ... <&- >&- 2>&-`, a daemon's child) becomes /dev/null:
    the command runs and exits with its code. Left closed, the run's next file would take its number, and
    whatever writes to stderr (a library's warning, a Rust panic) would write into the journal."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
            if null != fd:  # the lowest free number: `fd` itself unless a lower one is closed too
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 - lives as long as the process


# BulkRelay leans on POSIX: fsync of directories, fcntl locks, sessions and process groups for background
# jobs, SIGTERM/SIGHUP. On another system it would fail half-way through a run; it says so at once.
UNSUPPORTED_PLATFORM = (
    "bulkrelay runs on Linux and macOS (POSIX) only; on Windows, run it in WSL 2 or a Linux container\n"
)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    if os.name != "posix":
        sys.stderr.write(UNSUPPORTED_PLATFORM)
        sys.exit(int(ExitCode.GENERAL_ERROR))
    if argv is None:  # the program (not a caller in its own process): it holds secrets, so no core
        no_core_dumps()
    for handled in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(handled, _raise_terminated)
    # Python raises KeyboardInterrupt only when SIGINT was not ignored at start (a script's `cmd &` ignores
    # it); the relay handles SIGINT either way, so start-up and preflight must too, or it would be lost.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _open_closed_standard_streams()
    the_program = argv is None  # `bulkrelay`, `python -m bulkrelay`, not a caller that goes on
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    quiet = "--quiet" in argv
    as_json = "--json" in argv or not sys.stdout.isatty()
    try:
        as_json = json_mode(argv)
        result = dispatch(parse_call(argv), started)
    except Answered as answered:  # `--help`, `--version`: text for people and pipes (`| grep`, `| less`)
        result = answered.result
        as_json = "--json" in argv
    except BulkRelayError as exc:
        result = Result.from_error(exc)
    except KeyboardInterrupt:
        result = _stopped_outside_the_relay("INTERRUPTED", ExitCode.SIGINT, "SIGINT")
    except _Terminated as signalled:
        result = _stopped_outside_the_relay("TERMINATED", ExitCode.SIGTERM, signalled.name)
    except Exception as exc:  # the one place an unexpected failure becomes an answer
        result = _signalled_within(exc) or Result.from_unexpected(exc)
    emit(result, started=started, as_json=as_json, quiet=quiet, on_stderr=exports_to_stdout(argv))
    if the_program:  # see cli/process_exit.py
        exit_process(int(result.exit_code))
    sys.exit(int(result.exit_code))  # called in a process that goes on (a test, a profile): SystemExit


def _signalled_within(exc: BaseException) -> Result | None:
    """The answer to a signal whose exception Python wrapped in another (3.11 wraps one raised in a
    `__set_name__`, as a dataclass's while start-up imports the commands, in a RuntimeError); None
    when no signal's exception caused `exc`."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, KeyboardInterrupt):
            return _stopped_outside_the_relay("INTERRUPTED", ExitCode.SIGINT, "SIGINT")
        if isinstance(cause, _Terminated):
            return _stopped_outside_the_relay("TERMINATED", ExitCode.SIGTERM, cause.name)
        cause = cause.__cause__ or cause.__context__
    return None


def _stopped_outside_the_relay(code: str, exit_code: ExitCode, name: str) -> Result:
    return Result(
        exit_code=exit_code,
        kind="error",
        error=ErrorInfo(
            code,
            f"stopped by {name} while no row was in flight (start-up, preflight or wrap-up)",
            retryable=True,
            suggestion="run the same command again: it continues any run this one left unfinished",
        ),
    )


# Warnings also said on stderr in JSON mode: an unattended caller (cron) never reads the envelope.
_STDERR_WARNINGS = frozenset({"BUDGET_HANDOFF_UNATTENDED"})


def emit(
    result: Result, *, started: float, as_json: bool, quiet: bool = False, on_stderr: bool = False
) -> None:
    """Print the result; a reader that went away (EPIPE) costs the answer, never the exit code, and
    so does a signal while the answer waits on a reader that does not read (a full pipe): the work
    is done. `--quiet`: nothing on success (cron mails any output). `on_stderr`: stdout carries data
    (`export -o -`), so the envelope goes to stderr."""
    if quiet and result.exit_code == ExitCode.SUCCESS:
        _loud_warnings(result)
        return
    try:
        _write_result(result, started=started, as_json=as_json, on_stderr=on_stderr)
    except OSError as exc:  # EPIPE, or EIO from a terminal that hung up
        _not_delivered(f"stdout: {exc.strerror or exc}")
    except KeyboardInterrupt:
        _not_delivered("stopped by SIGINT while writing it")
    except _Terminated as signalled:
        _not_delivered(f"stopped by {signalled.name} while writing it")


# What nobody would learn in time otherwise: a night's message that was not sent, the metrics an alert
# reads that were not written. `--quiet` still prints these (cron mails them).
_LOUD_WARNINGS = frozenset({"NOTIFY_FAILED", "METRICS_WRITE_FAILED", "METRICS_PUSH_FAILED"})


def _loud_warnings(result: Result) -> None:
    with contextlib.suppress(OSError, ValueError):
        for warning in result.warnings:
            if warning.code in _LOUD_WARNINGS:
                sys.stderr.write(f"bulkrelay: warning {warning.code}: {warning.message}\n")
        sys.stderr.flush()


def _not_delivered(why: str) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # so the interpreter's last flush of stdout has somewhere to go, at once
    os.close(devnull)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(f"bulkrelay: the answer was not delivered: {why}\n")
        sys.stderr.flush()


def _write_result(result: Result, *, started: float, as_json: bool, on_stderr: bool) -> None:
    duration_ms = result.side.work_duration_ms
    if duration_ms is None:
        duration_ms = round((time.monotonic() - started) * 1000)
    payload = result.side.stdout_payload  # the whole answer (`completion`): no envelope
    envelope = to_envelope(result, duration_ms=duration_ms)
    if as_json or on_stderr:
        for warning in result.warnings:
            if warning.code in _STDERR_WARNINGS:
                sys.stderr.write(f"bulkrelay: warning {warning.code}: {warning.message}\n")
                sys.stderr.flush()
    if isinstance(payload, str):
        sys.stdout.write(payload)
        sys.stdout.flush()
        if on_stderr:  # `report -o -`: the page on stdout, its envelope beside it
            sys.stderr.buffer.write(dumps_envelope(envelope))
            sys.stderr.flush()
    elif on_stderr:
        sys.stderr.buffer.write(dumps_envelope(envelope))
        sys.stderr.flush()
    elif as_json:
        sys.stdout.buffer.write(dumps_envelope(envelope))
        sys.stdout.flush()
    elif (plain := _plain_answer(result)) is not None:  # --help, --version: no rich to load (0.1 s bar)
        sys.stdout.write(plain)
        sys.stdout.flush()
    else:
        from bulkrelay.cli.human import print_human  # rich loads only when a person reads the output

        print_human(result, envelope)


def _plain_answer(result: Result) -> str | None:
    """The text of `--help` or `--version` for a person: plain text, as rich would print it."""
    data = result.data
    if result.warnings or result.error is not None:
        return None
    if isinstance(data, HelpText):
        return data.help
    if isinstance(data, VersionInfo):
        return f"{data.name} {data.version}\n"
    return None
