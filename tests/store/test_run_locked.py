"""RUN_LOCKED names the run's path (issue 43 item 7): in its message, which the human output shows,
and in the `bulkrelay status` command of its hint, so the operator can look at the run that holds it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from bulkrelay.errors import RunLocked
from bulkrelay.store.liverun import live_slot
from bulkrelay.store.rundir import RunDir
from tests.runplans import run_plan


def _run(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path / "runs with space", run_plan())


def test_a_run_held_by_another_holder_is_named_by_its_path(tmp_path: Path) -> None:
    run = _run(tmp_path)
    with run.locked(), pytest.raises(RunLocked) as refused, run.locked():
        pass
    assert str(run.path) in refused.value.message
    assert refused.value.suggestion is not None
    assert f"bulkrelay status {shlex.quote(str(run.path))}" in refused.value.suggestion


def test_a_second_run_of_a_live_job_names_the_live_run_s_path(tmp_path: Path) -> None:
    run = _run(tmp_path)
    job = tmp_path / "job.yaml"
    with live_slot(run.path.parent, job) as slot:
        slot.claim(run)
        with pytest.raises(RunLocked) as refused, live_slot(run.path.parent, job):
            pass
    assert f"{run.run_id} (pid " in refused.value.message and str(run.path) in refused.value.message
    assert refused.value.suggestion is not None
    assert f"bulkrelay status {shlex.quote(str(run.path))}" in refused.value.suggestion
