"""`report --history JOB_NAME`: the job's last nights on one page, each linked to its report, the bad
ones marked; made from run.json and summary.json alone."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.ops.history import history
from bulkrelay.ops.report import report
from bulkrelay.ops.results import HistoryResult
from bulkrelay.store.manifest import RunState
from tests.clirun import run_cli, run_cli_raw
from tests.report.nightfiles import job_plan, make_night


def test_the_history_draws_each_night_marks_the_bad_ones_and_links_each_report(tmp_path: Path) -> None:
    plan = job_plan(tmp_path)
    runs = tmp_path / "runs"
    clean = make_night(runs, plan, 0)
    failed = make_night(runs, plan, 1, failed=14)
    halted = make_night(runs, plan, 2, state=RunState.STOPPED, stop_reason="halt_auth", done=40)
    report(clean.path)  # the others have no report yet: their row gives the command that writes it
    out = tmp_path / "history.html"
    result = history("test-job", runs, out)
    assert isinstance(result.data, HistoryResult)
    assert result.data.nights == 3 and set(result.data.bad_nights) == {failed.run_id, halted.run_id}
    html = out.read_text()
    rows = dict(re.findall(r'<tr class="(good|bad)" data-run="([^"]+)"', html)[i][::-1] for i in range(3))
    assert rows == {clean.run_id: "good", failed.run_id: "bad", halted.run_id: "bad"}
    assert f'href="{(clean.path / "report.html").as_uri()}"' in html
    assert f"bulkrelay report {failed.path}" in html
    charts = re.findall(r'<svg class="chart" id="(chart-[^"]+)"', html)
    assert charts == [
        "chart-history-rows",
        "chart-history-failures",
        "chart-history-duration",
        "chart-history-throughput",
    ]
    assert "2 of the last 3 nights need a look" in html and "http_client_error 14" in html


@pytest.mark.slow
def test_the_history_keeps_the_last_nights_asked_for_and_leaves_other_jobs_out(tmp_path: Path) -> None:
    plan = job_plan(tmp_path)
    runs = tmp_path / "runs"
    made = [make_night(runs, plan, night) for night in range(5)]
    result = run_cli("report", "--history", "test-job", "--nights", "2", "--runs-dir", runs, cwd=tmp_path)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    page = Path(result.data["output"])
    assert page == runs / "history-test-job.html" and result.data["nights"] == 2
    shown = re.findall(r'data-run="([^"]+)"', page.read_text())
    assert shown == [made[4].run_id, made[3].run_id]  # newest first
    none = run_cli(
        "report", "--history", "another-job", "--runs-dir", runs, "-o", tmp_path / "x.html", cwd=tmp_path
    )
    assert none.exit_code == ExitCode.NOT_FOUND and none.error_code == "NOT_FOUND", none.envelope
    assert "no night of job 'another-job'" in none.envelope["error"]["message"]
    assert not (tmp_path / "x.html").exists()
    to_stdout = run_cli_raw("report", "--history", "test-job", "--runs-dir", runs, "-o", "-", cwd=tmp_path)
    assert to_stdout.returncode == ExitCode.SUCCESS, to_stdout.stderr  # the page on stdout, as a run's report
    assert to_stdout.stdout.startswith(b"<!DOCTYPE html>") and made[4].run_id.encode() in to_stdout.stdout
    assert orjson.loads(to_stdout.stderr)["data"]["output"] == "-"
    assert not (tmp_path / "-").exists()  # a file named `-` was written
    neither = run_cli("report", "--runs-dir", runs, cwd=tmp_path)
    assert neither.exit_code == ExitCode.ARG_ERROR and "--history" in neither.envelope["error"]["message"]
