"""A hung worker (here frozen by SIGSTOP: it stands for a stuck syscall or a deadlocked library) never
holds a run's stop: once the parent has asked its workers to stop, a worker that has not ended within
the bound (its exchange deadline and a margin; at once, give or take a moment, for a forced stop) is
killed, and the run ends as asked, its rows pending as after a kill -9 of that worker."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, start_cli
from tests.jobfiles import write_job
from tests.runsteps import assert_each_row_once, resume
from tests.spawnedruns import run_dir_of
from tests.targetproc import TargetProcess
from tests.waiting import wait_for
from tests.workerprocs import wait_for_workers, wait_until_gone

pytestmark = pytest.mark.slow  # real processes: outside the fast lane

ROWS = 600  # two workers at four requests of 40 ms each: 3 s of sending, time to act midway
ENDS_WITHIN_S = 90.0  # a run that hangs never ends; one that ends does so in about 10 s here
EXCHANGE = {"connect_seconds": 1, "write_seconds": 1, "read_seconds": 1}  # the stop's bound: 3 s + margin


def _job(tmp_path: Path, url: str, **execution: Any) -> Path:
    return write_job(
        tmp_path,
        url,
        rows=ROWS,
        input={"key": "id"},
        request={"idempotency_key": {"header": "Idempotency-Key"}},
        execution={"concurrency": 8, "workers": 2, "timeout": EXCHANGE, **execution},
    )


@contextmanager
def _one_worker_frozen(job: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`bulkrelay run JOB ARGS` with one of its two workers stopped (SIGSTOP) once rows are committed;
    whatever the test finds, nothing is left stopped or running after it."""
    proc = start_cli("run", job, "--budget", "0", "--runs-dir", job.parent / "runs", *args, cwd=job.parent)
    workers = wait_for_workers(proc, 2)
    try:
        wait_for(lambda: _journal_bytes(job) > 2000, "the first committed rows", interval=0.01)
        os.kill(workers[1], signal.SIGSTOP)
        yield proc, workers[1]
    finally:
        for pid in (workers[1], proc.pid):
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate()


def _journal_bytes(job: Path) -> int:
    journals = list((job.parent / "runs").glob("2*/results.jsonl"))
    return journals[0].stat().st_size if journals else 0


def _ended(proc: subprocess.Popen[bytes]) -> CliResult:
    """The run's envelope; a run still going after ENDS_WITHIN_S is hung (the test fails)."""
    try:
        stdout, stderr = proc.communicate(timeout=ENDS_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run was still going {ENDS_WITHIN_S:.0f} s after its stop: a hung worker held it")
    return CliResult(proc.returncode, orjson.loads(stdout), stderr.decode(errors="replace"), stdout)


def _assert_killed(result: CliResult, pid: int) -> None:
    """The envelope names the worker killed, in the error's context and a warning."""
    killed = result.envelope["error"]["context"]["workers_killed"]
    assert [entry["pid"] for entry in killed] == [pid], killed
    assert killed[0]["worker"] in (0, 1) and killed[0]["log"].endswith(f"worker-{killed[0]['worker']}.log")
    warnings = [w for w in result.envelope["warnings"] if w["code"] == "WORKER_KILLED"]
    assert len(warnings) == 1 and f"pid {pid}" in warnings[0]["message"], result.envelope["warnings"]


def _resumed_to_the_end(tmp_path: Path, run_dir: str | Path, target: TargetProcess) -> None:
    target.set_plan({"dedup": True})  # no delay now: the rest at once
    done = resume(tmp_path, run_dir)
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    assert_each_row_once(run_dir, ROWS)
    assert target.stats()["effects"] == ROWS  # the killed worker's rows in flight took effect once


@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 40}]})
def test_a_timeout_ends_the_run_though_a_worker_is_frozen(tmp_path: Path, target: TargetProcess) -> None:
    job = _job(tmp_path, target.url)

    with _one_worker_frozen(job, "--timeout", "3") as (proc, frozen):
        stopped = _ended(proc)
        wait_until_gone([frozen])

    assert (stopped.exit_code, stopped.error_code) == (ExitCode.TIMEOUT, "TIMEOUT"), stopped.envelope
    assert stopped.data["state"] == "stopped" and stopped.data["progress"]["done"] < ROWS
    _assert_killed(stopped, frozen)
    _resumed_to_the_end(tmp_path, stopped.data["run_dir"], target)


@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 40}]})
def test_a_second_sigint_forces_the_stop_though_a_worker_is_frozen(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = _job(tmp_path, target.url)

    with _one_worker_frozen(job) as (proc, frozen):
        proc.send_signal(signal.SIGINT)
        run_log = run_dir_of(job) / "run.log"
        wait_for(lambda: b'"stop_requested"' in run_log.read_bytes(), "the first SIGINT heard", interval=0.01)
        proc.send_signal(signal.SIGINT)
        forced = _ended(proc)
        wait_until_gone([frozen])

    assert (forced.exit_code, forced.error_code) == (ExitCode.SIGINT, "INTERRUPTED"), forced.envelope
    assert forced.data["state"] == "forced"
    _assert_killed(forced, frozen)
    _resumed_to_the_end(tmp_path, forced.data["run_dir"], target)


@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 40}]})
def test_the_idle_watchdog_ends_the_run_though_a_worker_is_frozen(
    tmp_path: Path, target: TargetProcess
) -> None:
    # The other worker ends its rows; then nothing moves for 2 s: STALLED, forced after its grace.
    job = _job(tmp_path, target.url, idle_timeout_seconds=2)

    with _one_worker_frozen(job) as (proc, frozen):
        stalled = _ended(proc)
        wait_until_gone([frozen])

    assert (stalled.exit_code, stalled.error_code) == (ExitCode.TIMEOUT, "STALLED"), stalled.envelope
    assert stalled.data["state"] == "forced"
    _assert_killed(stalled, frozen)
    _resumed_to_the_end(tmp_path, stalled.data["run_dir"], target)
