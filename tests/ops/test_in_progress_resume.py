"""A run killed while the target was still answering some of its rows, resumed at once: the target that
keeps idempotency keys answers those rows' keys 409 ("in progress") to the resumed call's first send.
That is the killed call's send still under way, not the rows' result: waited out, never a failed row."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bulkrelay.store.checkpoint import read_checkpoint
from tests.jobfiles import write_job
from tests.spawnedruns import finish, run_dir_of, start_run
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

ROWS = 12
HELD_MS = 600_000  # the held rows are answered when the test releases them, never on a timer
HELD = ("/items/3", "/items/12")  # row 3 ends below the journal's highest row, row 12 above it


def test_rows_in_flight_at_a_kill_are_waited_out_when_resumed_not_failed(tmp_path: Path) -> None:
    held = [{"match": {"method": "POST", "path_contains": path}, "delay_ms": HELD_MS} for path in HELD]
    with TargetProcess({"dedup": True, "in_progress_status": 409, "rules": held}) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=ROWS,
            input={"key": "id"},
            request={"idempotency_key": {"header": "Idempotency-Key"}},
            retry={"initial_backoff_seconds": 0.5, "max_backoff_seconds": 5, "jitter_ratio": 0},
            execution={"concurrency": 4},
        )
        killed = start_run(job)
        run_dir = wait_for(lambda: _run_dir(job), "the run's directory")
        wait_for(lambda: _rows_done(run_dir) == ROWS - len(HELD), "every row but the held ones journaled")
        killed.send_signal(signal.SIGKILL)
        killed.communicate()  # reaped, its pipes closed

        resuming = start_run(job)  # the identical re-run continues the run
        # It meets the held keys in progress; then the killed call's sends are answered, and its waits end.
        wait_for(lambda: target.stats()["by_status"].get("409", 0) >= len(HELD), "409s to the held keys")
        target.release()
        resumed = finish(resuming)
        stats = target.stats()

    assert resumed.exit_code == 0, resumed.stderr
    progress = resumed.envelope["data"]["progress"]
    assert (progress["done"], progress["ok"]) == (ROWS, ROWS), progress  # none failed
    assert stats["by_status"].get("409", 0) >= len(HELD), stats  # the resumed call met the keys in progress
    assert stats["effects"] == ROWS, stats  # each row applied once


def _run_dir(job: Path) -> Path | None:
    try:
        return run_dir_of(job)
    except AssertionError:
        return None


def _rows_done(run_dir: Path) -> int:
    checkpoint = read_checkpoint(run_dir)
    return checkpoint.rows_done if checkpoint is not None else 0
