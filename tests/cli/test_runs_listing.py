"""`bulkrelay runs` says when each run started and ended and how long it took (issue 43 item 7), in the
envelope (`created_at`, `ended_at`, `duration_seconds`) and in the human table, to the second."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.cli.human import print_human
from bulkrelay.envelope import to_envelope
from bulkrelay.ops.status import runs
from bulkrelay.store.manifest import RunState
from tests.report.nightfiles import job_plan, make_night


def test_runs_lists_started_ended_and_duration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = job_plan(tmp_path)
    listing = tmp_path / "runs"
    make_night(listing, plan, 0, seconds=125.5)
    make_night(listing, plan, 1, state=RunState.RUNNING, done=10)  # no process holds it: interrupted

    result = runs(listing)

    interrupted, ended = result.payload()["runs"]  # type: ignore[index]
    assert ended["created_at"] == "2026-11-30T00:53:20.000000Z"
    assert ended["ended_at"] == "2026-11-30T00:55:25.500000Z"
    assert ended["duration_seconds"] == 125.5
    assert interrupted["state"] == "interrupted"
    assert (interrupted["ended_at"], interrupted["duration_seconds"]) == (None, None)

    print_human(result, to_envelope(result, duration_ms=1))
    shown = capsys.readouterr().out
    assert "started (UTC)" in shown and "ended (UTC)" in shown and "took" in shown
    line = next(line for line in shown.splitlines() if ended["run_id"] in line)
    assert "2026-11-30 00:53:20" in line and "2026-11-30 00:55:25" in line and "2m 06s" in line
    assert ".000000" not in shown
