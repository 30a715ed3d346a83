"""`job cancel` while a background job still reads its input: a query's snapshot of an endless answer.

Before, the worker looked for a cancel only once it relayed, so a snapshot (and the preflight after it)
ran to its end first: minutes for a query of millions of rows. Now it ends the job where it reads,
with nothing sent and no snapshot or run left behind. Real processes; the query never ends by itself,
so only the cancel can end the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
from pathlib import Path

import pytest
import yaml

from bulkrelay.errors import ExitCode
from tests.background.jobcli import cli, worker_pid
from tests.waiting import HANG_BUDGET, wait_for

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

# About a billion rows, counted out by SQLite itself: hours to read, so the job is still reading it
# whatever the machine's load when the cancel comes.
ENDLESS = (
    "WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n LIMIT 1000000000) "
    "SELECT id, 'user' || id || '@example.com' AS email FROM n"
)


def _query_job(tmp_path: Path) -> Path:
    database = tmp_path / "app.db"
    sqlite3.connect(database).close()
    job = {
        "version": 1,
        "input": {"query": ENDLESS, "database": f"sqlite:///{database}", "key": "id"},
        "request": {
            "method": "PUT",
            "url": "http://127.0.0.1:9/customers/{id}",
            "json": {"email": {"from": "email"}},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _kill_if_still_the_worker(pid: int, job_id: str) -> None:
    with contextlib.suppress(OSError):  # gone already (its pid is then no one's, or another's)
        if job_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)


def _rows_read(tmp_path: Path, job_id: str) -> int:
    status = cli(tmp_path, "job", "status", job_id)
    return int(status.data.get("rows_read") or 0)


def test_cancel_ends_a_job_while_it_takes_its_snapshot_with_nothing_sent_or_left(tmp_path: Path) -> None:
    started = cli(tmp_path, "run", _query_job(tmp_path), "--budget", "300ms")
    assert started.exit_code == ExitCode.INCOMPLETE, started.envelope
    job_id = started.data["job_id"]
    worker = worker_pid(tmp_path, job_id)
    try:
        wait_for(lambda: _rows_read(tmp_path, job_id) > 0, "the snapshot to be under way")
        cancel = cli(tmp_path, "job", "cancel", job_id, "--budget", HANG_BUDGET)
        ended = cli(tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET)
    finally:  # a worker the cancel did not end would read for hours
        _kill_if_still_the_worker(worker, job_id)
    # the cancel ended it, though no run was made: `cancelled`, not `ended` (ended on its own)
    assert cancel.exit_code == ExitCode.SUCCESS, cancel.envelope
    answer = (cancel.data["state"], cancel.data["run_state"], cancel.data["run_dir"])
    assert answer == ("cancelled", None, None)
    assert ended.exit_code == ExitCode.SIGTERM, ended.envelope
    assert ended.error_code == "CANCELLED"
    assert "while reading the input: nothing was sent" in ended.envelope["error"]["message"]
    assert cli(tmp_path, "job", "status", job_id).error_code == "CANCELLED"  # the job's answer, kept
    runs = tmp_path / ".bulkrelay" / "runs"
    assert not [path for path in runs.glob("*") if path.is_dir() and not path.name.startswith(".")]
    assert not list(runs.glob(".spool/*"))  # the snapshot begun is removed
