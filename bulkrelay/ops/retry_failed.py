"""`retry-failed`: a new run, linked to its parent, of the rows the parent recorded as failed.

The child reads the parent's input, unchanged, and is limited to a selection of its rows, so row
numbers (and with them idempotency keys of rows identified by number) stay those of the input.
The job may change between parent and child: fixing the job is often why one retries.

The identical `retry-failed` (same parent, job file and filters) continues its child while that child
is unfinished (stopped, or crashed: killed, out of memory), as the identical `run` continues its run:
a second child would send again every row the first one delivered.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import ConfigChanged, InputChanged, RunLocked, UsageError
from bulkrelay.job.config import Job, load_job
from bulkrelay.job.durations import whole_number
from bulkrelay.job.preflight import Preflight, RowsRead, run_preflight
from bulkrelay.ops.damage import check_committed_journal
from bulkrelay.ops.invocation import invocation_key, last_run_id, normalized_path, remember
from bulkrelay.ops.lifecycle import RunOptions, continue_run, plan_for, refuse_workers_flag, start_fresh
from bulkrelay.ops.lookups import built_lookups, freeze_all, frozen_lookups, keep_frozen, with_lookups
from bulkrelay.ops.results import NothingToRetry, RunResult
from bulkrelay.ops.resume import (
    input_differences,
    input_path_for,
    job_path_for,
    verify_unchanged,
)
from bulkrelay.ops.sharding import shard_of_run
from bulkrelay.relay import progress
from bulkrelay.relay.engine import StartPoint
from bulkrelay.relay.retry import BATCH_ANSWER_INVALID
from bulkrelay.store.journal import read_journal
from bulkrelay.store.liverun import LiveSlot, live_slot
from bulkrelay.store.manifest import Invocation, RetryFilter
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.rundir import LOCK, RunDir, probe_lock
from bulkrelay.store.runs import run_by_id
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


def _parent_preflight(
    parent: RunDir, config: Path | None, on_rows_read: RowsRead | None, child: RunDir | None
) -> Preflight:
    """The parent's job preflighted; its lookups built afresh (a row the parent's maps missed may be
    found now), or for the `child` it continues, the maps that child froze."""
    job = job_of_run(parent, load_job(job_path_for(parent, config)))
    if job.config.lookups:
        maps = frozen_lookups(job, child) if child is not None else built_lookups(job, parent.path.parent)
        job = with_lookups(job, maps)
    preflight = run_preflight(job, input_path_for(parent, None), on_rows_read=on_rows_read)
    changed = input_differences(parent.plan.input.fingerprint(), preflight.input_fingerprint.to_dict())
    if changed:
        raise InputChanged(
            f"the input of run {parent.run_id} changed; its row numbers no longer apply",
            context={"run_dir": str(parent.path), "changed": changed},
        )
    return preflight


def retry_key(parent: RunDir, config: Path | None, statuses: str | None, classification: str | None) -> str:
    """The identity of a `retry-failed` invocation: its parent, job file and filters."""
    arguments = {
        "parent": normalized_path(parent.path),
        "config": normalized_path(config),
        "status": statuses,
        "classification": classification,
    }
    return invocation_key("retry-failed", arguments, stdin_sha256=None, idempotency_key=None)


def unfinished_child(parent: RunDir, key: str) -> RunDir | None:
    """The child the identical invocation made and did not finish (stopped, or crashed), or None."""
    child_id = last_run_id(parent.path.parent, key)
    child = None if child_id is None else run_by_id(parent.path.parent, child_id)
    if child is None or child.state.final or child.plan.parent_run != parent.run_id:
        return None
    return child


def child_to_continue(
    run_dir: Path, config: Path | None, statuses: str | None, classification: str | None
) -> RunDir | None:
    """The child the identical invocation will continue, read before a hand-off so that it can name it
    and its committed progress at once."""
    parent = RunDir.open(run_dir)
    return unfinished_child(parent, retry_key(parent, config, statuses, classification))


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
    held = probe_lock(parent.path / LOCK)
    if held is None:  # another user's run: waiting would not help (status calls a final one finished)
        raise parent.lock_not_ours("not readable by this user, or not a lock file")
    parent.refuse_if_not_ours()  # readable, but theirs: its child is made in their runs directory
    if held:
        raise RunLocked(
            f"run {parent.run_id} is still running: {parent.path}", context={"run_dir": str(parent.path)}
        )
    check_committed_journal(parent, "retry-failed")
    key = retry_key(parent, config, statuses, classification)
    preflight = _parent_preflight(parent, config, options.rows_read, unfinished_child(parent, key))
    refuse_workers_flag(preflight.job.config, options.workers)
    shared = shared_slot(preflight.job.config)
    with live_slot(parent.path.parent, preflight.job.path, shard_of_run(parent), shared=shared) as slot:
        refuse_superseded(parent, preflight)  # its failed rows' content is older than that run's
        warnings: list[EnvelopeWarning] = []
        child = unfinished_child(parent, key)
        if child is not None:
            try:
                verify_unchanged(child, preflight)
            except (InputChanged, ConfigChanged) as changed:
                warnings.append(_discarded(child, changed))
                options.announce_warnings(warnings)
            else:
                reporter = progress.for_stderr(options.quiet)
                return _of_parent(continue_run(child, preflight, options, reporter, slot=slot), parent)
        result = _new_child(parent, preflight, options, slot, (key, statuses, classification))
    result.warnings[:0] = warnings
    return _of_parent(result, parent)


def _new_child(
    parent: RunDir,
    preflight: Preflight,
    options: RunOptions,
    slot: LiveSlot,
    call: tuple[str, str | None, str | None],
) -> Result:
    key, statuses, classification = call
    selection = failed_rows(parent, preflight.record_count, parse_statuses(statuses), classification)
    if not len(selection):
        return Result(data=NothingToRetry(parent.run_id))
    plan = replace(
        plan_for(preflight),
        parent_run=parent.run_id,
        input_explicit=True,
        invocation=Invocation(key, None),
        retry_filter=RetryFilter(statuses, classification),
        shard=parent.plan.shard,  # a shard's failed rows: the child is of the same shard
        # a deletion run's failed deletions: the child deletes too, and its successes leave the state
        mirror_deletes=parent.plan.mirror_deletes,
        mirror_of=parent.plan.mirror_of,
        delivery_run=parent.plan.delivery(parent.run_id),  # the parent's rows: their keys stay its
    )

    def prepare(child: RunDir) -> None:
        _prepare_child(child, selection, preflight.job)
        remember(parent.path.parent, key, child.run_id)  # last: the index names only whole runs

    result = start_fresh(
        preflight,
        parent.path.parent,
        options,
        progress.for_stderr(options.quiet),
        slot=slot,
        plan=plan,
        prepare=prepare,
        start=StartPoint(done_rows=selection.complement(), total=len(selection)),
    )
    if preflight.batcher is not None or preflight.bulk is not None:
        result.warnings.extend(_unread_answers_resent(parent, selection))
    return result


def _of_parent(result: Result, parent: RunDir) -> Result:
    if isinstance(result.data, RunResult):
        result.data = replace(result.data, parent_run=parent.run_id)
    return result


def _unread_answers_resent(parent: RunDir, selection: RowSet) -> list[EnvelopeWarning]:
    """A batch whose answer could not be read, or a bulk job whose results did not fit its rows, is never
    sent again without saying so: its rows may have been applied (docs/batching.md, docs/bulk-jobs.md)."""
    rows = sum(
        1
        for entry in read_journal(parent.journal_path)
        if entry.classification == BATCH_ANSWER_INVALID and entry.row_number in selection
    )
    if not rows:
        return []
    message = (
        f"{rows} rows sent again had an answer that could not be read (a batch's, or a bulk job's "
        "results): the target may have applied them, and applies them again unless it dedups by item id"
    )
    return [EnvelopeWarning("ANSWER_UNREAD_RESENT", message, {"rows": rows, "parent_run": parent.run_id})]


def _discarded(child: RunDir, changed: InputChanged | ConfigChanged) -> EnvelopeWarning:
    return EnvelopeWarning(
        "CHECKPOINT_DISCARDED",
        f"{changed.message}; a new child run retries the parent's failed rows",
        {"previous_run": child.run_id, "reason": changed.code},
    )
