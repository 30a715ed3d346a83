"""Which newer runs overtake a delta run (sync/superseded.py): run directories made by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bulkrelay.store.manifest import RunManifest, ShardRecord
from bulkrelay.store.rundir import RunDir, RunState
from bulkrelay.sync.superseded import newer_run
from tests.runplans import run_plan


def _run(runs_dir: Path, run_id: str, second: int, **plan: Any) -> RunDir:
    path = runs_dir / run_id
    path.mkdir(parents=True)
    created = f"2026-12-01T03:00:{second:02d}.000000Z"
    made = run_plan("/job.yaml", **{"name": "nightly", **plan})
    manifest = RunManifest(run_id, RunState.STOPPED, created, created, "0.1.0", made)
    (path / "run.json").write_bytes(orjson.dumps(manifest.to_json()))
    (path / "results.jsonl").write_bytes(b"")
    return RunDir.open(path)


def _id(run: RunDir | None) -> str | None:
    return None if run is None else run.run_id


def test_a_later_run_of_the_job_overtakes_but_its_own_retry_and_deletions_do_not(tmp_path: Path) -> None:
    night_1 = _run(tmp_path, "r1", 1)
    _run(tmp_path, "r1-retry", 2, parent_run="r1")
    _run(tmp_path, "r1-deletes", 3, mirror_of="r1", mirror_deletes=True)
    _run(tmp_path, "other-job", 4, name="another")
    assert newer_run(night_1) is None
    night_2 = _run(tmp_path, "r2", 5)
    assert _id(newer_run(night_1)) == night_2.run_id
    assert newer_run(night_2) is None


def test_shards_of_one_count_overtake_only_their_own_index(tmp_path: Path) -> None:
    shard_0 = _run(tmp_path, "s0", 1, shard=ShardRecord(0, 2))
    _run(tmp_path, "s1", 2, shard=ShardRecord(1, 2))
    assert newer_run(shard_0) is None
    later = _run(tmp_path, "s0-night-2", 3, shard=ShardRecord(0, 3))  # another count: any key may be its
    assert _id(newer_run(shard_0)) == later.run_id
