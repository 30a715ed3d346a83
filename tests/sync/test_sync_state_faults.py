"""A delta job's sync state held by another process, or damaged: named errors, never a traceback, and
a run that delivered everything ends `completed` whatever became of the state (issue 22.8).

The target is a key-value store that keeps idempotency keys (tests/sync/nights.py's KEEPS_KEYS): once
the state is usable again, the target holds exactly the input and `sync-state verify` agrees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.sync.state import job_identity, state_path
from tests.clirun import cli_env, run_cli
from tests.gatedruns import GATE, GATED_JOB
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runsteps import sent_ids
from tests.sync.nights import KEEPS_KEYS, holding, verified
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.target_plan(KEEPS_KEYS)]

ROWS = 20
DELTA: dict[str, Any] = {
    "input": {"key": "id"},
    "request": {"method": "PUT", "idempotency_key": {"header": "Idempotency-Key"}},
    "execution": {"concurrency": 2, "sync": "delta"},
    **GATED_JOB,
}


def _state_file(cwd: Path) -> Path:
    return state_path(cwd / ".bulkrelay" / "runs", job_identity("test-job", cwd / "job.yaml"))


class _StateHolder:
    """Another process holding the sync state's write lock (an `sqlite3` shell in a transaction)."""

    def __init__(self, path: Path) -> None:
        code = (
            "import sqlite3, sys\n"
            f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE')\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(60)
        self.proc.stdout.close()


def _night(cwd: Path) -> Any:
    return run_cli("run", cwd / "job.yaml", "--budget", "0", cwd=cwd)


def test_a_state_held_by_another_process_is_sync_state_busy_exit_6(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Before: exit 1, GENERAL_ERROR with a traceback of sqlite3's `database is locked`."""
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    assert _night(tmp_path).exit_code == ExitCode.SUCCESS
    second = make_rows(ROWS, tag="-v2")
    write_csv(tmp_path / "data.csv", second)
    target.reset()
    holder = _StateHolder(_state_file(tmp_path))
    try:
        busy = _night(tmp_path)
    finally:
        holder.release()
    assert busy.exit_code == ExitCode.CONFLICT, busy.envelope
    assert busy.error_code == "SYNC_STATE_BUSY"
    assert busy.envelope["error"]["context"]["state"] == str(_state_file(tmp_path))
    assert "detail" not in busy.envelope["error"] and "Traceback" not in busy.stderr
    assert target.requests() == []
    again = _night(tmp_path)  # the holder is gone: the night goes ahead
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert len(sent_ids(target)) == ROWS
    assert target.store() == holding(second)
    verified(tmp_path, job)


def test_a_damaged_state_is_sync_state_corrupt_exit_4_and_rebuild_repairs_it(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Before: exit 1, GENERAL_ERROR with a traceback of `file is not a database`."""
    rows = make_rows(ROWS)
    job = write_job(tmp_path, target.url, rows=rows, **DELTA)
    assert _night(tmp_path).exit_code == ExitCode.SUCCESS
    state = _state_file(tmp_path)
    with state.open("r+b") as damaged:
        damaged.write(b"not a database, not any more")
    target.reset()
    for answer in (_night(tmp_path), run_cli("sync-state", "verify", job, cwd=tmp_path)):
        assert answer.exit_code == ExitCode.PRECONDITION, answer.envelope
        assert answer.error_code == "SYNC_STATE_CORRUPT"
        assert "sync-state rebuild" in answer.envelope["error"]["suggestion"]
        assert "detail" not in answer.envelope["error"] and "Traceback" not in answer.stderr
    assert target.requests() == []
    rebuilt = run_cli("sync-state", "rebuild", job, cwd=tmp_path)
    assert rebuilt.exit_code == ExitCode.SUCCESS, rebuilt.envelope
    assert rebuilt.data["keys"] == ROWS
    night = _night(tmp_path)
    assert night.exit_code == ExitCode.SUCCESS, night.envelope
    assert target.requests() == []  # the journals remembered every delivery
    assert target.store() == holding(rows)
    verified(tmp_path, job)


def test_a_run_that_delivered_everything_ends_completed_though_the_state_is_busy_at_its_end(
    tmp_path: Path,
) -> None:
    """Before: the state's `database is locked` at the end left a fully delivered run `running`, with
    no summary, exit 1. Now it ends `completed` with a SYNC_STATE_BEHIND warning, and the next night
    catches the state up from its journal: it sends nothing again."""
    with TargetProcess({**KEEPS_KEYS, **GATE}) as target:
        rows = make_rows(ROWS)
        job = write_job(tmp_path, target.url, rows=rows, **DELTA)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bulkrelay", "run", str(tmp_path / "job.yaml"), "--budget", "0"],
            cwd=tmp_path,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            wait_for(lambda: target.stats()["requests"] >= 2, "the run's first requests (held at the gate)")
            holder = _StateHolder(_state_file(tmp_path))  # preflight is over: the relay is sending
            try:
                target.set_plan(KEEPS_KEYS)  # the gate opens
                stdout, stderr = proc.communicate(timeout=300)
            finally:
                holder.release()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert b"Traceback" not in stderr, stderr.decode()
        envelope = orjson.loads(stdout)
        assert proc.returncode == ExitCode.SUCCESS, envelope
        run_dir = Path(envelope["data"]["run_dir"])
        assert envelope["data"]["state"] == "completed"
        assert orjson.loads((run_dir / "run.json").read_bytes())["state"] == "completed"
        assert (run_dir / "summary.json").is_file()
        behind = [w for w in envelope["warnings"] if w["code"] == "SYNC_STATE_BEHIND"]
        assert [w["context"]["reason"] for w in behind] == ["SYNC_STATE_BUSY"], envelope["warnings"]

        target.reset()
        night = _night(tmp_path)
        assert night.exit_code == ExitCode.SUCCESS, night.envelope
        assert target.requests() == []  # caught up from the first night's journal
        assert night.data["summary"]["skipped_unchanged"] == ROWS
        assert target.store() == holding(rows)
    verified(tmp_path, job)
