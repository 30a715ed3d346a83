"""One live run per job and runs directory, and the job's limits on every run (foreground too).

A second `run` of a job whose run is alive gets exit 6 RUN_LOCKED naming that run, never a relay
beside it; creating and indexing a run is one step, so a crash leaves one run or none; and
`max_lifetime_seconds` and `idle_timeout_seconds` bound a `--budget 0` run as they bound a job.
All with real processes against the loopback target.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.ops.invocation import INDEX_DIR
from bulkrelay.relay.stopping import STALL_GRACE_SECONDS
from tests.clirun import run_cli, start_cli
from tests.gatedruns import GATE, GATED_JOB, OPEN, delivered_ids
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runsteps import (
    ROWS,
    SLOW,
    assert_each_row_once,
    resume,
    run_job,
    run_job_stdin,
    sent_ids,
    stop_midway,
)
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_S

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

_DEADLINE = HANG_S  # the bound of conditions the tests wait for: only a hang reaches it


Started = list[subprocess.Popen[bytes]]


@pytest.fixture
def started() -> Iterator[Started]:
    """The `run` processes a test starts; any still alive at its end are killed."""
    processes: Started = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate()


def _start_run(started: Started, cwd: Path, job: Path, *extra: str) -> subprocess.Popen[bytes]:
    process = start_cli("run", job, "--budget", "0", *extra, cwd=cwd)
    started.append(process)
    return process


def _runs_root(cwd: Path) -> Path:
    return cwd / ".bulkrelay" / "runs"


def _run_dirs(root: Path) -> list[Path]:
    """Every directory in the runs directory `root` that is not BulkRelay's own bookkeeping (hidden)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _indexed_run_ids(runs_dir: Path) -> set[str]:
    index = runs_dir / INDEX_DIR
    return {entry.read_text().strip() for entry in index.iterdir()} if index.is_dir() else set()


def _wait_for(condition: str, check: object) -> None:
    assert callable(check)
    deadline = time.monotonic() + _DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        time.sleep(0.02)


def _replace_input(cwd: Path, tag: str) -> None:
    """New input bytes under the same name, by rename: a live run keeps reading the file it opened."""
    write_csv(cwd / "new.csv", make_rows(60, tag=tag))
    os.replace(cwd / "new.csv", cwd / "data.csv")


# ---------------------------------------------------------------------------- one live run


def test_identical_runs_started_together_make_one_run(tmp_path: Path, started: Started) -> None:
    rows = 40
    # Slow enough (concurrency 1, 1 s a row) that the first run is alive while every other caller decides.
    with TargetProcess({"rules": [{"delay_ms": 1000}]}) as target:
        job = write_job(tmp_path, target.url, rows=rows, execution={"concurrency": 1})
        runs_root = _runs_root(tmp_path)
        callers = [_start_run(started, tmp_path, job) for _ in range(6)]
        _wait_for(
            "all callers but one to end, or a second run",
            lambda: sum(p.poll() is not None for p in callers) >= 5 or len(_run_dirs(runs_root)) > 1,
        )
        [run_dir] = _run_dirs(runs_root)
        ended = [p for p in callers if p.poll() is not None]
        [relaying] = [p for p in callers if p.poll() is None]
        for caller in ended:
            stdout, stderr = caller.communicate()
            assert caller.returncode == ExitCode.CONFLICT, (stdout, stderr)
            envelope = orjson.loads(stdout)
            assert envelope["error"]["code"] == "RUN_LOCKED"
            assert run_dir.name in envelope["error"]["message"]
            assert envelope["error"]["context"]["run_dir"] == str(run_dir)
        target.set_plan({})
        stdout, _ = relaying.communicate(timeout=_DEADLINE)
        assert relaying.returncode == ExitCode.SUCCESS, stdout
        assert _run_dirs(_runs_root(tmp_path)) == [run_dir]
        assert_each_row_once(run_dir, rows)
        assert sorted(sent_ids(target).values()) == [1] * rows


def test_a_live_run_with_new_input_refuses_the_second_caller(tmp_path: Path, started: Started) -> None:
    # The first run is held at the target's gate (every request 503, retried) until the other callers
    # have been refused: on a loaded machine it could otherwise end before their preflight.
    with TargetProcess(GATE) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=60,
            execution={"concurrency": 2, "rate_limit": {"requests_per_second": 10}},
            **GATED_JOB,
        )
        first = _start_run(started, tmp_path, job)
        _wait_for("the first run to send", lambda: target.stats()["requests"] >= 3)
        [run_dir] = _run_dirs(_runs_root(tmp_path))
        _replace_input(tmp_path, tag="-tonight")

        second = run_job(tmp_path, job)

        assert second.exit_code == ExitCode.CONFLICT, second.envelope
        assert second.error_code == "RUN_LOCKED"
        assert run_dir.name in second.envelope["error"]["message"]
        assert second.envelope["warnings"] == []  # nothing was discarded
        from_stdin = run_job_stdin(tmp_path, job, (tmp_path / "data.csv").read_bytes())
        assert from_stdin.error_code == "RUN_LOCKED"
        assert not list((_runs_root(tmp_path) / ".spool").glob("stdin-*"))  # nothing of stdin is left
        assert first.poll() is None  # the live run goes on, alone
        target.set_plan(OPEN)
        stdout, _ = first.communicate(timeout=_DEADLINE)
        assert first.returncode == ExitCode.SUCCESS, stdout
        assert _run_dirs(_runs_root(tmp_path)) == [run_dir]
        delivered = delivered_ids(target)
        assert len(delivered) == 60 and set(delivered.values()) == {1}, delivered  # each row once
        # The limiter bounds starts (retries too); loopback scheduling can bunch arrivals by one or two.
        # A relay beside the live one would double the rate.
        assert target.stats()["max_arrivals_in_any_second"] <= 10 + 2


def test_resuming_an_older_run_of_a_live_job_is_refused(tmp_path: Path, started: Started) -> None:
    with TargetProcess(SLOW) as target:
        job = write_job(tmp_path, target.url, rows=ROWS)
        older = stop_midway(tmp_path, job, "--idempotency-key", "monday")
        target.set_plan({"rules": [{"delay_ms": 1000}]})
        _start_run(started, tmp_path, job, "--idempotency-key", "tuesday")
        _wait_for("tuesday's run to send", lambda: len(_run_dirs(_runs_root(tmp_path))) == 2)
        [live] = [run for run in _run_dirs(_runs_root(tmp_path)) if run.name != older.data["run_id"]]

        refused = resume(tmp_path, older.data["run_dir"])

    assert refused.exit_code == ExitCode.CONFLICT, refused.envelope
    assert refused.error_code == "RUN_LOCKED"
    assert refused.envelope["error"]["context"]["run_id"] == live.name  # the live run, not the one asked


def test_a_kill_while_creating_the_run_leaves_one_run_or_none(tmp_path: Path, started: Started) -> None:
    rows = 20
    randomness = random.Random()
    # Every request is held for a minute: no run ends on its own while runs are being killed.
    with TargetProcess({"rules": [{"delay_ms": 60_000}]}) as target:
        job = write_job(tmp_path, target.url, rows=rows, execution={"concurrency": 2})
        for attempt in range(24):
            runs_dir = tmp_path / f"runs-{attempt}"  # each attempt creates a run of its own
            proc = _start_run(started, tmp_path, job, "--runs-dir", str(runs_dir))
            if attempt % 2:
                _wait_for_any_change(proc, runs_dir)
                time.sleep(randomness.uniform(0.0, 0.03))
            else:
                time.sleep(randomness.uniform(0.0, 1.5))
            proc.kill()
            proc.communicate()
            runs = _run_dirs(runs_dir)
            assert len(runs) <= 1, (attempt, runs)
            assert {run.name for run in runs} <= _indexed_run_ids(runs_dir), (attempt, runs)
            assert all((run / "run.json").is_file() for run in runs), (attempt, runs)
        last = tmp_path / "runs-23"
        target.set_plan({})
        finished = run_job(tmp_path, job, "--runs-dir", str(last))
    assert finished.exit_code == ExitCode.SUCCESS, finished.envelope
    assert _run_dirs(last) == [Path(finished.data["run_dir"])]
    assert_each_row_once(finished.data["run_dir"], rows)


def _wait_for_any_change(proc: subprocess.Popen[bytes], root: Path) -> None:
    """Until anything at all shows up under the runs directory (or the process ends)."""
    deadline = time.monotonic() + _DEADLINE
    while proc.poll() is None and time.monotonic() < deadline:
        if root.is_dir() and any(root.iterdir()):
            return
        time.sleep(0.001)


def test_an_orphan_beside_the_run_does_not_confuse_the_identical_run(tmp_path: Path) -> None:
    with TargetProcess(SLOW) as target:
        job = write_job(tmp_path, target.url, rows=ROWS)
        stopped = stop_midway(tmp_path, job)
        # What an older version could leave after a kill: a directory without a manifest, and a
        # whole run that was never indexed.
        (_runs_root(tmp_path) / "20200101T000000Z-00000000").mkdir()
        unindexed = _runs_root(tmp_path) / "20200101T000000Z-11111111"
        shutil.copytree(stopped.data["run_dir"], unindexed)

        again = run_job(tmp_path, job)

    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_id"] == stopped.data["run_id"]
    assert again.envelope["warnings"] == []
    assert_each_row_once(again.data["run_dir"], ROWS)


# ------------------------------------------------------------------- limits of a foreground run


def test_max_lifetime_bounds_a_foreground_run(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"delay_ms": 200}]}) as target:
        job = write_job(
            tmp_path, target.url, rows=200, execution={"concurrency": 1, "max_lifetime_seconds": 2}
        )
        result = run_job(tmp_path, job)
    assert result.exit_code == ExitCode.TIMEOUT, result.envelope
    assert result.error_code == "TIMEOUT"
    # Ended by the lifetime, not by the end of the work (the target would take 40 s): said, not timed.
    assert result.envelope["error"]["context"]["limit"] == "max_lifetime_seconds"
    assert result.data["state"] == "stopped"
    assert 0 < result.data["progress"]["done"] < 200


@pytest.mark.parametrize("budget", ["0", HANG_BUDGET])
def test_a_stalled_run_ends_within_its_idle_timeout_and_grace(tmp_path: Path, budget: str) -> None:
    # Each response is held beyond any wait of the suite (a hang's bound): only the watchdog (idle
    # timeout 2 s, grace for rows in flight 2 s) can end the call, which would otherwise hang.
    with TargetProcess({"rules": [{"delay_ms": int(3 * HANG_S * 1000)}]}) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=4,
            execution={"concurrency": 2, "idle_timeout_seconds": 2, "timeout": {"read_seconds": 3 * HANG_S}},
        )
        result = run_cli("run", job, "--budget", budget, cwd=tmp_path, timeout=HANG_S)
    assert result.exit_code == ExitCode.TIMEOUT, result.envelope
    assert result.error_code == "STALLED"
    assert result.envelope["error"]["context"]["idle_timeout_seconds"] == 2
    assert result.envelope["error"]["context"]["grace_seconds"] == STALL_GRACE_SECONDS
    assert result.data["state"] == "forced"  # the two rows in flight were cancelled, not journaled
    assert result.data["progress"]["done"] == 0
