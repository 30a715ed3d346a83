"""Signals and closed output outside the happy path, with real processes.

SIGHUP stops a run like SIGTERM; a signal during start-up or preflight still gets its envelope and
sends nothing; a closed stdout, a reader that went away or a signal while the answer waits on a full pipe
costs the answer, never the exit code.
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import FrameType

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.job.inputs import InputSpec, open_records, spool_stdin
from tests.clirun import cli_env, run_cli_raw
from tests.spawnedruns import finish, journal_has_lines, run_dir_of, start_run
from tests.taggedjobs import journal, target_ids, write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S, wait_for

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_sighup_stops_a_run_at_a_safe_point_like_sigterm(tmp_path: Path, signum: signal.Signals) -> None:
    with TargetProcess({"rules": [{"delay_ms": 200}]}) as target:
        job = write_job(tmp_path, target.url, rows=200)
        proc = start_run(job)
        wait_for(lambda: journal_has_lines(job), "the first committed rows", interval=0.02)
        proc.send_signal(signum)
        result = finish(proc)
        taken = target_ids(target)
    assert result.exit_code == ExitCode.SIGTERM, result.envelope
    assert result.error_code == "TERMINATED"
    assert result.envelope["error"]["context"]["signal"] == signum.name
    assert f"stopped by {signum.name} at a safe point" in result.envelope["error"]["message"]
    run_dir = run_dir_of(job)
    assert result.data["state"] == "stopped"
    assert orjson.loads((run_dir / "run.json").read_bytes())["state"] == "stopped"
    journaled = sorted(e["row_number"] for e in journal(run_dir))
    assert sorted(taken) == journaled  # rows in flight finished and were recorded
    assert 0 < len(journaled) < 200


def _spooling_stdin(job: Path) -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    """`run --input -` blocked reading a stdin that stays open: start-up, before preflight.

    Started with SIGINT ignored, as a script's background command (`cmd &`) and so pytest itself may be:
    the interpreter then installs no handler of its own, so BulkRelay must, or SIGINT would be lost."""
    command = [sys.executable, "-m", "bulkrelay", "run", str(job), "--input", "-", "--budget", "0"]
    proc = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command, "--runs-dir", str(job.parent / "runs")],
        cwd=job.parent,
        env=cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"id,email,tag\n1,a@example.com,plain\n")
    proc.stdin.flush()
    spool = job.parent / "runs" / ".spool"
    wait_for(lambda: any(spool.glob("stdin-*")), "stdin being spooled", interval=0.02)  # made, then read into
    return proc, lambda: None  # stdin stays open until the process has answered


def _open_writer(fifo: Path) -> int:
    """The FIFO's write end, once a reader has opened it (ENXIO until then)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            assert exc.errno == errno.ENXIO and time.monotonic() < deadline, exc
            time.sleep(0.02)


def _reading_input_in_preflight(job: Path) -> tuple[subprocess.Popen[bytes], Callable[[], None]]:
    """`run` whose input is a FIFO: preflight opens it and blocks reading rows that never end."""
    records = job.parent / "records.csv"
    records.unlink()
    os.mkfifo(records)
    proc = start_run(job)
    writer = _open_writer(records)
    os.write(writer, b"id,email,tag\n1,a@example.com,plain\n")
    return proc, lambda: os.close(writer)


@pytest.mark.parametrize(
    ("phase", "signum", "code", "exit_code"),
    [
        ("start-up", signal.SIGTERM, "TERMINATED", ExitCode.SIGTERM),
        ("start-up", signal.SIGINT, "INTERRUPTED", ExitCode.SIGINT),
        ("preflight", signal.SIGHUP, "TERMINATED", ExitCode.SIGTERM),
        ("preflight", signal.SIGTERM, "TERMINATED", ExitCode.SIGTERM),
    ],
)
def test_a_signal_during_start_up_or_preflight_gets_its_envelope_and_sends_nothing(
    tmp_path: Path, phase: str, signum: signal.Signals, code: str, exit_code: ExitCode
) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        start = _spooling_stdin if phase == "start-up" else _reading_input_in_preflight
        proc, release_input = start(job)
        try:
            proc.send_signal(signum)
            proc.wait(timeout=HANG_S)
        finally:
            release_input()
        result = finish(proc)
        assert target.stats()["requests"] == 0
    assert result.exit_code == exit_code, (result.envelope, result.stderr)
    assert result.error_code == code
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "runs").glob("2*")), "no run was created"
    assert not list((tmp_path / "runs").glob(".spool/*")), "nothing from stdin outlives the command"


RELAY_START_PROGRAM = """\
import signal, sys
from bulkrelay.cli.main import main
from bulkrelay.relay.transport import reqwest

building = reqwest.ReqwestTransport.__init__


def signalled_while_building(self, settings):
    signal.raise_signal(signal.{signal})  # the relay has begun, its own handlers not yet installed
    building(self, settings)


reqwest.ReqwestTransport.__init__ = signalled_while_building
sys.argv = ["bulkrelay", "run", sys.argv[1], "--budget", "0", "--runs-dir", sys.argv[2]]
main()
"""


def _run_program(tmp_path: Path, source: str, *args: Path) -> subprocess.CompletedProcess[bytes]:
    """`source` run as a program of its own in `tmp_path` (the CLI with a step changed), to its end."""
    program = tmp_path / "program.py"
    program.write_text(source)
    return subprocess.run(
        [sys.executable, str(program), *map(str, args)],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=HANG_S,
        check=False,
    )


@pytest.mark.parametrize(
    ("signum", "code", "exit_code"),
    [(signal.SIGTERM, "TERMINATED", ExitCode.SIGTERM), (signal.SIGINT, "INTERRUPTED", ExitCode.SIGINT)],
)
def test_a_signal_while_the_relay_starts_gets_its_envelope(
    tmp_path: Path, signum: signal.Signals, code: str, exit_code: ExitCode
) -> None:
    """A signal inside the relay's task group before the relay's own handlers are in place (its HTTP
    client being built) is raised there by the CLI's handler, and the task group wraps it: it still
    reaches the CLI as itself, not as a traceback and exit 1."""
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)  # nothing is sent: the signal comes first
    proc = _run_program(tmp_path, RELAY_START_PROGRAM.format(signal=signum.name), job, tmp_path / "runs")
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == exit_code, stderr
    envelope = orjson.loads(proc.stdout)
    assert envelope["error"]["code"] == code
    assert envelope["meta"]["exit_code"] == exit_code
    assert "Traceback" not in stderr


WRAPPED_PROGRAM = """\
import signal, sys
from bulkrelay.cli import commands
from bulkrelay.cli.main import main


def importing(call, runtime):
    class Field:  # a class being made, as the commands' dataclasses are while they are imported
        def __set_name__(self, owner, name):
            signal.raise_signal(signal.SIGTERM)

    class Record:
        started = Field()


commands.run_call = importing
sys.argv = ["bulkrelay", "validate", sys.argv[1]]
main()
"""


def test_a_sigterm_python_wraps_in_another_error_still_answers_143(tmp_path: Path) -> None:
    """Python 3.11 wraps an exception raised in `__set_name__` in a RuntimeError: a SIGTERM landing there
    during start-up's imports (1 of 200 kills at random moments) became GENERAL_ERROR, exit 1."""
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    proc = _run_program(tmp_path, WRAPPED_PROGRAM, job)
    envelope = orjson.loads(proc.stdout)
    assert proc.returncode == ExitCode.SIGTERM, envelope
    assert envelope["error"]["code"] == "TERMINATED"
    assert "detail" not in envelope["error"]  # no traceback


class _Signalled(Exception):
    """What the test's SIGUSR1 handler raises, as the CLI's raise for SIGINT and SIGTERM."""


def _raise_signalled(_signum: int, _frame: FrameType | None) -> None:
    raise _Signalled


@contextmanager
def _signal_raising_in_this_thread() -> Iterator[None]:
    """SIGUSR1 raises _Signalled here (the main thread), and is blocked here: only another thread takes it."""
    previous = signal.signal(signal.SIGUSR1, _raise_signalled)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        signal.signal(signal.SIGUSR1, previous)


def _waiting_for_input(native_id: int) -> bool:
    """Whether that thread sleeps in the kernel waiting for a pipe (a read, a poll or a select)."""
    wchan = Path(f"/proc/self/task/{native_id}/wchan").read_text()
    return any(word in wchan for word in ("pipe_read", "poll", "select"))


def _signalled_while_waiting_for_input(
    read: Callable[[], object], ready: Callable[[], bool], release: Callable[[], None]
) -> bool:
    """Run `read` in this (the main) thread; once `ready()` and this thread waits in the kernel for
    input, another thread takes SIGUSR1 for the process: the signal lands just before a blocking read,
    every time. `read` must raise _Signalled. True if it did so before the test gave up on it and
    called `release` (which ends the input, so a read that slept through the signal ends anyway)."""
    main, answered, given_up = threading.get_native_id(), threading.Event(), threading.Event()

    def signal_the_process_then_give_up() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        wait_for(lambda: ready() and _waiting_for_input(main), "the read waiting for input", interval=0.02)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # flagged for the main thread
        if not answered.wait(HANG_S):  # only a read that sleeps through the signal gets here
            given_up.set()
            release()

    with _signal_raising_in_this_thread():
        helper = threading.Thread(target=signal_the_process_then_give_up)
        helper.start()
        try:
            with pytest.raises(_Signalled):
                read()
        finally:
            answered.set()
            helper.join()
    return not given_up.is_set()


def test_a_signal_landing_just_before_the_stdin_read_still_ends_the_spool(tmp_path: Path) -> None:
    """The race behind a lost start-up SIGINT, made certain: the signal arrives after the interpreter
    last looked for one, so the read that follows waits for more stdin, which an open pipe never sends."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"id,email,tag\n1,a@example.com,plain\n")
    dest = tmp_path / "stdin-copy"
    released: list[bool] = []

    def release() -> None:
        released.append(True)
        os.close(write_end)

    with os.fdopen(read_end, "rb") as stdin:
        in_time = _signalled_while_waiting_for_input(lambda: spool_stdin(dest, stdin), dest.exists, release)
    if not released:
        os.close(write_end)
    assert in_time, "the copy waited for the end of stdin before it noticed the signal"
    assert not dest.exists()  # nothing from stdin outlives the command


def test_a_signal_landing_just_before_a_read_of_a_fifo_input_still_ends_preflight(tmp_path: Path) -> None:
    """The same race in preflight, reading an input that is a FIFO (`--input <(zcat ...)`)."""
    fifo = tmp_path / "records.csv"
    os.mkfifo(fifo)
    writer: list[int] = []

    def open_writer_and_write() -> None:
        writer.append(os.open(fifo, os.O_WRONLY))  # returns once preflight has opened it
        os.write(writer[0], b"id,email,tag\n1,a@example.com,plain\n")

    opener = threading.Thread(target=open_writer_and_write)
    opener.start()
    records: list[object] = []

    def read_every_record() -> None:
        with open_records(InputSpec.detect(fifo), records.append) as stream:
            records.extend(stream)

    released: list[bool] = []

    def release() -> None:
        released.append(True)
        os.close(writer[0])

    try:
        in_time = _signalled_while_waiting_for_input(read_every_record, lambda: bool(records), release)
    finally:
        opener.join()
        if not released:
            os.close(writer[0])
    assert in_time, "preflight waited for more input before it noticed the signal"
    assert len(records) == 1  # the row written; the signal came while waiting for the next


def _close_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize("output", ["json", "human"])  # rich's own EPIPE handling exited 1: not for us
@pytest.mark.parametrize("how", ["closed", "reader gone"])
@pytest.mark.parametrize(("valid", "exit_code"), [(True, ExitCode.SUCCESS), (False, ExitCode.ARG_ERROR)])
def test_a_closed_stdout_keeps_the_exit_code_and_gives_no_traceback(
    tmp_path: Path, output: str, how: str, valid: bool, exit_code: ExitCode
) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    if not valid:
        job.write_text(job.read_text() + "unknown_key: 1\n")
    read_end, write_end = os.pipe()
    if how == "reader gone":
        os.close(read_end)  # a reader that closed the pipe: writing the envelope meets EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bulkrelay", "validate", str(job), f"--{output}"],
            cwd=tmp_path,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            preexec_fn=_close_stdout if how == "closed" else None,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
        if how != "reader gone":
            os.close(read_end)
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == exit_code, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert len(stderr) < 200, stderr  # a short note at most


def test_a_run_with_its_stdout_closed_relays_and_exits_with_its_code(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=20)
        proc = subprocess.run(
            [sys.executable, "-m", "bulkrelay", "run", str(job), "--runs-dir", str(tmp_path / "runs")],
            cwd=tmp_path,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_close_stdout,
            timeout=120,
            check=False,
        )
        sent = sorted(target_ids(target))
    assert proc.returncode == ExitCode.SUCCESS, proc.stderr
    assert b"Traceback" not in proc.stderr
    assert sent == list(range(1, 21))
    assert sorted(e["row_number"] for e in journal(run_dir_of(job))) == sent


@pytest.mark.parametrize("closed", [(2,), (0, 1, 2)], ids=["stderr", "all three"])
def test_a_run_with_standard_streams_closed_relays_and_exits_with_its_code(
    tmp_path: Path, closed: tuple[int, ...]
) -> None:
    """`bulkrelay run ... <&- >&- 2>&-` (a daemon's child, a careless crontab): the closed streams become
    /dev/null, and the run relays as any other. A closed stderr failed the run before it started (exit 1,
    on `sys.stderr.isatty()`)."""
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=20)
        proc = run_cli_raw(
            "run", job, "--budget", "0", "--runs-dir", tmp_path / "runs",
            cwd=tmp_path,
            preexec_fn=partial(_close_fds, closed),
        )  # fmt: skip
        sent = sorted(target_ids(target))
    assert proc.returncode == ExitCode.SUCCESS
    assert sent == list(range(1, 21))
    assert sorted(e["row_number"] for e in journal(run_dir_of(job))) == sent


def _close_fds(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)


def _writing_to_a_full_pipe(pid: int, read_end: int, size: int) -> bool:
    """Whether the process's main thread sleeps in the kernel writing to a pipe with no room left.

    BulkRelay's processes are not dumpable (no core file), so to a reader other than root the kernel
    shows their wchan as "0": then the process asleep and its pipe full say the same."""
    wchan = Path(f"/proc/{pid}/wchan").read_text()
    if wchan != "0":
        return "pipe_write" in wchan
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    waiting = array.array("i", [0])
    fcntl.ioctl(read_end, termios.FIONREAD, waiting)
    return state == "S" and waiting[0] >= size


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_answer_waits_on_a_full_pipe_keeps_the_exit_code(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """A reader that does not read (stdout a full pipe) and then a signal (a scheduler's timeout): the
    work is done, so, as with a reader gone, the answer is lost but not the exit code, with no traceback."""
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=100)
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # render's envelope of 100 requests is far larger
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bulkrelay", "render", str(job), "--rows", "1-100", "--json"],
            cwd=tmp_path,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
        )
        os.close(write_end)
        full = partial(_writing_to_a_full_pipe, proc.pid, read_end, 4096)
        wait_for(full, "the envelope filling the pipe", interval=0.02)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        os.close(read_end)
    stderr = err.decode(errors="replace")
    assert proc.returncode == ExitCode.SUCCESS, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    assert len(stderr) < 200, stderr  # a short note at most
