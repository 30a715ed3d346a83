"""`bulkrelay sync-state rebuild|verify JOB`: a delta job's sync state, rebuilt from or checked
against its journals (sync/state.py does the work)."""

from __future__ import annotations

from pathlib import Path

from bulkrelay.envelope import Result
from bulkrelay.errors import UsageError
from bulkrelay.job.config import Job
from bulkrelay.ops.results import SyncStateResult
from bulkrelay.sync import job_identity, rebuild_state, verify_state


def sync_state_command(job: Job, runs_dir: Path, action: str) -> Result:
    """`action` is `rebuild` or `verify`; a job that keeps no sync state is a usage error."""
    if job.config.execution.sync == "full":
        raise UsageError(
            f"job {job.path} is not a delta job (execution.sync is full); it keeps no sync state"
        )
    identity = job_identity(job.config.name, job.path)
    check = rebuild_state(runs_dir, identity) if action == "rebuild" else verify_state(runs_dir, identity)
    return Result(data=SyncStateResult(check.job, check.state, check.runs, check.keys, check.matches))
