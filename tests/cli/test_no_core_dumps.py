"""A BulkRelay process holds secrets (the client secret, a live token, rows in flight): it writes no core
file, whatever crashes it. Read from /proc of real processes while they relay: the CLI's own, and the
detached worker of a background job (which runs the CLI's program too), and a delta run's line scan."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirun import cli_env, run_cli, start_cli
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.target_plan({"rules": [{"delay_ms": 200}]})]


def _core_limit(pid: int) -> tuple[str, str]:
    """The soft and hard limits of the core file size, as /proc/PID/limits gives them."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max core file size"):
            soft, hard = line.split()[4:6]
            return soft, hard
    raise AssertionError(f"no core limit in /proc/{pid}/limits")


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs Linux's /proc")
def test_the_cli_and_a_background_worker_write_no_core_file(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=40, execution={"concurrency": 1})
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    front = start_cli("run", job, "--runs-dir", tmp_path / "fg", cwd=tmp_path, env=env, output="discarded")
    try:
        wait_for(lambda: len(target.requests()) >= 1, "the run to send its first request")
        assert _core_limit(front.pid) == ("0", "0")
    finally:
        front.send_signal(signal.SIGTERM)
        front.wait(timeout=60)

    started = run_cli("run", job, "--runs-dir", tmp_path / "bg", "--budget", "1s", cwd=tmp_path, env=env)
    assert started.data is not None and "job_id" in started.data, started.envelope
    lock = tmp_path / "state" / "jobs" / started.data["job_id"] / "lock"
    wait_for(lambda: lock.is_file() and lock.read_text().strip().isdigit(), "the worker to hold its lock")
    worker = int(lock.read_text())
    try:
        assert _core_limit(worker) == ("0", "0")
    finally:
        os.kill(worker, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs Linux's /proc")
def test_the_line_scan_writes_no_core_file(tmp_path: Path) -> None:
    """The scan reads the input's rows; it waits here on a FIFO no one writes yet."""
    fifo, state = tmp_path / "rows.jsonl", tmp_path / "state.db"
    os.mkfifo(fifo)
    sqlite3.connect(state).close()
    params = {"path": str(fifo), "format": "jsonl", "gzip": False, "delimiter": ",", "key": "id"}
    params |= {"salt": "00", "state": str(state), "limit": 1 << 20}
    scan = subprocess.Popen(
        [sys.executable, "-m", "bulkrelay.sync.linescan", json.dumps(params)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Bounded: it fails when the scan never forbids core files (or ends before it does).
        wait_for(lambda: _core_limit(scan.pid) == ("0", "0"), "the line scan to forbid core files")
        assert scan.poll() is None  # still waiting on its input: the limit is the running scan's
    finally:
        scan.kill()
        scan.wait(timeout=60)
