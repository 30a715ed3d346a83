"""`JobState`: the values in status.json and the `job` envelopes, and which states are final."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from bulkrelay.background.state import JobDir, JobState, remove_expired, retention_seconds

# In status.json and envelopes: a renamed member must never change one of these.
VALUES = {
    JobState.RUNNING: "running",
    JobState.CANCELLING: "cancelling",
    JobState.ENDED: "ended",
    JobState.CANCELLED: "cancelled",
    JobState.LOST: "lost",
}


def test_every_job_state_keeps_its_string_value() -> None:
    assert {state: state.value for state in JobState} == VALUES


def test_a_job_is_final_once_its_worker_is_gone() -> None:
    assert {s for s in JobState if not s.final} == {JobState.RUNNING, JobState.CANCELLING}


def test_a_job_s_state_on_disk_and_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own state directory: the session's is shared with the CLI tests, whose calls read every job.
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    job = JobDir.create("run", {"argv": ["run", "job.yaml"], "created_at": time.time()})
    assert orjson.loads((job.path / "status.json").read_bytes())["state"] == "running"
    assert job.state() is JobState.LOST  # no worker holds its lock, and it has no result

    job.write_result({"envelope": {}, "exit_code": 0, "kind": "run", "ended_at": time.time()})

    assert job.state() is JobState.ENDED


def test_a_job_with_a_damaged_result_expires_instead_of_breaking_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    job = JobDir.create("run", {"argv": ["run", "job.yaml"], "created_at": time.time()})
    job.write_result({"envelope": {}, "exit_code": 0, "kind": "run"})  # no ended_at: written by hand, say
    assert remove_expired(now=time.time()) == []  # not old yet: kept, and no KeyError
    assert remove_expired(now=time.time() + 2 * retention_seconds()) == [job.job_id]
