"""A background job on disk: `JobState`'s values in status.json and the `job` envelopes, which states
are final, and the job's spec, status and result as typed records that keep their files' fields."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from bulkrelay.background.state import (
    JobDir,
    JobResult,
    JobSpec,
    JobState,
    JobStatus,
    WorkerReport,
    acquire_lock,
    remove_expired,
    retention_seconds,
)
from bulkrelay.errors import ExitCode
from tests.clirun import cli_env, run_cli

SPEC = JobSpec(command="run", argv=("run", "job.yaml"), cwd="/work", key="k" * 32, created_at=0.0)

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
    job = JobDir.create(SPEC)
    assert orjson.loads((job.path / "status.json").read_bytes())["state"] == "running"
    assert job.state() is JobState.LOST  # no worker holds its lock, and it has no result

    job.write_result(JobResult({}, 0, "run", ended_at=time.time()))

    assert job.state() is JobState.ENDED


def test_a_job_with_a_damaged_result_expires_instead_of_breaking_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    job = JobDir.create(SPEC)
    job.write_result(JobResult({}, 0, "run"))  # no ended_at: written by hand, say
    assert remove_expired(now=time.time()) == []  # not old yet: kept, and no KeyError
    assert remove_expired(now=time.time() + 2 * retention_seconds()) == [job.job_id]


def _on_disk(job: JobDir, name: str) -> dict[str, object]:
    data: dict[str, object] = orjson.loads((job.path / name).read_bytes())
    return data


def test_the_job_files_keep_their_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    job = JobDir.create(SPEC)
    spec = _on_disk(job, "spec.json")
    assert spec == {**SPEC.to_json(job.job_id), "argv": ["run", "job.yaml"], "job_id": job.job_id}
    assert set(spec) == {"job_id", "command", "argv", "cwd", "key", "created_at", "deadline", "previous_job"}
    assert job.spec() == SPEC
    # The front writes the first status; the worker adds its report, and its exit code at the end.
    assert set(_on_disk(job, "status.json")) == {"state", "progress", "run_dir", "updated_at"}
    report = WorkerReport("relay", None, ({"code": "W", "message": "m"},), 4242)
    progress = {"done": 1, "total": 2, "unit": "rows", "ok": 1, "failed": 0}
    job.write_status(JobStatus(JobState.RUNNING, progress, "/runs/r", report))
    running = _on_disk(job, "status.json")
    assert set(running) == {
        "state",
        "progress",
        "run_dir",
        "updated_at",
        "stage",
        "rows_read",
        "warnings",
        "pid",
    }
    assert (running["stage"], running["warnings"], running["pid"]) == (
        "relay",
        [{"code": "W", "message": "m"}],
        4242,
    )
    job.write_status(JobStatus(JobState.ENDED, progress, "/runs/r", report, exit_code=3))
    assert _on_disk(job, "status.json")["exit_code"] == 3
    status = job.status()
    assert (status.state, status.worker, status.exit_code) == (JobState.ENDED, report, 3)
    job.write_result(JobResult({"ok": True}, 0, "run", ended_at=5.0))
    assert _on_disk(job, "result.json") == {
        "envelope": {"ok": True},
        "exit_code": 0,
        "kind": "run",
        "ended_at": 5.0,
    }


def test_job_status_of_a_status_file_with_a_bad_field_names_the_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a warning that is not an object broke `job status` with a bare TypeError."""
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    job = JobDir.create(SPEC)
    status = job.path / "status.json"
    damaged = {"state": "running", "progress": None, "run_dir": None, "updated_at": 1.0}
    status.write_bytes(
        orjson.dumps({**damaged, "stage": "relay", "rows_read": None, "warnings": ["x"], "pid": 1})
    )
    lock = acquire_lock(job)  # the job looks alive: its status is what `job status` answers from
    try:
        answer = run_cli("job", "status", job.job_id, env=cli_env())
    finally:
        os.close(lock)
    assert answer.exit_code == ExitCode.GENERAL_ERROR, answer.envelope
    assert answer.envelope["error"]["context"] == {"path": str(status), "field": "warnings"}
    assert str(status) in answer.envelope["error"]["message"]
