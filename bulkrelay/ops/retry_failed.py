"""`retry-failed`: a new run, linked to its parent, of the rows the parent recorded as failed.

The child reads the parent's input, unchanged, and is limited to a selection of its rows, so row
numbers (and with them idempotency keys of rows identified by number) stay those of the input.
The job may change between parent and child: fixing the job is often why one retries.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bulkrelay.envelope import Result
from bulkrelay.errors import InputChanged, RunLocked, UsageError
from bulkrelay.job.config import Job, load_job
from bulkrelay.job.durations import whole_number
from bulkrelay.job.preflight import Preflight, RowsRead, run_preflight
from bulkrelay.ops.lifecycle import RunOptions, plan_for, start_fresh
from bulkrelay.ops.lookups import built_lookups, freeze_all, keep_frozen, with_lookups
from bulkrelay.ops.results import NothingToRetry, RunResult
from bulkrelay.ops.resume import check_committed_journal, input_differences, input_path_for, job_path_for
from bulkrelay.ops.sharding import shard_of_run
from bulkrelay.relay import progress
from bulkrelay.relay.engine import StartPoint
from bulkrelay.store.journal import read_journal
from bulkrelay.store.liverun import live_slot
from bulkrelay.store.manifest import RetryFilter
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.rundir import RunDir, is_locked
from bulkrelay.store.selection import save_selection
from bulkrelay.sync import job_of_run, refuse_superseded, shared_slot


def parse_statuses(text: str | None) -> frozenset[int] | None:
    """`--status 503,504`: HTTP statuses, at least one. An empty list would select nothing and
    exit 0 as if no row had failed (`--status "$CODES"` with CODES unset)."""
    if text is None:
        return None
    statuses = [whole_number(part.strip()) for part in text.split(",")]
    if not all(status is not None and 100 <= status <= 599 for status in statuses):
        raise UsageError(f"--status {text!r}: expected HTTP status codes (100-599) like 503,504")
    return frozenset(status for status in statuses if status is not None)


def failed_rows(
    parent: RunDir, size: int, statuses: frozenset[int] | None, classification: str | None
) -> RowSet:
    """The parent's failed rows that match the filters, read from its journal."""
    rows = RowSet(size)
    for entry in read_journal(parent.journal_path):
        if entry.success:
            continue
        if statuses is not None and entry.status_code not in statuses:
            continue
        if classification is not None and entry.classification != classification:
            continue
        rows.add(entry.row_number)
    return rows


def _parent_preflight(parent: RunDir, config: Path | None, on_rows_read: RowsRead | None) -> Preflight:
    job = job_of_run(parent, load_job(job_path_for(parent, config)))
    if job.config.lookups:  # built afresh: a row the parent's maps missed may be found now
        job = with_lookups(job, built_lookups(job, parent.path.parent))
    preflight = run_preflight(job, input_path_for(parent, None), on_rows_read=on_rows_read)
    changed = input_differences(parent.plan.input.fingerprint(), preflight.input_fingerprint.to_dict())
    if changed:
        raise InputChanged(
            f"the input of run {parent.run_id} changed; its row numbers no longer apply",
            context={"run_dir": str(parent.path), "changed": changed},
        )
    return preflight


def _prepare_child(child: RunDir, selection: RowSet, job: Job) -> None:
    save_selection(child.path, selection, child.storage)
    if job.config.lookups:  # the maps the child reads, frozen in it for its resume
        keep_frozen(freeze_all(job.lookups, child.path), child)


def retry_failed(
    run_dir: Path,
    *,
    config: Path | None,
    statuses: str | None,
    classification: str | None,
    options: RunOptions,
) -> Result:
    parent = RunDir.open(run_dir)
    if is_locked(parent.path):
        raise RunLocked(f"run {parent.run_id} is still running", context={"run_dir": str(parent.path)})
    check_committed_journal(parent, "retry-failed")
    preflight = _parent_preflight(parent, config, options.rows_read)
    selection = failed_rows(parent, preflight.record_count, parse_statuses(statuses), classification)
    if not len(selection):
        return Result(data=NothingToRetry(parent.run_id))
    plan = replace(
        plan_for(preflight),
        parent_run=parent.run_id,
        input_explicit=True,
        retry_filter=RetryFilter(statuses, classification),
        shard=parent.plan.shard,  # a shard's failed rows: the child is of the same shard
        # a deletion run's failed deletions: the child deletes too, and its successes leave the state
        mirror_deletes=parent.plan.mirror_deletes,
        mirror_of=parent.plan.mirror_of,
        delivery_run=parent.plan.delivery(parent.run_id),  # the parent's rows: their keys stay its
    )
    shared = shared_slot(preflight.job.config)
    with live_slot(parent.path.parent, preflight.job.path, shard_of_run(parent), shared=shared) as slot:
        refuse_superseded(parent, preflight)  # its failed rows' content is older than that run's
        result = start_fresh(
            preflight,
            parent.path.parent,
            options,
            progress.for_stderr(options.quiet),
            slot=slot,
            plan=plan,
            prepare=lambda child: _prepare_child(child, selection, preflight.job),
            start=StartPoint(done_rows=selection.complement(), total=len(selection)),
        )
    if isinstance(result.data, RunResult):
        result.data = replace(result.data, parent_run=parent.run_id)
    return result
