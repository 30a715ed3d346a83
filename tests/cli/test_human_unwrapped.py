"""Human output off a terminal (cron mail, `--human | cat`) is never wrapped at 80 columns: a command or
a hint stays on one line, a rendered JSON body stays whole, and `runs` keeps its columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import run_cli_raw
from tests.jobfiles import make_rows, write_job
from tests.targetproc import TargetProcess

_LONG_NAME = "nightly-customers-to-the-crm-with-a-name-longer-than-any-terminal-is-wide"


def _deep(tmp_path: Path) -> Path:
    """A working directory whose path alone is longer than 80 columns, as a real deployment's can be."""
    deep = tmp_path / "srv" / "bulkrelay" / "jobs" / "customers-nightly-to-the-crm" / "work"
    deep.mkdir(parents=True)
    assert len(str(deep)) > 80
    return deep


@pytest.mark.slow
def test_render_human_keeps_a_long_json_body_on_one_line(tmp_path: Path) -> None:
    rows = make_rows(2)
    rows[0]["name"] = "A" * 150 + " with a name that a wrapping renderer would break in the middle of a token"
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=rows)
    proc = run_cli_raw("render", job, "--rows", "1", "--human", cwd=tmp_path)
    assert proc.returncode == ExitCode.SUCCESS, proc.stderr
    bodies = [line for line in proc.stdout.decode().splitlines() if line.startswith("{")]
    assert len(bodies) == 1
    assert json.loads(bodies[0])["name"] == rows[0]["name"]  # whole: one line, one JSON document
    assert max(len(line) for line in proc.stdout.decode().splitlines()) > 150


@pytest.mark.slow
def test_a_failed_run_s_hint_and_the_runs_table_stay_on_their_lines(tmp_path: Path) -> None:
    deep = _deep(tmp_path)
    with TargetProcess({"status": 422}) as target:
        job = write_job(deep, target.url, rows=3, name=_LONG_NAME)
        proc = run_cli_raw("run", job, "--budget", "0", "--human", cwd=deep)
    assert proc.returncode == ExitCode.PARTIAL_FAILURE, proc.stderr
    run_dir = next((deep / ".bulkrelay" / "runs").glob("2*"))
    hints = [line for line in proc.stderr.decode().splitlines() if line.startswith("hint:")]
    assert hints == [f"hint: bulkrelay retry-failed {run_dir}"]
    assert f"({run_dir})" in proc.stdout.decode()  # the run's directory, whole, on its line
    listed = run_cli_raw("runs", "--human", cwd=deep)
    assert listed.returncode == ExitCode.SUCCESS, listed.stderr
    row = [line for line in listed.stdout.decode().splitlines() if run_dir.name in line]
    assert len(row) == 1
    cells = [cell.strip() for cell in row[0].split("│") if cell.strip()]
    # started, ended and took (issue 43 item 7) sit between the state and the counts
    assert cells[:2] == [run_dir.name, "completed_with_failures"] and len(cells) == 9, cells
    assert cells[5:] == ["3", "3", "3", _LONG_NAME]
