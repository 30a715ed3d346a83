"""A background job on disk: `BackgroundJobState`'s values in status.json and the `job` envelopes, which
states are final, and the job's spec, status and result as typed records that keep their files' fields."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest

from bulkrelay.background import jobs as background_jobs
from bulkrelay.background import reach as background_reach
from bulkrelay.background import state as background_state
from bulkrelay.background import worker as background_worker
from bulkrelay.background.state import (
    BackgroundJob,
    BackgroundJobResult,
    BackgroundJobSpec,
    BackgroundJobState,
    BackgroundJobStatus,
    WorkerReport,
    acquire_lock,
    remove_expired,
    retention_seconds,
)
from bulkrelay.errors import ExitCode
from tests.clirun import cli_env, run_cli

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

SPEC = BackgroundJobSpec(command="run", argv=("run", "job.yaml"), cwd="/work", key="k" * 32, created_at=0.0)

# In status.json and envelopes: a renamed member must never change one of these.
VALUES = {
    BackgroundJobState.RUNNING: "running",
    BackgroundJobState.CANCELLING: "cancelling",
    BackgroundJobState.ENDED: "ended",
    BackgroundJobState.CANCELLED: "cancelled",
    BackgroundJobState.LOST: "lost",
}


def test_every_job_state_keeps_its_string_value() -> None:
    assert {state: state.value for state in BackgroundJobState} == VALUES


def test_a_job_is_final_once_its_worker_is_gone() -> None:
    assert {s for s in BackgroundJobState if not s.final} == {
        BackgroundJobState.RUNNING,
        BackgroundJobState.CANCELLING,
    }


def test_a_job_s_state_on_disk_and_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its own state directory: the session's is shared with the CLI tests, whose calls read every job.
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    background = BackgroundJob.create(SPEC)
    assert orjson.loads((background.path / "status.json").read_bytes())["state"] == "running"
    assert background.state() is BackgroundJobState.LOST  # no worker holds its lock, and it has no result

    background.write_result(BackgroundJobResult({}, 0, "run", ended_at=time.time()))

    assert background.state() is BackgroundJobState.ENDED


def test_a_job_with_a_damaged_result_expires_instead_of_breaking_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    background = BackgroundJob.create(SPEC)
    background.write_result(BackgroundJobResult({}, 0, "run"))  # no ended_at: written by hand, say
    assert remove_expired(now=time.time()) == []  # not old yet: kept, and no KeyError
    assert remove_expired(now=time.time() + 2 * retention_seconds()) == [background.job_id]


def _on_disk(background: BackgroundJob, name: str) -> dict[str, object]:
    data: dict[str, object] = orjson.loads((background.path / name).read_bytes())
    return data


def test_the_job_files_keep_their_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    background = BackgroundJob.create(SPEC)
    spec = _on_disk(background, "spec.json")
    assert spec == {
        **SPEC.to_json(background.job_id),
        "argv": ["run", "job.yaml"],
        "job_id": background.job_id,
    }
    assert set(spec) == {
        *("job_id", "command", "argv", "cwd", "key", "created_at", "deadline", "previous_job", "stdin_rest")
    }
    assert background.spec() == SPEC
    # The front writes the first status; the worker adds its report, and its exit code at the end.
    assert set(_on_disk(background, "status.json")) == {"state", "progress", "run_dir", "updated_at"}
    report = WorkerReport("relay", None, ({"code": "W", "message": "m"},), 4242)
    progress = {"done": 1, "total": 2, "unit": "rows", "ok": 1, "failed": 0}
    background.write_status(BackgroundJobStatus(BackgroundJobState.RUNNING, progress, "/runs/r", report))
    running = _on_disk(background, "status.json")
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
    background.write_status(
        BackgroundJobStatus(BackgroundJobState.ENDED, progress, "/runs/r", report, exit_code=3)
    )
    assert _on_disk(background, "status.json")["exit_code"] == 3
    status = background.status()
    assert (status.state, status.worker, status.exit_code) == (BackgroundJobState.ENDED, report, 3)
    background.write_result(BackgroundJobResult({"ok": True}, 0, "run", ended_at=5.0))
    assert _on_disk(background, "result.json") == {
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
    background = BackgroundJob.create(SPEC)
    status = background.path / "status.json"
    damaged = {"state": "running", "progress": None, "run_dir": None, "updated_at": 1.0}
    status.write_bytes(
        orjson.dumps({**damaged, "stage": "relay", "rows_read": None, "warnings": ["x"], "pid": 1})
    )
    lock = acquire_lock(background)  # the job looks alive: its status is what `job status` answers from
    try:
        answer = run_cli("job", "status", background.job_id, env=cli_env())
    finally:
        os.close(lock)
    assert answer.exit_code == ExitCode.GENERAL_ERROR, answer.envelope
    assert answer.envelope["error"]["context"] == {"path": str(status), "field": "warnings"}
    assert str(status) in answer.envelope["error"]["message"]


def test_in_code_a_background_job_is_named_so_and_job_alone_means_the_job_file() -> None:
    """`Job` is the job file (bulkrelay.job.config); a background job's classes say `Background`."""
    defined = {
        name
        for module in (background_state, background_jobs, background_reach, background_worker)
        for name, value in vars(module).items()
        if isinstance(value, type) and value.__module__ == module.__name__
    }
    assert {"BackgroundJob", "BackgroundJobState", "BackgroundSupervisor"} <= defined
    assert not [name for name in defined if name.startswith("Job")]
