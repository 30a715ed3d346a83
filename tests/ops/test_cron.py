"""A nightly sync as cron runs it: no terminal, an environment with only PATH, the command by name,
and last night's run still going when tonight's starts. One run at a time, documented exit codes,
and retention from `.bulkrelay/config.yaml` keeps the runs directory pruned."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from tests.jobfiles import write_job
from tests.spawnedruns import run_held_by
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

SLOW = {"rules": [{"delay_ms": 200}]}  # 100 rows one at a time: about 20 s, until the plan changes


def _cron_env() -> dict[str, str]:
    """What cron gives a job: PATH, here with the project's `bulkrelay` on it."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}


def _cron_command(job: Path) -> list[str]:
    return ["bulkrelay", "run", str(job), "--budget", "0"]


def _cron(job: Path, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _cron_command(job),
        cwd=cwd,
        env=_cron_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, dict[str, Any]]:
    out, _ = proc.communicate(timeout=180)
    return proc.returncode, orjson.loads(out)


def test_cron_runs_one_at_a_time_with_documented_exit_codes_and_a_pruned_runs_dir(tmp_path: Path) -> None:
    (tmp_path / ".bulkrelay").mkdir()
    (tmp_path / ".bulkrelay" / "config.yaml").write_text("retention:\n  keep: 1\n")
    runs = tmp_path / ".bulkrelay" / "runs"
    with TargetProcess(SLOW) as target:
        job = write_job(tmp_path, target.url, 100, execution={"concurrency": 1})
        last_night = _cron(job, tmp_path)
        first_dir = run_held_by(runs, last_night)
        code, overlap = finish(_cron(job, tmp_path))  # tonight's starts while last night's relays
        assert last_night.poll() is None, "last night's run ended before the overlap was tried"
        assert code == ExitCode.CONFLICT and overlap["error"]["code"] == "RUN_LOCKED", overlap
        assert overlap["error"]["context"]["run_dir"] == str(first_dir)
        target.set_plan({})  # the target speeds up: last night's run finishes
        code, first = finish(last_night)
        assert code == ExitCode.SUCCESS, first
        assert target.stats()["requests"] == 100  # the overlap sent nothing

        code, second = finish(_cron(job, tmp_path))  # the next night
        assert code == ExitCode.SUCCESS, second
    assert second["data"]["run_id"] != first["data"]["run_id"]
    assert second["data"]["pruned"] == [first["data"]["run_id"]]
    assert [p.name for p in runs.iterdir() if (p / "run.json").exists()] == [second["data"]["run_id"]]
