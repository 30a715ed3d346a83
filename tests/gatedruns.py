"""A run held at a gate at the target: every request gets 503 (and is retried) while the gate is closed,
so a test can change something mid-run at a moment it chose, with no timing, then open the gate.

    target = TargetProcess(GATE)
    job = write_job(tmp_path, target.url, rows=300, **GATED_JOB)  # tests/jobfiles.py
    code, envelope = run_changing_the_input(tmp_path, job, target, append_a_row)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tests.clirun import start_cli
from tests.targetproc import TargetProcess

GATE = {"rules": [{"status": 503}]}  # closed: nothing succeeds, every row is retried
OPEN: dict[str, Any] = {}  # every request gets 200
GATED_JOB: dict[str, Any] = {  # retries every 503 long enough for any test to open the gate
    "retry": {
        "max_attempts": 100,
        "statuses": [503],
        "initial_backoff_seconds": 0.05,
        "max_backoff_seconds": 1,
        "jitter_ratio": 0,
    },
}


def run_changing_the_input(
    cwd: Path, job: Path, target: TargetProcess, change: Callable[[Path], None]
) -> tuple[int, dict[str, Any]]:
    """Start `run`, wait until the relay has taken rows (held at the closed gate), change the
    input, open the gate, and return the run's exit code and envelope."""
    proc = start_cli("run", job, "--budget", "0", cwd=cwd)
    try:
        deadline = time.monotonic() + 60
        while target.stats()["requests"] < 4:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never reached the target"
            time.sleep(0.01)
        change(cwd / "data.csv")
        target.set_plan(OPEN)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"Traceback" not in stderr, stderr.decode()
    return proc.returncode, orjson.loads(stdout)


def delivered_ids(target: TargetProcess) -> Counter[str]:
    """Row ids the target answered with 200 (the gate's 503s are not deliveries)."""
    return Counter(r["path"].rsplit("/", 1)[-1] for r in target.requests() if r["status"] == 200)
