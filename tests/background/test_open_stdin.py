"""A budgeted `run --input -` whose standard input stays open (the writer has not closed the pipe).

Until stdin ends there is no work to hand off: a signal ends the call there (130 / 143, nothing sent,
no job, no spool left), and a budget that runs out first releases the caller with exit 14 while the
job reads the rest of stdin, then relays all of it. Real processes, a real pipe kept open by the test.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, cli_env, run_cli
from tests.jobfiles import write_job
from tests.runsteps import assert_each_row_once, sent_ids
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

HEADER = b"id,email,name\n"
HANG = 60  # seconds: only a call that waits for the end of stdin takes this long


def _rows(first: int, last: int) -> bytes:
    return b"".join(f"{n},user{n}@example.com,User {n}\n".encode() for n in range(first, last + 1))


@contextmanager
def _budgeted_run(tmp_path: Path, job: Path, budget: str) -> Iterator[subprocess.Popen[bytes]]:
    """`run JOB --input - --budget B` reading a pipe the test holds open (closed when the block ends)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bulkrelay", "run", str(job), "--input", "-", "--budget", budget],
        cwd=tmp_path,
        env=cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state")),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    with proc:  # closes every pipe, stdin last, and waits
        yield proc


def _write(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.flush()


def _answer(proc: subprocess.Popen[bytes]) -> CliResult:
    """The call's envelope once it has exited: stdin is still open, so only a hang reaches the bound."""
    proc.wait(timeout=HANG)
    assert proc.stdout is not None and proc.stderr is not None
    stdout = proc.stdout.read()
    envelope = orjson.loads(stdout)
    assert envelope["meta"]["exit_code"] == proc.returncode
    return CliResult(proc.returncode, envelope, proc.stderr.read().decode(errors="replace"), stdout)


def _spools(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "state" / "jobs" / ".spool").glob("stdin-*"))


def _wait_until_spooled(tmp_path: Path, size: int) -> None:
    """Until the call has copied `size` bytes of stdin to its spool: it is reading, and waits for more."""
    deadline = time.monotonic() + HANG
    while not any(spool.stat().st_size == size for spool in _spools(tmp_path)):
        assert time.monotonic() < deadline, "the call never read the rows written to its stdin"
        time.sleep(0.02)


def _job_wait(tmp_path: Path, job_id: str) -> CliResult:
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    return run_cli("job", "wait", job_id, "--budget", "120s", cwd=tmp_path, env=env)


def _jobs(tmp_path: Path) -> list[str]:
    return [path.name for path in (tmp_path / "state" / "jobs").glob("run-*")]


@pytest.mark.parametrize(
    ("signum", "code", "exit_code"),
    [
        (signal.SIGTERM, "TERMINATED", ExitCode.SIGTERM),
        (signal.SIGINT, "INTERRUPTED", ExitCode.SIGINT),
        (signal.SIGHUP, "TERMINATED", ExitCode.SIGTERM),
    ],
)
def test_a_signal_while_stdin_stays_open_ends_the_call_at_once_and_sends_nothing(
    tmp_path: Path, signum: signal.Signals, code: str, exit_code: ExitCode
) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=1)
        with _budgeted_run(tmp_path, job, "10m") as proc:
            _write(proc, HEADER + _rows(1, 3))
            _wait_until_spooled(tmp_path, len(HEADER + _rows(1, 3)))
            proc.send_signal(signum)
            result = _answer(proc)  # stdin is still open here
        assert target.stats()["requests"] == 0
    assert result.exit_code == exit_code, (result.envelope, result.stderr)
    assert result.error_code == code
    assert "Traceback" not in result.stderr
    assert _jobs(tmp_path) == []  # nothing was handed off: there was no work yet
    assert _spools(tmp_path) == []  # nothing from stdin outlives the command


def test_a_budget_that_runs_out_while_stdin_stays_open_hands_the_rest_of_stdin_to_the_job(
    tmp_path: Path,
) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=1)
        with _budgeted_run(tmp_path, job, "1s") as proc:
            _write(proc, HEADER + _rows(1, 5))
            handed_off = _answer(proc)  # stdin is still open here
            assert handed_off.exit_code == ExitCode.INCOMPLETE, (handed_off.envelope, handed_off.stderr)
            assert handed_off.data["state"] == "running"
            assert target.stats()["requests"] == 0  # the job waits for the end of its input
            _write(proc, _rows(6, 12))  # the writer goes on after the caller was released
        job_id = handed_off.data["job_id"]
        done = _job_wait(tmp_path, job_id)
        assert done.exit_code == ExitCode.SUCCESS, done.envelope
        assert sorted(sent_ids(target), key=int) == [str(n) for n in range(1, 13)]
    assert_each_row_once(done.data["run_dir"], 12)
    kept = tmp_path / "state" / "jobs" / job_id / "stdin"
    assert kept.read_bytes() == HEADER + _rows(1, 12)
    assert _spools(tmp_path) == []


def test_job_cancel_while_the_job_still_reads_stdin_ends_it_with_nothing_sent(tmp_path: Path) -> None:
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=1)
        with _budgeted_run(tmp_path, job, "1s") as proc:
            _write(proc, HEADER + _rows(1, 3))
            handed_off = _answer(proc)
            assert handed_off.exit_code == ExitCode.INCOMPLETE, (handed_off.envelope, handed_off.stderr)
            job_id = handed_off.data["job_id"]
            cancelled = run_cli("job", "cancel", job_id, "--budget", "120s", cwd=tmp_path, env=env)
            ended = run_cli("job", "status", job_id, cwd=tmp_path, env=env)  # stdin is still open here
        assert target.stats()["requests"] == 0
    assert cancelled.exit_code == ExitCode.SUCCESS, cancelled.envelope
    assert cancelled.data["job_exit_code"] == ExitCode.SIGTERM
    assert ended.error_code == "CANCELLED"
    assert not list(tmp_path.glob(".bulkrelay/runs/2*"))  # no run was made


def test_an_ended_stdin_is_copied_whole_when_start_up_spent_the_budget(tmp_path: Path) -> None:
    """Issue 38 item 11: stdin had ended (the writer closed the pipe) but the budget was spent by
    start-up alone, so the call stopped copying at once and handed the worker its own pipe to read.
    The job must own all of stdin from the start: its spec says there is no rest, and its key is known."""
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=1)
        with _budgeted_run(tmp_path, job, "1ms") as proc:
            _write(proc, HEADER + _rows(1, 40))
            assert proc.stdin is not None
            proc.stdin.close()  # stdin has reached its end before the call reads a byte of it
            handed_off = _answer(proc)
        job_id = handed_off.envelope["meta"]["job_id"]
        spec = orjson.loads((tmp_path / "state" / "jobs" / job_id / "spec.json").read_bytes())
        assert spec["stdin_rest"] is False and spec["key"], spec
        done = _job_wait(tmp_path, job_id)
        assert done.exit_code == ExitCode.SUCCESS, done.envelope
        assert sorted(sent_ids(target), key=int) == [str(n) for n in range(1, 41)]
    assert (tmp_path / "state" / "jobs" / job_id / "stdin").read_bytes() == HEADER + _rows(1, 40)
    assert _spools(tmp_path) == []
