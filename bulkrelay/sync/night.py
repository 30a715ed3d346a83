"""A delta or mirror night as `ops/launch.py` sees it: the sync opened before preflight (its line
scan and state ready, a mirror job's unfinished deletion runs ended) and, after preflight, the keys
gone from tonight's input spooled for the deletion run."""

from __future__ import annotations

from pathlib import Path

from bulkrelay.errors import UsageError
from bulkrelay.job.config import Job
from bulkrelay.sync.delta import DeltaStart, open_delta
from bulkrelay.sync.mirror import check_and_spool, end_superseded
from bulkrelay.sync.state import job_identity, job_runs


def open_night(job: Job, runs_dir: Path, *, full: bool, sharded: bool, scan_lines: bool) -> DeltaStart | None:
    """The night's sync, None for a full job; the caller closes it after preflight."""
    delta = open_delta(job, runs_dir, full=full, scan_lines=scan_lines)
    if delta is None or delta.mirror is None:
        return delta
    if sharded:
        delta.close()
        raise UsageError(
            "sync: mirror cannot run in shards: each shard would delete every key gone from the input",
            suggestion="run the mirror job unsharded, or use sync: delta in the shards",
        )
    # The state has caught up with their journals (opening it did), so they can end.
    end_superseded(job_runs(runs_dir, job_identity(job.config.name, job.path)))
    return delta


def gone_keys(delta: DeltaStart | None, job: Job, spool_dir: Path) -> tuple[Path, int] | None:
    """For a mirror night, after preflight read every key: the deletions' spool file and their count
    (None when there are none, or the job is no mirror job); refused past `mirror.max_deletes`."""
    if delta is None or delta.mirror is None:
        return None
    path, count = check_and_spool(delta.state, job, spool_dir)
    return None if path is None else (path, count)
