"""The engine under a misbehaving target: rate limits, 429 storms, timeouts, resets, halts, signals, the lock.

Every test runs the real CLI against the target in its own process and checks both sides: what the
journal recorded and what the target saw.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.relay.ratelimit import most_in_window
from tests.clirun import run_cli
from tests.spawnedruns import finish as _finish
from tests.spawnedruns import journal_has_lines as _journal_has_lines
from tests.spawnedruns import run_dir_of as _run_dir
from tests.spawnedruns import start_run as _start_run
from tests.taggedjobs import journal, run_job, tag_rule, target_ids, write_job
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

# --------------------------------------------------------------------------------- pacing


def test_rate_limit_seen_from_the_target(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=130,
            execution={"concurrency": 8, "rate_limit": {"requests_per_second": 50}},
        )
        result = run_job(job)
        stats = target.stats()
        times = [r["t"] for r in target.requests()]
    assert result.exit_code == ExitCode.SUCCESS
    assert stats["requests"] == 130
    # The limiter spaces any 51 starts over 1.01 s or more; the target stamps arrivals after the trip
    # through both processes' event loops, which a busy machine delays by tens of milliseconds, so its
    # windows are read a little short rather than the limit a little high.
    assert most_in_window(times, 0.9) <= 50
    achieved = (len(times) - 1) / (times[-1] - times[0])
    assert achieved <= 52, achieved


def test_429_storm_pauses_every_start_and_ends_with_every_row_ok(tmp_path: Path) -> None:
    # From the 11th request on, 8 requests get 429 "retry after 1 s".
    plan = {"rules": [{"after": 10, "times": 8, "status": 429, "retry_after": "1"}]}
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, rows=40, retry={"max_attempts": 5})
        result = run_job(job)
        sent = target.requests()
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    entries = journal(result.data["run_dir"])
    assert len(entries) == 40 and all(e["success"] for e in entries)
    assert sum(e["attempts"] for e in entries) == 48
    limited = [r["t"] for r in sent if r["status"] == 429]
    assert len(limited) == 8
    # Requests already on the wire may land just after a 429; after that, nobody starts for ~1 s.
    for t in limited:
        starts_during_pause = [r["t"] for r in sent if t + 0.1 < r["t"] < t + 0.9]
        assert starts_during_pause == [], (t, starts_during_pause)
    assert sent[-1]["t"] - limited[0] >= 0.95


# --------------------------------------------------------------------------------- transport errors


def test_read_timeouts_and_resets_are_retried_then_recorded(tmp_path: Path) -> None:
    plan = {"rules": [tag_rule("slow", delay_ms=1500), tag_rule("reset", reset=True)]}
    with TargetProcess(plan) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=10,
            tags={2: "slow", 6: "reset", 9: "reset"},
            execution={"timeout": {"read_seconds": 0.3}},
            retry={"max_attempts": 2},
        )
        result = run_job(job)
        stats = target.stats()
    assert result.exit_code == ExitCode.PARTIAL_FAILURE
    assert stats["requests"] == 7 + 2 * 3 and stats["resets"] == 4
    by_row = {e["row_number"]: e for e in journal(result.data["run_dir"])}
    assert len(by_row) == 10
    slow, resets = by_row[2], [by_row[6], by_row[9]]
    assert (slow["classification"], slow["status_code"], slow["attempts"]) == ("timeout_error", None, 2)
    assert slow["retryable"] is True and "imeout" in slow["error"]
    for entry in resets:
        assert (entry["classification"], entry["status_code"], entry["attempts"]) == (
            "protocol_error",
            None,
            2,
        )
        assert entry["retryable"] is True and entry["error"]
    assert result.data["summary"]["by_classification"] == {
        "protocol_error": 2,
        "success": 7,
        "timeout_error": 1,
    }


# --------------------------------------------------------------------------------- halt rules


def test_auth_failure_halts_resumably_without_journaling_the_row(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"after": 10, "status": 401}]}) as target:
        job = write_job(tmp_path, target.url, rows=50, execution={"concurrency": 2})
        halted = run_job(job)
        assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
        assert halted.error_code == "TARGET_AUTH_FAILED"
        assert halted.data["state"] == "stopped"
        assert halted.data["continue_command"] == f"bulkrelay resume {halted.data['run_dir']}"
        entries = journal(halted.data["run_dir"])
        assert len(entries) == 10 and all(e["status_code"] == 200 for e in entries)
        assert target.stats()["by_status"]["401"] >= 1

        target.set_plan({})  # credentials fixed: the resume sends only what was not recorded
        target.reset()
        resumed = run_cli("resume", halted.data["run_dir"], "--budget", "0", cwd=tmp_path)
        resent = sorted(target_ids(target))
    assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
    assert resent == sorted(set(range(1, 51)) - {e["row_number"] for e in entries})
    assert sorted(e["row_number"] for e in journal(halted.data["run_dir"])) == list(range(1, 51))


def test_consecutive_server_errors_halt_without_journaling_the_streak(tmp_path: Path) -> None:
    # Rows 1-10 succeed and rows 11-60 answer 503, whatever order they arrive in; rows 9 and 10 answer
    # late, so 503s of the streak complete before them. The streak is counted in row order, so their
    # success does not end it: the run halts and none of its 503s is journaled as final.
    tags = {9: "late", 10: "late"} | {n: "down" for n in range(11, 61)}
    plan = {"rules": [tag_rule("late", delay_ms=600), tag_rule("down", status=503, delay_ms=100)]}
    with TargetProcess(plan) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=60,
            tags=tags,
            execution={"concurrency": 4},
            halt={"consecutive_failures": 20},
        )
        result = run_job(job)
        stats = target.stats()
    assert result.exit_code == ExitCode.UNAVAILABLE, result.envelope
    assert result.error_code == "TARGET_UNAVAILABLE"
    error = result.envelope["error"]
    assert error["message"].endswith(
        "the target looks down (20 failures in a row, the last: HTTP 503); halted"
    )
    assert error["detail"] == error["context"]["message"] == "HTTP 503"
    assert result.data["state"] == "stopped" and "continue_command" in result.data
    assert 20 <= stats["by_status"]["503"] <= 23  # the streak, plus what was in flight
    entries = journal(result.data["run_dir"])
    assert sorted(e["row_number"] for e in entries) == list(range(1, 11))
    assert all(e["success"] for e in entries)


def test_a_target_nobody_listens_on_halts_saying_the_connection_was_refused(tmp_path: Path) -> None:
    # A refused connection, an untrusted certificate and a 503 call for different fixes: the halt
    # quotes the last failure (never the URL) rather than only "the target looks down".
    # The port stays bound, never listened on, while the run tries it: refused every time, and no
    # other test's server can be given it meanwhile.
    with socket.socket() as reserved:
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
        job = write_job(
            tmp_path,
            f"http://127.0.0.1:{port}",
            rows=10,
            retry={"max_attempts": 1},
            halt={"consecutive_failures": 3},
        )
        result = run_job(job)
    assert result.exit_code == ExitCode.UNAVAILABLE, result.envelope
    error = result.envelope["error"]
    assert error["code"] == "TARGET_UNAVAILABLE"
    assert (
        f"the last: ConnectFailed: cannot connect to 127.0.0.1:{port}: Connection refused" in error["message"]
    )
    assert "Connection refused" in error["detail"] and "/v1/items" not in error["message"]
    assert journal(result.data["run_dir"]) == []  # the rows stay pending for a resume


def test_a_broken_streak_records_its_failures(tmp_path: Path) -> None:
    # Every third row fails with 503: never 5 in a row, so nothing halts and every failure is kept.
    tags = {n: "down" for n in range(3, 31, 3)}
    with TargetProcess({"rules": [tag_rule("down", status=503)]}) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=30,
            tags=tags,
            execution={"concurrency": 1},
            halt={"consecutive_failures": 2},
        )
        result = run_job(job)
    assert result.exit_code == ExitCode.PARTIAL_FAILURE, result.envelope
    failed = sorted(e["row_number"] for e in journal(result.data["run_dir"]) if not e["success"])
    assert failed == sorted(tags)


# --------------------------------------------------------------------------------- signals and the lock


def test_sigint_stops_at_a_safe_point_with_journal_equal_to_what_the_target_took(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"delay_ms": 200}]}) as target:
        job = write_job(tmp_path, target.url, rows=200)
        proc = _start_run(job)
        wait_for(lambda: _journal_has_lines(job), "the first committed rows", interval=0.02)
        proc.send_signal(signal.SIGINT)
        result = _finish(proc)
        taken = target_ids(target)
    assert result.exit_code == ExitCode.SIGINT, result.envelope
    assert result.error_code == "INTERRUPTED"
    run_dir = _run_dir(job)
    assert result.data["state"] == "stopped"
    assert result.data["continue_command"] == f"bulkrelay resume {run_dir}"
    assert orjson.loads((run_dir / "run.json").read_bytes())["state"] == "stopped"
    journaled = sorted(e["row_number"] for e in journal(run_dir))
    # In-flight rows were allowed to finish, so every request the target answered is recorded once.
    assert sorted(taken) == journaled
    assert 0 < len(journaled) < 200
    assert result.data["progress"]["done"] == len(journaled)
    checkpoint = orjson.loads((run_dir / "checkpoint.json").read_bytes())
    assert checkpoint["rows_done"] == len(journaled)


def test_second_sigint_forces_and_leaves_in_flight_rows_pending(tmp_path: Path) -> None:
    with TargetProcess({"rules": [tag_rule("slow", delay_ms=3000)]}) as target:
        tags = {n: "slow" for n in range(5, 41)}
        job = write_job(tmp_path, target.url, rows=40, tags=tags, execution={"concurrency": 4})
        proc = _start_run(job)
        wait_for(lambda: target.stats()["requests"] >= 8, "four slow rows in flight", interval=0.02)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        result = _finish(proc)
        elapsed = time.monotonic() - started
    assert result.exit_code == ExitCode.SIGINT, result.envelope
    assert result.data["state"] == "forced"
    message = result.envelope["error"]["message"]
    assert "safe point" not in message  # the words match the state
    assert "in flight were cancelled" in message and "forced" in message
    assert elapsed < 2  # did not wait for the 3 s responses
    run_dir = _run_dir(job)
    assert sorted(e["row_number"] for e in journal(run_dir)) == [1, 2, 3, 4]
    assert "continue_command" in result.data


def test_a_second_process_on_a_held_run_gets_run_locked(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"delay_ms": 300}]}) as target:
        # 400 rows at two a 300 ms answer: a minute of run, far longer than the two commands beside it
        # take on a busy machine; the SIGINT ends it.
        job = write_job(tmp_path, target.url, rows=400, execution={"concurrency": 2})
        proc = _start_run(job)
        try:
            wait_for(lambda: _journal_has_lines(job), "the run to be under way", interval=0.02)
            run_dir = _run_dir(job)
            second = run_cli("resume", run_dir, "--budget", "0", cwd=tmp_path)
            live = run_cli("status", run_dir)
        finally:
            proc.send_signal(signal.SIGINT)
            first = _finish(proc)
    assert second.exit_code == ExitCode.CONFLICT
    assert second.error_code == "RUN_LOCKED"
    assert live.data["live"] is True and live.data["state"] == "running"
    assert first.exit_code == ExitCode.SIGINT
