"""The run log: `run.log` in the run directory (0600), JSON lines with UTC timestamps, and `--log-file`."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.envelope import Result
from bulkrelay.errors import ExitCode
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.ops.runlog import RunLog
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.progress import Snapshot
from bulkrelay.relay.ratelimit import Pace
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.rundir import RUN_LOG, RunDir
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.runfiles import read_log
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def events(lines: list[dict[str, Any]]) -> list[str]:
    return [line["event"] for line in lines]


def test_a_run_logs_its_life_to_run_log_and_the_log_file(tmp_path: Path) -> None:
    plan = {
        "rules": [
            {"match": {"path_contains": "/items/3"}, "status": 429, "retry_after": "1", "first_attempts": 1}
        ]
    }
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, rows=6, retry={"max_attempts": 2})
        log_file = tmp_path / "logs" / "nightly.log"
        log_file.parent.mkdir()
        result = run_cli("run", job, "--budget", "0", "--log-file", log_file, cwd=tmp_path)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    run_log = Path(result.data["run_dir"]) / RUN_LOG
    assert stat.S_IMODE(run_log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    intervals = [line for line in read_log(run_log) if line["event"] == "interval"]
    lines = [line for line in read_log(run_log) if line["event"] != "interval"]
    assert lines == read_log(log_file)  # the same lines, in the same order; intervals in run.log alone
    assert intervals and sum(line["committed"] for line in intervals) == 6
    assert sum(line["pauses_429"] for line in intervals) == 1
    assert events(lines)[:2] == ["start", "preflight_done"]
    assert events(lines)[-2:] == ["stop", "exit"]
    start, preflight = lines[0], lines[1]
    assert start["command"] == "run" and "--log-file" in start["argv"]
    assert preflight["records"] == 6 and preflight["run_id"] == result.data["run_id"]
    assert preflight["limits"]["max_attempts"] == 2 and preflight["transport"]["method"] == "POST"
    pauses = [line for line in lines if line["event"] == "pause_429"]
    assert [pause["seconds"] for pause in pauses] == [1.0]
    assert lines[-2]["state"] == "completed" and lines[-2]["progress"]["done"] == 6
    assert lines[-1]["exit_code"] == 0 and lines[-1]["error_code"] is None
    assert [line["ts"] for line in lines] == sorted(line["ts"] for line in lines)


def test_a_halt_is_logged_with_what_triggered_it(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"match": {"path_contains": "/items/4"}, "status": 401}]}) as target:
        job = write_job(tmp_path, target.url, rows=8, execution={"concurrency": 1})
        result = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert result.exit_code == ExitCode.AUTH_REQUIRED, result.envelope
    lines = read_log(Path(result.data["run_dir"]) / RUN_LOG)
    halts = [line for line in lines if line["event"] == "halt"]
    assert len(halts) == 1
    assert halts[0]["reason"] == "halt_auth" and halts[0]["status_code"] == 401 and halts[0]["row"] == 4
    stop = next(line for line in lines if line["event"] == "stop")
    assert stop["state"] == "stopped" and stop["stop_reason"] == "halt_auth"
    assert lines[-1]["event"] == "exit" and lines[-1]["exit_code"] == ExitCode.AUTH_REQUIRED
    assert lines[-1]["error_code"] == "TARGET_AUTH_FAILED"


def test_a_failure_before_any_run_still_reaches_the_log_file(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    (tmp_path / "data.csv").write_text("id,email,name\n1,a@example.com\n")  # row 1 lacks a field
    log_file = tmp_path / "nightly.log"
    result = run_cli("run", job, "--budget", "0", "--log-file", log_file, cwd=tmp_path)
    assert result.exit_code == ExitCode.ARG_ERROR
    lines = read_log(log_file)
    assert events(lines) == ["start", "exit"]
    assert lines[1]["exit_code"] == ExitCode.ARG_ERROR and lines[1]["error_code"] == "INPUT_INVALID"
    assert not (tmp_path / ".bulkrelay" / "runs").exists() or not any(
        p.is_dir() and not p.name.startswith(".") for p in (tmp_path / ".bulkrelay" / "runs").iterdir()
    )


def test_an_unwritable_log_file_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    log_file = tmp_path / "missing" / "nightly.log"
    result = run_cli("run", tmp_path / "job.yaml", "--budget", "0", "--log-file", log_file, cwd=tmp_path)
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "USAGE_ERROR"
    assert str(log_file) in result.envelope["error"]["message"]


def test_checkpoints_are_logged_every_interval_and_a_stop_request_when_it_comes(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=10))
    run = RunDir.create(tmp_path / "runs", plan_for(run_preflight(job, None)))
    now = [500.0]
    log = RunLog(interval=10.0, clock=lambda: now[0], counters_interval=1e9)
    log.event("start", command="run")
    stats = RelayStats()
    log.run_started(run, run_preflight(job, None), stats)
    for seconds, done in ((4, 2), (7, 4), (10.5, 6), (19, 8), (21, 9)):
        now[0] = 500.0 + seconds
        log.progressed(Snapshot(total=10, done=done, ok=done, failed=0))
    stats.on_pause(2.5, 0.0)
    log.stop_requested(StopReason.TIMEOUT, {})
    log.close()
    lines = read_log(run.path / RUN_LOG)
    assert events(lines) == [
        "start",
        "preflight_done",
        "checkpoint",
        "checkpoint",
        "pause_429",
        "stop_requested",
    ]
    checkpoints = [line for line in lines if line["event"] == "checkpoint"]
    assert [c["done"] for c in checkpoints] == [6, 9]
    assert checkpoints[0]["total"] == 10 and checkpoints[0]["rows_per_second"] > 0
    assert lines[4]["seconds"] == 2.5 and lines[5]["reason"] == "timeout"


def test_interval_lines_count_what_happened_since_the_last_and_the_end_flushes_the_rest(
    tmp_path: Path,
) -> None:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=10))
    run = RunDir.create(tmp_path / "runs", plan_for(run_preflight(job, None)))
    now = [100.0]
    log = RunLog(interval=1e9, clock=lambda: now[0], counters_interval=2.0)
    stats = RelayStats()
    log.run_started(run, run_preflight(job, None), stats)
    pace = Pace(configured_rps=10.0, current_rps=5.0, rate_limited_responses=1)
    log.progressed(Snapshot(total=10, done=3, ok=3, failed=0, pace=pace))  # a resume: 3 rows before it
    for status in (200, 200, 503, 429):
        stats.on_attempt(status, 0.01)
    stats.on_retry()
    stats.on_pause(1.5, 0.0)
    now[0] = 101.0
    log.progressed(Snapshot(total=10, done=4, ok=4, failed=0, pace=pace))  # not yet due
    now[0] = 102.5
    log.progressed(Snapshot(total=10, done=6, ok=5, failed=1, pace=pace))
    stats.on_attempt(200, 0.01)
    now[0] = 103.0
    log.run_finished(run, Result(data=None))  # no progress in it: nothing to flush from
    log.close()
    intervals = [line for line in read_log(run.path / RUN_LOG) if line["event"] == "interval"]
    assert len(intervals) == 1
    first = intervals[0]
    assert first["seconds"] == 2.5 and first["committed"] == 3 and (first["ok"], first["failed"]) == (2, 1)
    assert first["responses"] == {"2xx": 2, "5xx": 1, "4xx": 1}
    assert first["retries"] == 1 and first["pauses_429"] == 1 and first["pause_seconds"] == 1.5
    assert first["configured_rps"] == 10.0 and first["current_rps"] == 5.0 and first["done"] == 6
