"""`summary.json` is rebuilt from the journal: its counts are the journal's, its percentiles bucketed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.store.journal import JournalEntry, encode_line
from bulkrelay.store.summary import LatencyHistogram, RequestCounts, RunSummary, summarize


def _entry(seq: int, status: int | None, classification: str, attempts: int, ms: float) -> bytes:
    success = classification == "success"
    entry = JournalEntry(
        row_number=seq,
        success=success,
        classification=classification,
        status_code=status,
        attempts=attempts,
        retryable=not success,
        error=None if success else "x",
        duration_ms=ms,
    )
    return encode_line(seq, entry)


def test_counts_by_outcome_status_and_classification(tmp_path: Path) -> None:
    journal = tmp_path / "results.jsonl"
    rows = [
        (200, "success", 1, 10.0),
        (200, "success", 3, 30.0),
        (422, "http_client_error", 1, 5.0),
        (None, "timeout_error", 2, 900.0),
        (503, "http_server_error", 3, 20.0),
    ]
    journal.write_bytes(b"".join(_entry(i, *row) for i, row in enumerate(rows, start=1)))
    summary = summarize(journal, total_rows=8).to_json()
    assert (summary["rows_total"], summary["rows_done"], summary["rows_pending"]) == (8, 5, 3)
    assert summary["by_outcome"] == {"succeeded": 2, "failed": 3}
    assert summary["by_status"] == {"200": 2, "422": 1, "503": 1, "none": 1}
    assert summary["by_classification"] == {
        "http_client_error": 1,
        "http_server_error": 1,
        "success": 2,
        "timeout_error": 1,
    }
    assert (summary["attempts"], summary["retries"]) == (10, 5)
    assert summary["latency_ms"] == {"p50": 20.0, "p95": 900.0, "p99": 900.0, "max": 900.0}


def test_a_torn_tail_is_not_counted(tmp_path: Path) -> None:
    """After a failed fsync the summary is written over a journal whose last batch may be cut short."""
    journal = tmp_path / "results.jsonl"
    journal.write_bytes(_entry(1, 200, "success", 1, 1.0) + _entry(2, 200, "success", 1, 1.0)[:40])
    summary = summarize(journal, total_rows=2).to_json()
    assert summary["rows_done"] == 1 and summary["by_outcome"] == {"succeeded": 1, "failed": 0}


def test_a_missing_journal_is_an_empty_summary(tmp_path: Path) -> None:
    summary = summarize(tmp_path / "results.jsonl", total_rows=4).to_json()
    assert summary["rows_pending"] == 4 and summary["attempts"] == 0
    assert summary["latency_ms"] == {"p50": None, "p95": None, "p99": None, "max": None}


def test_histogram_percentiles_on_a_uniform_spread() -> None:
    histogram = LatencyHistogram()
    for ms in range(1, 1001):
        histogram.add(float(ms))
    assert histogram.percentiles((0.5, 0.95, 0.99)) == {"p50": 500.0, "p95": 950.0, "p99": 990.0}
    assert histogram.maximum() == 1000.0
    assert histogram.count == 1000


def test_histogram_buckets_to_a_tenth_of_a_millisecond() -> None:
    histogram = LatencyHistogram()
    histogram.add(1.234)
    histogram.add(1.239)
    assert histogram.percentiles((0.5,)) == {"p50": pytest.approx(1.2)}


def test_the_requests_of_a_runs_calls_add_up_and_read_back() -> None:
    first = RequestCounts(5, {"200": 3, "413": 1, "none": 1}, retries=1, splits=1)
    second = RequestCounts(2, {"200": 2}, retries=0, splits=0)
    total = first.plus(second)
    assert total == RequestCounts(7, {"200": 5, "413": 1, "none": 1}, retries=1, splits=1)
    summary = RunSummary(10, 10, 10, 0, {"200": 10}, {"success": 10}, 12, {"p50": 1.0}, requests=total)
    assert RunSummary.from_json(summary.to_json()) == summary
    earlier = summary.to_json()
    del earlier["requests"]  # a summary of an earlier version
    assert RunSummary.from_json(earlier).requests is None
    assert RequestCounts.from_json({"sent": "x"}) is None


def test_rows_never_sent_count_no_retry(tmp_path: Path) -> None:
    journal = tmp_path / "results.jsonl"
    rows = [(None, "lookup_miss", 0, 0.0)] * 6 + [(200, "success", 1, 10.0), (200, "success", 3, 12.0)]
    journal.write_bytes(b"".join(_entry(i, *row) for i, row in enumerate(rows, start=1)))
    summary = summarize(journal, total_rows=8)
    assert (summary.attempts, summary.retries) == (4, 2)
    assert (summary.to_json()["attempts"], summary.to_json()["retries"]) == (4, 2)
    assert RunSummary.from_json(summary.to_json()).retries == 2
