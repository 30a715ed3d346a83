"""`halt.failure_rate` (issue 28 item 6): a call whose rows fail too often stops, resumable, exit 3.

Counted in row order, like the consecutive-failures streak, so the halt falls at the same row and
with the same counts whatever order the answers arrive in.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bulkrelay.errors import ConfigInvalid, ExitCode
from bulkrelay.job.config import FailureRateHalt, load_job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.relay.failurerate import FailureRate
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry, read_journal
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess


def _entry(row: int, failed: bool) -> JournalEntry:
    return JournalEntry(
        row_number=row,
        success=not failed,
        classification="http_client_error" if failed else "success",
        status_code=422 if failed else 200,
        attempts=1,
        retryable=False,
        error="HTTP 422" if failed else None,
        duration_ms=1.0,
    )


def _completion_orders(rows: int, window: int, count: int) -> list[list[int]]:
    """`count` orders in which rows 1..rows may complete with `window` of them in flight."""
    rng = random.Random(28)
    return [sorted(range(1, rows + 1), key=lambda row: row + rng.uniform(0, window)) for _ in range(count)]


@pytest.mark.anyio
async def test_the_halt_falls_on_the_same_row_whatever_the_completion_order() -> None:
    # Rows 1-30 succeed, then every row fails: 31..40 make 10 of 40 (25%) failed, not above 25%;
    # row 41 makes 11 of 41, above it. Judged in arrival order, late successes would move that row.
    failed = {row: row > 30 for row in range(1, 81)}
    halts = set()
    for order in _completion_orders(80, window=8, count=200):
        stop = StopControl()
        rate = FailureRate(FailureRateHalt(above=0.25, after_rows=20), stop)
        for row in range(1, 81):
            rate.taken(row)
        for row in order:
            rate.ended(_entry(row, failed[row]))
        assert stop.reason is StopReason.HALT_FAILURE_RATE, order
        halts.add((stop.detail["row"], stop.detail["rows"], stop.detail["failed"]))
    assert halts == {(41, 41, 11)}


@pytest.mark.anyio
async def test_nothing_is_judged_before_after_rows_and_the_commonest_error_is_named() -> None:
    stop = StopControl()
    rate = FailureRate(FailureRateHalt(above=0.5, after_rows=10), stop)
    for row in range(1, 11):
        rate.taken(row)
    for row in range(1, 10):  # nine of nine failed: far above 50%, but fewer than after_rows
        rate.ended(_entry(row, failed=True))
    assert stop.reason is None
    rate.ended(_entry(10, failed=False))
    assert stop.reason is StopReason.HALT_FAILURE_RATE
    assert stop.detail["commonest_error"] == {
        "classification": "http_client_error",
        "status_code": 422,
        "error": "HTTP 422",
        "rows": 9,
    }
    assert (stop.detail["rows"], stop.detail["failed"], stop.detail["failure_rate"]) == (10, 9, 0.9)


@pytest.mark.anyio
async def test_a_share_at_the_limit_does_not_halt() -> None:
    stop = StopControl()
    rate = FailureRate(FailureRateHalt(above=0.5, after_rows=2), stop)
    for row in range(1, 5):
        rate.taken(row)
        rate.ended(_entry(row, failed=row % 2 == 0))  # exactly half: not more than half
    assert stop.reason is None


def test_the_rule_is_checked_and_leaves_other_jobs_fingerprints_alone(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    before = config_fingerprint(load_job(job).config)
    with_rate = write_job(tmp_path, "http://127.0.0.1:9", rows=3, halt={"failure_rate": {"above": 0.2}})
    config = load_job(with_rate).config
    assert config.halt.failure_rate == FailureRateHalt(above=0.2, after_rows=100)
    assert config_fingerprint(config) != before  # the rule is part of the job's meaning
    write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    assert config_fingerprint(load_job(job).config) == before  # absent, it changes nothing
    for bad in ({"above": 1}, {"above": -0.1}, {"above": 0.2, "after_rows": 0}, {"after_rows": 5}):
        broken = write_job(tmp_path, "http://127.0.0.1:9", rows=3, halt={"failure_rate": bad})
        with pytest.raises(ConfigInvalid):
            load_job(broken)


@pytest.mark.slow
def test_a_run_whose_rows_all_fail_stops_after_after_rows_and_resumes(tmp_path: Path) -> None:
    # Before: 50 of 50 rows answered 422 and every row was still sent.
    with TargetProcess({"status": 422}) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=200,
            execution={"concurrency": 4},
            halt={"failure_rate": {"above": 0.2, "after_rows": 50}},
        )
        halted = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        sent = target.stats()["requests"]
        assert halted.exit_code == ExitCode.PARTIAL_FAILURE, halted.envelope
        error = halted.envelope["error"]
        assert error["code"] == "FAILURE_RATE_EXCEEDED"
        context = error["context"]
        assert (context["row"], context["rows"], context["failed"]) == (50, 50, 50)
        assert context["commonest_error"]["status_code"] == 422
        assert "50 of 50 rows failed" in error["message"] and "HTTP 422" in error["message"]
        assert halted.data["state"] == "stopped"
        assert error["suggestion"].endswith(halted.data["continue_command"])
        # The 50 judged, and the rows the other workers took meanwhile: while a row at or before the
        # 50th is still out (a busy machine can hold one for long), results after it wait their turn
        # and the others go on taking rows, so how many is timing's; never all of them.
        assert 50 <= sent < 200
        journal = Path(halted.data["run_dir"]) / "results.jsonl"
        journaled = [entry.row_number for entry in read_journal(journal)]
        assert len(journaled) == sent  # the rows in flight finished and were committed

        target.set_plan({})  # the cause is fixed: the resume sends only the rows without a result
        target.reset()
        resumed = run_cli("resume", halted.data["run_dir"], "--budget", "0", cwd=tmp_path)
        assert resumed.exit_code == ExitCode.PARTIAL_FAILURE, resumed.envelope  # the 422s stay failed
        assert resumed.envelope["error"]["code"] == "PARTIAL_FAILURE"
        assert target.stats()["requests"] == 200 - sent
