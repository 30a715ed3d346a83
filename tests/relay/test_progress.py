"""The progress reporters: what the periodic line says."""

from __future__ import annotations

import io
import itertools

import pytest

from bulkrelay.relay import progress
from bulkrelay.relay.progress import JobCounts, LineReporter, Snapshot


def test_the_line_rate_counts_only_rows_of_this_call(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(start=100.0, step=2.0)  # each reading of the clock is 2 s after the last
    monkeypatch.setattr(progress, "_clock", lambda: next(clock))
    out = io.StringIO()
    reporter = LineReporter(out, interval=0)
    reporter.update(Snapshot(total=1000, done=900, ok=900, failed=0))  # a resume: 900 done before
    reporter.update(Snapshot(total=1000, done=920, ok=920, failed=0))  # 20 rows in 2 s of this call
    assert out.getvalue().splitlines()[-1] == "bulkrelay: 920/1000 rows, 920 ok, 0 failed, 10 rows/s"


def test_a_bulk_runs_line_counts_its_jobs() -> None:
    out = io.StringIO()
    jobs = JobCounts(created=3, processing=1, done=2)
    LineReporter(out, interval=0).update(Snapshot(total=10, done=8, ok=7, failed=1, jobs=jobs))
    assert out.getvalue().split(" rows/s")[1] == ", 2 of 3 jobs done, 1 processing\n"
