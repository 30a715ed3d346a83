"""Continuing a run: fail closed on any change, recover the journal, send only what is not done.

The order matters: preflight again (nothing may have changed), take the lock, then read the
journal (no other process may be appending to it), then relay the rows without a committed
final result.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bulkrelay.envelope import EnvelopeWarning
from bulkrelay.errors import ConfigChanged, InputChanged, NotFound, RunNotResumable
from bulkrelay.job.config import JobConfig, config_semantic_dict, load_job
from bulkrelay.job.fingerprint import canonical_sha256
from bulkrelay.job.preflight import Preflight, RowsRead, run_preflight
from bulkrelay.ops.damage import scanned_journal
from bulkrelay.ops.lookups import frozen_lookups, with_lookups
from bulkrelay.relay.engine import StartPoint
from bulkrelay.store.journal import recover_torn_tail
from bulkrelay.store.rundir import RunDir, RunState
from bulkrelay.store.selection import load_selection
from bulkrelay.sync import job_of_run

_INPUT_FIELDS = ("format", "gzip", "sha256", "size", "record_count")


def check_resumable(run: RunDir) -> None:
    if run.state.final:
        raise RunNotResumable(
            f"run {run.run_id} is {run.state}; only stopped, forced or crashed runs can be resumed",
            context={"run_dir": str(run.path), "state": run.state},
            suggestion=(
                f"bulkrelay retry-failed {run.path}"
                if run.state is RunState.COMPLETED_WITH_FAILURES
                else "start a new run with `bulkrelay run`"
            ),
        )


def job_path_for(run: RunDir, config_override: Path | None) -> Path:
    path = config_override or Path(run.plan.job_path)
    if not path.is_file():
        raise NotFound(
            f"job file {path} not found",
            context={"run_dir": str(run.path), "job": str(path)},
            suggestion="pass the job file's new location with --config",
        )
    return path


def input_path_for(run: RunDir, input_override: Path | None) -> Path | None:
    """`--input`, else the file the run was started with when it was given explicitly, else the job's."""
    if input_override is not None:
        return input_override
    if run.plan.input_explicit:
        return Path(run.plan.input.path)
    return None


def input_differences(recorded: dict[str, Any], current: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: {"recorded": recorded.get(name), "now": current.get(name)}
        for name in _INPUT_FIELDS
        if recorded.get(name) != current.get(name)
    }


def verify_unchanged(run: RunDir, preflight: Preflight) -> None:
    """Refuse, naming old and new values, when the input or the job's meaning changed."""
    changed = input_differences(run.plan.input.fingerprint(), preflight.input_fingerprint.to_dict())
    if run.plan.input.source != preflight.input_spec.source:  # a query's database: another one now
        changed["source"] = {"recorded": run.plan.input.source, "now": preflight.input_spec.source}
    if changed:
        what = ", ".join(f"{k} {v['recorded']!r} -> {v['now']!r}" for k, v in changed.items())
        raise InputChanged(
            f"the input changed since run {run.run_id} started: {what}",
            context={"run_dir": str(run.path), "changed": changed},
            suggestion="restore the original input, or start a new run",
        )
    recorded = run.plan.config_sha256
    if recorded != preflight.config_fingerprint:
        sections = changed_sections(run.plan.config_sections, preflight.job.config)
        where = f" in {', '.join(sections)}" if sections else ""
        raise ConfigChanged(
            f"the job's semantic configuration changed{where} since run {run.run_id} started "
            f"(sha256 {recorded[:12]} -> {preflight.config_fingerprint[:12]})",
            context={
                "run_dir": str(run.path),
                "recorded": recorded,
                "now": preflight.config_fingerprint,
                "changed": sections,
            },
            suggestion="restore the original job file, or start a new run",
        )


def config_sections(config: JobConfig) -> dict[str, str]:
    """A short digest per setting (`request.url`, `retry.max_attempts`, ...) of the semantic config,
    kept in the manifest so a refusal can say which settings changed without storing their values."""
    digests: dict[str, str] = {}
    for section, value in config_semantic_dict(config).items():
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for name, setting in items:
            digests[section if name is None else f"{section}.{name}"] = canonical_sha256(setting)[:16]
    return digests


def changed_sections(recorded: Mapping[str, str] | None, config: JobConfig) -> list[str]:
    if not recorded:
        return []
    now = config_sections(config)
    return sorted(name for name in recorded.keys() | now.keys() if recorded.get(name) != now.get(name))


def require_input(run: RunDir, path: Path | None, *, given: bool) -> None:
    """A missing input is NOT_FOUND naming where the run's input was and how to point at its new place."""
    if path is None or path.exists():
        return
    recorded = run.plan.input.path
    if given:
        message = f"--input {path} not found (the input of run {run.run_id} was {recorded})"
    else:
        elsewhere = "" if str(path) == recorded else f"; looked for it at {path}"
        message = f"the input of run {run.run_id} is no longer at {recorded}{elsewhere}"
    raise NotFound(
        message,
        context={"run_dir": str(run.path), "input": str(path), "recorded_input": recorded},
        suggestion=(
            "if the input moved with its bytes unchanged, pass its new location: "
            f"bulkrelay resume {shlex.quote(str(run.path))} --input NEW_PATH"
        ),
    )


def preflight_for_resume(
    run: RunDir,
    config_override: Path | None,
    input_override: Path | None,
    on_rows_read: RowsRead | None = None,
) -> Preflight:
    check_resumable(run)
    job = job_of_run(run, load_job(job_path_for(run, config_override)))
    if job.config.lookups:  # the maps the run froze when it started: never built again
        job = with_lookups(job, frozen_lookups(job, run))
    input_path = input_path_for(run, input_override)
    require_input(run, input_path or job.input_path, given=input_override is not None)
    # A snapshot's source (a query's database, a Parquet file's bytes) as the run recorded it: resume
    # reads the snapshot, never its source (a query job names its database again, and it must agree).
    source = run.plan.input.source if input_override is None else None
    preflight = run_preflight(job, input_path, on_rows_read=on_rows_read, source=source)
    verify_unchanged(run, preflight)
    return preflight


def recover_start(run: RunDir, record_count: int) -> tuple[StartPoint, list[EnvelopeWarning]]:
    """Validate the journal against the checkpoint; cut a torn tail; rebuild the set of done rows.

    Call with the run's lock held.
    """
    scan = scanned_journal(run, record_count, "resume")
    warnings: list[EnvelopeWarning] = []
    aside = recover_torn_tail(run.journal_path, scan, run.storage)
    if aside is not None:
        warnings.append(
            EnvelopeWarning(
                "JOURNAL_TAIL_TRUNCATED",
                "the journal ended in an incomplete batch (a crash mid-write); it was moved aside and cut",
                {"moved_to": str(aside), "kept_bytes": scan.valid_end},
            )
        )
    done, total = scan.done, None
    selection = load_selection(run.path, record_count)
    if selection is not None:  # a retry-failed run: every row outside its selection counts as done
        done, total = done.union(selection.complement()), len(selection)
    start = StartPoint(
        next_seq=scan.last_seq + 1,
        offset=scan.valid_end,
        ok=scan.ok,
        failed=scan.failed,
        done_rows=done,
        total=total,
        journal=scan.writer_state(),
        journaled_through=scan.done.highest(),
    )
    return start, warnings
