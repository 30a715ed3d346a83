"""`status` of a live run (liveness from the lock, pace, stop reason, latency without nulls), of a
killed one ("crashed — resumable"), the human view without "None", and shell completion scripts."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from bulkrelay.cli import human
from bulkrelay.envelope import Result, to_envelope
from bulkrelay.errors import ExitCode
from bulkrelay.ops.results import FailuresResult, PruneResult, StatusResult
from bulkrelay.relay.progress import Snapshot
from bulkrelay.report.failuregroups import FailureExample, FailureGroup
from bulkrelay.store.rundir import RunState
from tests.clirun import CliResult, cli_env, run_cli
from tests.jobfiles import write_job
from tests.spawnedruns import run_held_by, spawn_run
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

SLOW = {"rules": [{"delay_ms": 100}]}
PACED: dict[str, Any] = {"execution": {"concurrency": 2, "rate_limit": {"requests_per_second": 10}}}


def _status_when(run_dir: Path, ready: Any, timeout: float = HANG_S) -> CliResult:
    """Poll `status` until `ready(data)` holds; the deadline is generous, the condition exact."""
    deadline = time.monotonic() + timeout
    while True:
        status = run_cli("status", run_dir)
        if status.exit_code == ExitCode.SUCCESS and ready(status.data):
            return status
        assert time.monotonic() < deadline, status.envelope
        time.sleep(0.2)


def test_status_of_a_live_run_then_of_the_same_run_killed(tmp_path: Path) -> None:
    with TargetProcess(SLOW) as target:
        job = write_job(tmp_path, target.url, 300, **PACED)
        proc = spawn_run(tmp_path, job)
        try:
            run_dir = run_held_by(tmp_path / ".bulkrelay" / "runs", proc)
            live = _status_when(run_dir, lambda d: d["progress"]["done"] > 0 and d["rate"])
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(30)
    data = live.data
    assert data["live"] is True and data["liveness"] == "live" and data["pid"] == proc.pid
    assert data["state"] == "running" and data["stop_reason"] is None
    assert data["rate"]["configured_rps"] == 10 and data["rate"]["rows_per_second"] > 0
    assert None not in data["latency_ms"].values()
    assert b"None" not in live.stdout

    crashed = run_cli("status", run_dir).data
    assert crashed["liveness"] == "crashed \u2014 resumable" and crashed["live"] is False
    assert crashed["state"] == "running" and crashed["pid"] is None
    assert crashed["continue_command"] == f"bulkrelay resume {run_dir}"


def test_status_of_a_stopped_run_names_its_stop_reason(tmp_path: Path) -> None:
    with TargetProcess(SLOW) as target:
        job = write_job(tmp_path, target.url, 300, **PACED)
        run = run_cli("run", job, "--budget", "0", "--timeout", "1", cwd=tmp_path)
    assert run.exit_code == ExitCode.TIMEOUT, run.envelope
    status = run_cli("status", run.data["run_dir"]).data
    assert status["liveness"] == "stopped \u2014 resumable" and status["stop_reason"] == "timeout"
    assert status["rate"]["rows_per_second"] >= 0


def test_the_human_status_of_a_run_without_rows_shows_no_none(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(human, "_console", Console(file=out, width=200))
    latency = {"p50": None, "p95": None, "p99": None, "max": None}
    summary = {
        "rows_done": 0,
        "rows_total": 5,
        "by_outcome": {"succeeded": 0, "failed": 0},
        "attempts": 0,
        "retries": 0,
        "by_status": {},
        "by_classification": {},
        "latency_ms": latency,
    }
    data = StatusResult(
        run_id="r",
        run_dir="/runs/r",
        state=RunState.RUNNING,
        live=False,
        liveness="crashed \u2014 resumable",
        pid=None,
        stop_reason=None,
        created_at=None,
        updated_at=None,
        parent_run=None,
        progress=Snapshot(total=5, done=0, ok=0, failed=0),
        rate=None,
        latency_ms={},
        summary=summary,
    )
    result = Result(data=data)
    human.print_human(result, to_envelope(result, duration_ms=1))
    text = out.getvalue()
    assert "None" not in text and "crashed" in text and "- / - / -" in text


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_each_shells_script_alone_on_stdout(shell: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bulkrelay", "completion", shell],
        env=cli_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout.decode()
    assert "bulkrelay" in script and "prune" in script and not script.startswith("{")


def test_the_bash_completion_sources_and_completes_commands(tmp_path: Path) -> None:
    script = tmp_path / "bulkrelay.bash"
    produced = subprocess.run(
        [sys.executable, "-m", "bulkrelay", "completion", "bash"],
        env=cli_env(),
        capture_output=True,
        check=True,
    )
    script.write_bytes(produced.stdout)
    probe = (
        f"set -e; source {script}; COMP_WORDS=(bulkrelay pr); COMP_CWORD=1; "
        'COMP_LINE="bulkrelay pr"; COMP_POINT=${#COMP_LINE}; '
        '_shtab_bulkrelay bulkrelay pr bulkrelay; echo "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["prune"]


def test_the_human_views_of_failures_and_prune(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(human, "_console", Console(file=out, width=200))
    example = FailureExample(row_number=3, attempts=1, error="HTTP 422", body='{"error":"rejected"}')
    group = FailureGroup(status_code=422, classification="http_client_error", count=13, examples=(example,))
    found = FailuresResult(
        run_id="r1", run_dir="/runs/r1", state=RunState.COMPLETED_WITH_FAILURES, failed=13, groups=(group,)
    )
    failures = Result(data=found)
    human.print_human(failures, to_envelope(failures, duration_ms=1))
    pruned = PruneResult(runs_dir="/runs", dry_run=True, keep=2, older_than=None, removed=("r0",), kept=2)
    prune = Result(data=pruned)
    human.print_human(prune, to_envelope(prune, duration_ms=1))
    text = out.getvalue()
    assert "13 failed rows in run r1" in text and "3: HTTP 422" in text and "rejected" in text
    assert "would remove 1 runs, kept 2 in /runs" in text and "r0" in text
