"""RelayStats, the per-request counters the sender feeds (the metrics file is tested in tests/ops)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bulkrelay.relay.metrics import LATENCY_BUCKETS, RelayStats, status_class

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def test_a_latency_counts_in_the_first_bucket_whose_upper_bound_it_does_not_exceed() -> None:
    stats = RelayStats()
    for latency in (0.0, 0.005, 0.0051, 0.01, 60.0, 60.5, 1e9):
        stats.on_attempt(200, latency)
    buckets = dict(stats.cumulative_buckets())
    assert buckets["0.005"] == 2  # 0.0 and exactly 0.005: bounds are inclusive ("le")
    assert buckets["0.01"] == 4
    assert buckets[str(LATENCY_BUCKETS[-1])] == 5  # 60.0
    assert buckets["+Inf"] == 7
    assert stats.latency_sum == sum((0.0, 0.005, 0.0051, 0.01, 60.0, 60.5, 1e9))


def test_requests_are_counted_by_status_class() -> None:
    stats = RelayStats()
    for status in (200, 201, 299, 404, 429, 503, None, 101, 999):
        stats.on_attempt(status, 0.001)
    assert stats.requests == {"2xx": 3, "4xx": 2, "5xx": 1, "error": 1, "1xx": 1, "9xx": 1}
    assert [status_class(s) for s in (100, 302, 599, 1000)] == ["1xx", "3xx", "5xx", "10xx"]


def test_pauses_that_overlap_count_once_with_the_seconds_they_held_starts() -> None:
    stats = RelayStats()
    seen: list[float] = []
    stats.on_pauses(seen.append)
    for i in range(8):  # the rows in flight answered 429 with Retry-After: 2 together
        stats.on_pause(2.0, 100.0 + i / 1000)
    assert stats.pauses == 1 and stats.pause_seconds == pytest.approx(2.007)
    stats.on_pause(1.0, 101.0)  # inside the pause in force: holds nothing more
    assert stats.pauses == 1 and stats.pause_seconds == pytest.approx(2.007)
    stats.on_pause(2.0, 110.0)
    assert stats.pauses == 2 and stats.pause_seconds == pytest.approx(4.007)
    assert seen == [2.0] * 8 + [1.0, 2.0]  # the run log still has each 429's line


def test_a_run_without_a_metrics_file_does_not_load_prometheus_client() -> None:
    """Its import is about a tenth of a second of every process; only MetricsFile needs it."""
    code = (
        "import sys, bulkrelay.cli.commands, bulkrelay.ops.launch; print('prometheus_client' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
