"""How `run` and `resume` find their run: a fresh one, the identical invocation's unfinished one,
or the run directory named on the command line."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import ConfigChanged, ExitCode, InputChanged, RunSuperseded
from bulkrelay.job.config import Job
from bulkrelay.job.fingerprint import config_fingerprint, file_sha256
from bulkrelay.job.inputs import STDIN_NAME, abandoned_spools, let_go_of_spool
from bulkrelay.job.preflight import Preflight, run_preflight
from bulkrelay.ops.invocation import invocation_key, last_run_id, normalized_path, remember
from bulkrelay.ops.lifecycle import RunOptions, continue_run, plan_for, refuse_workers_flag, start_fresh
from bulkrelay.ops.lookups import (
    built_lookups,
    discard_frozen,
    freeze_all,
    frozen_lookups,
    has_frozen,
    keep_frozen,
    with_lookups,
)
from bulkrelay.ops.results import MirrorDeletions, RunResult
from bulkrelay.ops.resultsink import sink_target
from bulkrelay.ops.resume import check_resumable, preflight_for_resume, verify_unchanged
from bulkrelay.ops.rowchoice import ChosenRows, RowChoice
from bulkrelay.ops.sharding import ShardSpec, shard_of_run
from bulkrelay.ops.snapshot import (
    is_query_job,
    parquet_input,
    reusable_parquet,
    reusable_snapshot,
    take_parquet,
    take_snapshot,
)
from bulkrelay.relay import progress
from bulkrelay.relay.engine import StartPoint
from bulkrelay.relay.progress import Reporter
from bulkrelay.store.atomic import move_file
from bulkrelay.store.liverun import LiveSlot, live_slot
from bulkrelay.store.manifest import Invocation, ShardRecord
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.runs import run_by_id
from bulkrelay.store.selection import save_selection
from bulkrelay.sync import (
    LineScanFailed,
    deletion_job,
    discard,
    gone_keys,
    open_night,
    overtaken_by,
    refuse_superseded,
    shared_slot,
    sync_manifest,
)


@dataclass(frozen=True)
class RunRequest:
    """A `bulkrelay run` invocation, normalized."""

    job: Job
    input_path: Path | None  # a spooled copy when the records came from stdin
    from_stdin: bool
    runs_dir: Path
    idempotency_key: str | None
    options: RunOptions
    full: bool = False  # `--full`: a delta job sends every row once and refreshes its sync state
    shard: ShardSpec | None = None  # --shard K/N: only the rows this shard owns
    snapshot: bool = False  # input_path is the snapshot (of the query, the Parquet file) this call took
    # A Parquet input read through its snapshot: the file named (None: the job's), the snapshot's source.
    parquet: tuple[Path | None, str] | None = None
    frozen_lookups: Path | None = None  # the `lookups:` maps this call built, frozen, for the run it starts

    @property
    def spooled(self) -> bool:
        """The input is this call's own copy (stdin, a query's snapshot): a run it starts takes it."""
        return (self.from_stdin or self.snapshot) and self.input_path is not None

    def key(self) -> str:
        """The invocation's identity; computable before preflight, so a job can be attached to at once."""
        arguments = {
            "job": normalized_path(self.job.path),
            "input": "-" if self.from_stdin else self._input_argument(),
            "runs_dir": normalized_path(self.runs_dir),
        }
        if self.full:  # only when given, so the keys of earlier invocations stay what they were
            arguments["full"] = "true"
        if self.shard is not None:
            arguments["shard"] = str(self.shard)
        stdin_sha256 = None
        if self.from_stdin and self.input_path is not None:
            stdin_sha256 = file_sha256(self.input_path)
        return invocation_key(
            "run", arguments, stdin_sha256=stdin_sha256, idempotency_key=self.idempotency_key
        )

    def _input_argument(self) -> str | None:
        """A query job's input is its query, whichever snapshot of it the call reads."""
        if is_query_job(self.job):
            return "query"
        return normalized_path(self.parquet[0] if self.parquet is not None else self.input_path)


def run(request: RunRequest, reporter: Reporter | None = None) -> Result:
    """Preflight, then continue the identical invocation's unfinished run or start a new one;
    then, for a `sync: mirror` job, send the deletions.

    Deciding which run, and claiming it, happens inside the job's live slot: while a run of the job
    is alive, a second caller gets RUN_LOCKED naming it, whatever its input, and never relays beside it."""
    reporter = reporter or progress.for_stderr(request.options.quiet)
    deletions = None
    sink_target(request.job)  # a results.to that cannot be resolved refuses before anything starts
    refuse_workers_flag(request.job.config, request.options.workers)
    try:
        if is_query_job(request.job):
            request = _query_input(request)
        elif (parquet := parquet_input(request.job, request.input_path)) is not None:
            request = _parquet_input(request, parquet)
        if request.job.config.lookups:
            request = _lookups_input(request)
        preflight, chosen, deletions = _preflight(request)
        result = _run_in_slot(request, preflight, chosen, reporter)
        if deletions is not None:
            result = _send_deletions(request, result, deletions)
    finally:
        discard(deletions[0] if deletions is not None else None)
        discard_frozen(request.frozen_lookups)  # moved into its run, or no run took it
        if request.spooled and request.input_path is not None:
            request.input_path.unlink(missing_ok=True)  # moved into its run, or no run took it
    abandoned_spools(request.runs_dir / ".spool", remove=True)  # left by runs killed mid-snapshot
    let_go_of_spool(request.runs_dir / ".spool")
    return result


def _reads_own_snapshot(request: RunRequest, previous: RunDir) -> bool:
    """A query's or Parquet file's re-run reading the unfinished run's own snapshot."""
    derived = is_query_job(request.job) or request.parquet is not None
    return derived and request.input_path is not None and request.input_path.parent == previous.path


def _query_input(request: RunRequest) -> RunRequest:
    """A query job reads the snapshot of its identical invocation's unfinished run, never querying
    again; else (no such run, or it completed) a snapshot taken now."""
    kept = reusable_snapshot(request.job, _unfinished_run(request.runs_dir, request.key()))
    if kept is not None:
        return replace(request, input_path=kept)
    spool = take_snapshot(request.job, request.runs_dir / ".spool", request.options.rows_read)
    return replace(request, input_path=spool, snapshot=True)


def _lookups_input(request: RunRequest) -> RunRequest:
    """The job's lookup maps: the unfinished identical run's frozen ones (never built again), else
    built now and frozen for the run this call starts."""
    job = request.job
    previous = _unfinished_run(request.runs_dir, request.key())
    if (
        previous is not None
        and previous.plan.config_sha256 == config_fingerprint(job.config)
        and has_frozen(previous)
    ):
        return replace(request, job=with_lookups(job, frozen_lookups(job, previous)))
    maps = built_lookups(job, request.runs_dir)
    frozen = freeze_all(maps, request.runs_dir / ".spool")
    return replace(request, job=with_lookups(job, maps), frozen_lookups=frozen)


def _parquet_input(request: RunRequest, parquet: Path) -> RunRequest:
    """A Parquet input is read through a JSON Lines snapshot, as a query is: the unfinished run's own
    while the file's bytes are the ones it read, else one taken now."""
    previous = _unfinished_run(request.runs_dir, request.key())
    kept, source = reusable_parquet(request.job, previous, parquet)
    named = (request.input_path, source)
    if kept is not None:
        return replace(request, input_path=kept, parquet=named)
    spool, source = take_parquet(parquet, request.runs_dir / ".spool", request.options.rows_read)
    return replace(request, input_path=spool, snapshot=True, parquet=(request.input_path, source))


def _run_in_slot(request: RunRequest, preflight: Preflight, chosen: ChosenRows, reporter: Reporter) -> Result:
    key = request.key()
    shard = None if request.shard is None else str(request.shard)
    with live_slot(request.runs_dir, request.job.path, shard, shared=shared_slot(request.job.config)) as slot:
        previous = _unfinished_run(request.runs_dir, key)
        warnings: list[EnvelopeWarning] = []
        if previous is not None:
            try:
                verify_unchanged(previous, preflight)
                if (overtaken := overtaken_by(previous, preflight)) is not None:
                    raise overtaken
            except (InputChanged, ConfigChanged, RunSuperseded) as changed:
                if not isinstance(changed, RunSuperseded) and _reads_own_snapshot(request, previous):
                    raise  # the run's own snapshot changed: no fresh run reads it
                warnings.append(_discarded(previous, changed))
                request.options.announce_warnings(warnings)  # a hand-off from here on carries it
            else:
                if request.spooled and request.input_path is not None:
                    # The run keeps its own copy of the same bytes: this one, which preflight just read
                    # and the relay must read again (the old copy is another file).
                    kept = Path(previous.plan.input.path)
                    move_file(request.input_path, kept, previous.storage)
                    preflight = preflight.kept_at(kept)
                return continue_run(previous, preflight, request.options, reporter, slot=slot)
        result = _start_fresh(request, preflight, chosen, reporter, slot=slot, key=key)
    result.warnings[:0] = warnings
    return result


def _start_fresh(
    request: RunRequest,
    preflight: Preflight,
    chosen: ChosenRows,
    reporter: Reporter,
    *,
    slot: LiveSlot,
    key: str,
) -> Result:
    """A new run, limited to its rows (a delta run's changed rows, a shard's own) by the selection
    retry-failed uses too; every row outside it counts as done from the start. Where preflight kept
    the selected rows' positions, the relay reads just those rows."""
    plan = replace(
        plan_for(preflight),
        invocation=Invocation(key, request.idempotency_key),
        input_explicit=request.input_path is not None,
    )
    selection = chosen.selection
    if request.shard is not None:
        plan = replace(plan, shard=ShardRecord(request.shard.index, request.shard.count))
    if preflight.digester is not None:
        rows_for = preflight.record_count if chosen.owned is None else chosen.owned
        sync = sync_manifest(request.job, chosen.delta_rows, chosen.selection, rows_for)
        plan = replace(plan, sync=sync)
    start = StartPoint()
    if selection is not None:
        start = StartPoint(done_rows=selection.complement(), total=len(selection), positions=chosen.positions)

    def prepare(run: RunDir) -> None:
        if selection is not None:
            save_selection(run.path, selection, run.storage)
        if request.job.config.lookups:  # the maps this run reads, frozen in it
            keep_frozen(request.frozen_lookups or freeze_all(request.job.lookups, run.path), run)
        remember(request.runs_dir, key, run.run_id)  # last: the index names only whole runs

    return start_fresh(
        preflight,
        request.runs_dir,
        request.options,
        reporter,
        slot=slot,
        plan=plan,
        spooled=request.spooled,
        prepare=prepare,
        start=start,
    )


def _preflight(request: RunRequest) -> tuple[Preflight, ChosenRows, tuple[Path, int] | None]:
    """Preflight, choosing in the same pass the rows a shard owns and a delta job's changed rows;
    for a mirror job also the keys gone from the input (spooled, checked against `mirror.max_deletes`).

    A delta run's line scan (sync/linescan.py) that fails after preflight took rows as unchanged on
    its word leaves the choice unproven: preflight reads the input again, choosing the full way."""
    try:
        return _preflight_once(request, scan_lines=True)
    except LineScanFailed:
        return _preflight_once(request, scan_lines=False)


def _preflight_once(
    request: RunRequest, *, scan_lines: bool
) -> tuple[Preflight, ChosenRows, tuple[Path, int] | None]:
    input_name = STDIN_NAME if request.from_stdin else None
    source = None
    if request.parquet is not None:
        given, source = request.parquet
        input_name = str(given or request.job.input_path)
    sharded = request.shard is not None
    delta = open_night(
        request.job, request.runs_dir, full=request.full, sharded=sharded, scan_lines=scan_lines
    )
    group = (
        request.job.config.request.group
    )  # a grouped job's shards own whole groups (docs/configuration.md)
    choice = RowChoice(delta, request.shard, request.job.config.input.key if group is None else group.by)
    try:
        preflight = run_preflight(
            request.job,
            request.input_path,
            on_rows_read=request.options.rows_read,
            input_name=input_name,
            source=source,
            choose=choice.chooser(),
        )
        chosen = choice.chosen(preflight.input_fingerprint)
        return preflight, chosen, gone_keys(delta, request.job, request.runs_dir / ".spool")
    finally:
        if delta is not None:
            delta.close()


def _send_deletions(request: RunRequest, night: Result, deletions: tuple[Path, int]) -> Result:
    """After the night's run has finished (all rows with a final result), a run of the deletions."""
    path, count = deletions
    assert isinstance(night.data, RunResult)  # a run that returned (failures raise) says how it ended
    if night.exit_code not in (ExitCode.SUCCESS, ExitCode.PARTIAL_FAILURE):
        unsent = MirrorDeletions(count, reason="the run did not finish")
        night.data = replace(night.data, mirror=unsent)
        return night
    job = deletion_job(request.job)
    preflight = run_preflight(job, path)
    plan = replace(
        plan_for(preflight),
        mirror_deletes=True,
        mirror_of=night.data.run_id,
        input_explicit=True,
    )
    with live_slot(request.runs_dir, request.job.path, shared=shared_slot(request.job.config)) as slot:
        deleted = start_fresh(
            preflight,
            request.runs_dir,
            request.options,
            progress.for_stderr(request.options.quiet),
            slot=slot,
            plan=plan,
            spooled=True,
        )
    assert isinstance(deleted.data, RunResult)
    sent = MirrorDeletions(deleted.data.progress.total, run=deleted.data, after_run=night.data.run_id)
    night.data = replace(night.data, mirror=sent)
    if night.exit_code == ExitCode.SUCCESS and deleted.exit_code != ExitCode.SUCCESS:
        night.exit_code, night.error = deleted.exit_code, deleted.error
    night.warnings.extend(deleted.warnings)
    return night


def _discarded(previous: RunDir, changed: InputChanged | ConfigChanged | RunSuperseded) -> EnvelopeWarning:
    return EnvelopeWarning(
        "CHECKPOINT_DISCARDED",
        f"{changed.message}; started over",
        {"previous_run": previous.run_id, "reason": changed.code},
    )


def _unfinished_run(runs_dir: Path, key: str) -> RunDir | None:
    run_id = last_run_id(runs_dir, key)
    run = None if run_id is None else run_by_id(runs_dir, run_id)
    return None if run is None or run.state.final else run


def run_to_continue(request: RunRequest) -> RunDir | None:
    """The unfinished run the identical invocation will continue, judged before preflight by what is
    cheap to know (the job's semantic fingerprint, the input's size), so a hand-off can name it and its
    committed progress at once. Preflight has the last word: a run it finds changed is still discarded."""
    previous = _unfinished_run(request.runs_dir, request.key())
    if previous is None or previous.plan.config_sha256 != config_fingerprint(request.job.config):
        return None
    input_path = request.input_path or request.job.input_path
    try:
        size = None if input_path is None else input_path.stat().st_size
    except OSError:
        return None
    return previous if size == previous.plan.input.size else None


def resume(
    run_dir: Path,
    config: Path | None,
    input_path: Path | None,
    options: RunOptions,
    reporter: Reporter | None = None,
) -> Result:
    run = RunDir.open(run_dir)
    check_resumable(run)
    run.refuse_if_not_ours()
    options.announce_run(run)
    preflight = preflight_for_resume(run, config, input_path, on_rows_read=options.rows_read)
    refuse_workers_flag(preflight.job.config, options.workers)
    shared = shared_slot(preflight.job.config)
    with live_slot(run.path.parent, preflight.job.path, shard_of_run(run), shared=shared) as slot:
        run = RunDir.open(run_dir)  # as it is now: it may have ended while we preflighted
        check_resumable(run)
        refuse_superseded(run, preflight)
        return continue_run(
            run, preflight, options, reporter or progress.for_stderr(options.quiet), slot=slot
        )
