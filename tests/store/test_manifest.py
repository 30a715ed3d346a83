"""`run.json` as a typed record: every field it has had keeps its bytes, and a damaged one is refused
with JOURNAL_CORRUPT naming the file and the field, by every command that opens the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode, JournalCorrupt
from bulkrelay.store.manifest import (
    Invocation,
    RetryFilter,
    RunManifest,
    ShardRecord,
    SyncRecord,
)
from bulkrelay.store.rundir import MANIFEST, RunDir, RunState
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.runplans import run_plan
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

EXAMPLE_RUNS = Path(__file__).resolve().parents[2] / ".bulkrelay.example" / "runs"
INDENTED_SORTED = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


def _on_disk(run: RunDir) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((run.path / MANIFEST).read_bytes())
    return data


def test_the_example_run_json_is_written_back_byte_for_byte() -> None:
    (path,) = [p / MANIFEST for p in EXAMPLE_RUNS.iterdir() if p.is_dir()]
    original = path.read_bytes()
    manifest = RunManifest.from_json(path, orjson.loads(original))
    assert orjson.dumps(manifest.to_json(), option=INDENTED_SORTED) + b"\n" == original


def test_every_optional_part_round_trips_and_keeps_its_spelling(tmp_path: Path) -> None:
    plan = run_plan(
        name="nightly",
        parent_run="20261201T000000Z-00000000",
        input_explicit=True,
        invocation=Invocation("k" * 32, None),
        shard=ShardRecord(1, 4),
        sync=SyncRecord(mode="delta", full=False, selected=3, skipped_unchanged=7),
        retry_filter=RetryFilter("503,504", None),
        mirror_deletes=True,
        mirror_of="20261130T000000Z-11111111",
    )
    run = RunDir.create(tmp_path, plan)
    data = _on_disk(run)
    assert data["shard"] == {"index": 1, "count": 4}
    assert data["sync"] == {"mode": "delta", "full": False, "selected": 3, "skipped_unchanged": 7}
    assert data["retry_filter"] == {"statuses": "503,504", "classification": None}
    assert (data["invocation_key"], data["idempotency_key"]) == ("k" * 32, None)
    assert (data["mirror_deletes"], data["mirror_of"]) == (True, "20261130T000000Z-11111111")
    assert RunDir.open(run.path).manifest == run.manifest


def test_pid_and_stop_reason_appear_when_the_run_first_starts_and_ends(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, run_plan())
    absent = {"pid", "stop_reason", "invocation_key", "shard", "sync", "mirror_deletes"}
    assert not absent & set(_on_disk(run))
    run.mark_running(4242)
    assert _on_disk(run)["pid"] == 4242 and "stop_reason" not in _on_disk(run)
    run.mark_ended(RunState.STOPPED, "deadline")
    assert (_on_disk(run)["pid"], _on_disk(run)["stop_reason"]) == (None, "deadline")
    run.mark_running(4343)  # resumed: the last stop's reason stays until this relay ends
    assert (_on_disk(run)["pid"], _on_disk(run)["stop_reason"]) == (4343, "deadline")
    run.mark_ended(RunState.COMPLETED, None)
    assert (_on_disk(run)["pid"], _on_disk(run)["stop_reason"]) == (None, None)


def _damage(run: RunDir, field: str, value: object) -> Path:
    path = run.path / MANIFEST
    data = _on_disk(run)
    block, _, name = field.rpartition(".")
    target = data[block] if block else data
    if value is _MISSING:
        del target[name]
    else:
        target[name] = value
    path.write_bytes(orjson.dumps(data))
    return path


_MISSING = object()

DAMAGE = [
    ("job_path", _MISSING),
    ("input", "customers.csv"),
    ("input.record_count", "50"),
    ("input.gzip", 0),
    ("config_sha256", None),
    ("created_at", 20261201),
    ("shard.count", None),
    ("pid", "4242"),
]


@pytest.mark.parametrize(("field", "value"), DAMAGE, ids=[field for field, _ in DAMAGE])
def test_a_damaged_field_is_refused_naming_the_file_and_the_field(
    tmp_path: Path, field: str, value: object
) -> None:
    run = RunDir.create(tmp_path, run_plan(shard=ShardRecord(0, 2)))
    path = _damage(run, field, value)
    with pytest.raises(JournalCorrupt) as refused:
        RunDir.open(run.path)
    assert refused.value.context == {"path": str(path), "field": field}
    assert str(path) in refused.value.message and repr(field) in refused.value.message


def test_status_of_a_run_json_with_a_mistyped_count_is_journal_corrupt(tmp_path: Path) -> None:
    """Before, `status` and `runs` met the damage as a KeyError or TypeError deep inside (exit 1)."""
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        done = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    run = RunDir.open(Path(done.data["run_dir"]))
    path = _damage(run, "input.record_count", "3")

    status = run_cli("status", run.path, cwd=tmp_path)

    assert status.exit_code == ExitCode.PRECONDITION, status.envelope
    assert status.error_code == "JOURNAL_CORRUPT"
    assert status.envelope["error"]["context"] == {"path": str(path), "field": "input.record_count"}
