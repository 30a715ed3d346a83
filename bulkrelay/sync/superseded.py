"""A delta run that a newer run of its job has overtaken is never continued over it.

Night 1 stopped; night 2, on new input, delivered B; `resume` of night 1 would then deliver its A
over B for every row it had not sent, while the sync state (ordered by when runs started) keeps B, so
no later night would repair the target. So a run of a delta or mirror job is *superseded* once a run
of the same job (the sync state's identity) started after it and may deliver the same keys: any run
but its own `retry-failed` children and deletion run, and but a shard of the same count with another
index (its keys are others). `resume` and `retry-failed` of it are refused (`RUN_SUPERSEDED`, exit
4, naming the newer run); the identical re-run starts a new run instead, as for a changed input.
"""

from __future__ import annotations

from bulkrelay.errors import RunSuperseded
from bulkrelay.job.preflight import Preflight
from bulkrelay.store.manifest import ShardRecord
from bulkrelay.store.rundir import RunDir
from bulkrelay.sync.state import job_runs, manifest_identity, run_started


def newer_run(run: RunDir) -> RunDir | None:
    """The newest run of `run`'s job started after it that may deliver the same keys, if any."""
    started = run_started(run)
    for other in reversed(job_runs(run.path.parent, manifest_identity(run.plan))):
        if run_started(other) <= started:
            return None
        if run.run_id in (other.plan.parent_run, other.plan.mirror_of):
            continue  # its own retry or deletions: the same delivery, carried on
        if _same_keys_possible(run.plan.shard, other.plan.shard):
            return other
    return None


def _same_keys_possible(one: ShardRecord | None, other: ShardRecord | None) -> bool:
    if one is None or other is None or one.count != other.count:
        return True
    return one.index == other.index


def overtaken_by(run: RunDir, preflight: Preflight) -> RunSuperseded | None:
    """Why continuing `run` (of the job `preflight` read) would deliver over a newer run, or None."""
    if preflight.digester is None and not run.plan.mirror_deletes:
        return None  # not a delta job's: nothing keeps what it delivered in order
    newer = newer_run(run)
    if newer is None:
        return None
    return RunSuperseded(
        f"run {run.run_id} was overtaken by run {newer.run_id} of the same delta job, started after it: "
        "continuing it would deliver its older rows over that run's deliveries",
        context={"run_dir": str(run.path), "newer_run": newer.run_id, "newer_run_dir": str(newer.path)},
        suggestion="run the job again (`bulkrelay run JOB`): it sends what its input says now, "
        "each row that differs from the last delivery once",
    )


def refuse_superseded(run: RunDir, preflight: Preflight) -> None:
    refusal = overtaken_by(run, preflight)
    if refusal is not None:
        raise refusal
