"""Adaptive limits: AIMD on 429, quota headers (RateLimit-*, X-RateLimit-*), the Retry-After cap,
and a run against a target whose limit drops mid-run."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.relay.progress import LineReporter, Snapshot
from bulkrelay.relay.ratelimit import AdaptiveRate, Pace
from bulkrelay.relay.retry import quota_exhausted_for
from tests.clirun import cli_env, run_cli
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def test_a_429_burst_halves_the_rate_once_and_quiet_seconds_add_it_back_up_to_the_configured_rate() -> None:
    rate = AdaptiveRate(100.0)
    assert rate.on_rate_limited(10.0, observed_rps=100) and rate.current == 50
    assert not rate.on_rate_limited(10.5, observed_rps=100)  # the same burst: one cut
    assert rate.on_rate_limited(11.2, observed_rps=50) and rate.current == 25
    assert not rate.recover(11.9)  # not quiet for a second yet
    assert rate.recover(13.2) and rate.current == 25 + 5 * 2  # two quiet seconds, 5% of 100 each
    for second in range(14, 40):
        rate.recover(float(second))
    assert rate.current == 100  # never above the configured rate
    assert rate.rate_limited == 3 and rate.cuts == 2


def test_without_a_configured_rate_adaptation_starts_at_the_first_429_and_ends_unlimited() -> None:
    rate = AdaptiveRate(None)
    assert rate.current is None and not rate.recover(5.0)
    assert rate.on_rate_limited(5.0, observed_rps=80) and rate.current == 40 and rate.ceiling == 80
    for second in range(6, 60):
        rate.recover(float(second))
    assert rate.current is None  # recovered to what it sent before: unlimited again


@pytest.mark.parametrize(
    ("headers", "pause"),
    [
        ({"RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "7"}, 7.0),
        ({"RateLimit-Remaining": "3", "RateLimit-Reset": "7"}, None),
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "4"}, 4.0),
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "2000000030"}, 30.0),  # a Unix time
        ({"RateLimit": "limit=10, remaining=0, reset=5"}, 5.0),
        ({"RateLimit": "r=0;t=2"}, 2.0),
        ({"RateLimit-Remaining": "soon", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3"}, 3.0),
        ({"X-RateLimit-Remaining": "1", "RateLimit": "remaining=0, reset=5"}, None),  # the first found wins
        ({"RateLimit": "limit=10"}, None),
        ({}, None),
    ],
)
def test_quota_headers_pause_until_the_reset_when_nothing_remains(
    headers: dict[str, str], pause: float | None
) -> None:
    assert quota_exhausted_for(headers, now=2_000_000_000.0) == pause


def test_a_huge_retry_after_is_capped_by_max_retry_after_seconds(tmp_path: Path) -> None:
    plan = {"rules": [{"status": 429, "retry_after": "86400", "times": 1}]}
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, 3, retry={"max_attempts": 2, "max_retry_after_seconds": 1})
        run = run_cli("run", job, "--budget", "0", cwd=tmp_path, timeout=90)
        assert run.exit_code == ExitCode.SUCCESS, run.envelope  # it waited one second, not a day
        assert target.stats()["by_status"] == {"200": 3, "429": 1}


def test_429s_fall_to_near_zero_after_the_target_lowers_its_limit_mid_run(tmp_path: Path) -> None:
    job_overrides: dict[str, Any] = {
        "execution": {"concurrency": 4, "rate_limit": {"requests_per_second": 80}},
        "retry": {"max_attempts": 50, "initial_backoff_seconds": 0.05, "max_backoff_seconds": 0.5},
    }
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, 500, **job_overrides)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bulkrelay", "run", str(job), "--budget", "0"],
            cwd=tmp_path,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while target.stats()["requests"] < 80:  # the run is well under way at its own pace
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        target.set_plan({"limit_rps": 20})  # the target's limit drops to a quarter
        proc.communicate(timeout=180)
        assert proc.returncode == ExitCode.SUCCESS
        statuses = [r["status"] for r in target.requests()]
    after = statuses[80:]
    half = len(after) // 2
    first, second = after[:half].count(429), after[half:].count(429)
    assert first > 0  # the drop was felt
    print(f"429s after the drop: first half {first}, second half {second} of {len(after)} requests")
    assert second <= max(5, len(after[half:]) // 10), (first, second, len(after))


def test_the_progress_line_shows_a_lowered_limit_and_a_pause() -> None:
    out = io.StringIO()
    reporter = LineReporter(out, interval=0)
    pace = Pace(
        configured_rps=80.0,
        current_rps=40.0,
        rate_limited_responses=3,
        rate_cuts=1,
        pauses=1,
        paused_until="2026-12-01T03:50:12.000000Z",
    )
    reporter.update(Snapshot(total=10, done=0, ok=0, failed=0, pace=pace))
    reporter.update(Snapshot(total=10, done=4, ok=4, failed=0, pace=pace))
    line = out.getvalue().splitlines()[-1]
    assert "4/10 rows" in line
    assert "limit 40/s of 80/s after 3 429s, paused until 2026-12-01T03:50:12.000000Z" in line
    unhurried = dataclasses.replace(pace, rate_cuts=0, paused_until=None)
    reporter.update(Snapshot(total=10, done=5, ok=5, failed=0, pace=unhurried))
    assert out.getvalue().splitlines()[-1].endswith("rows/s")  # nothing to say: nothing added
