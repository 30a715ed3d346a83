"""`RunState` and the manifest's state: the values on disk, what each state allows, and a manifest
whose state is none of them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import JournalCorrupt
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.rundir import MANIFEST, AlphaRun, RunDir, RunState, open_listed
from tests.runplans import run_plan

# In run.json, envelopes and the metrics file: a renamed member must never change one of these.
VALUES = {
    RunState.RUNNING: "running",
    RunState.STOPPED: "stopped",
    RunState.FORCED: "forced",
    RunState.COMPLETED: "completed",
    RunState.COMPLETED_WITH_FAILURES: "completed_with_failures",
    RunState.CANCELLED: "cancelled",
}


def test_every_run_state_keeps_its_string_value_and_order() -> None:
    assert {state: state.value for state in RunState} == VALUES
    assert list(RunState) == list(VALUES)  # the metrics file lists the states in this order


def test_what_each_state_allows() -> None:
    assert {s for s in RunState if s.final} == {
        RunState.COMPLETED,
        RunState.COMPLETED_WITH_FAILURES,
        RunState.CANCELLED,
    }
    assert {s for s in RunState if s.resumable} == {RunState.STOPPED, RunState.FORCED}
    assert {s for s in RunState if s.every_row_ended} == {
        RunState.COMPLETED,
        RunState.COMPLETED_WITH_FAILURES,
    }
    # `running` is a live or a crashed run: its name alone says neither final nor resumable.
    assert not RunState.RUNNING.final and not RunState.RUNNING.resumable


def test_the_state_and_stop_reason_are_written_as_bare_strings(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, run_plan("/jobs/a.yaml"))
    assert orjson.loads((run.path / MANIFEST).read_bytes())["state"] == "running"

    run.mark_ended(RunState.STOPPED, StopReason.HALT_AUTH)

    on_disk = (run.path / MANIFEST).read_text()
    assert '"state": "stopped"' in on_disk and '"stop_reason": "halt_auth"' in on_disk
    assert RunDir.open(run.path).state is RunState.STOPPED


def test_a_manifest_with_an_unknown_state_is_refused_naming_file_and_field(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, run_plan("/jobs/a.yaml"))
    manifest = run.path / MANIFEST
    data = orjson.loads(manifest.read_bytes())
    manifest.write_bytes(orjson.dumps({**data, "state": "paused"}))

    with pytest.raises(JournalCorrupt) as refused:
        RunDir.open(run.path)

    assert refused.value.context == {"path": str(manifest), "field": "state", "state": "paused"}
    assert str(manifest) in refused.value.message and "'paused'" in refused.value.message


def test_an_alpha_manifest_keeps_its_own_state(tmp_path: Path) -> None:
    """The alpha's states are its own: a listing opens its run as before, whatever its state says."""
    alpha = tmp_path / "alpha-run"
    alpha.mkdir()
    (alpha / MANIFEST).write_bytes(
        orjson.dumps({"schema_version": 1, "run_id": "alpha-run", "state": "paused"})
    )

    run = open_listed(alpha)

    assert isinstance(run, AlphaRun)
    assert run.format == "alpha" and run.manifest.state == "paused"
