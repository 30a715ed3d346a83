"""`prune`: remove finished runs that a retention rule no longer keeps.

Safety first, like logrotate with a lock: a run is a candidate only when it is finished
(`completed`, `completed_with_failures`, `cancelled`) and no process holds its lock. A live run, a
resumable one (`running` — perhaps crashed —, `stopped`, `forced`), the newest run of each job, a run
whose files cannot be read, a run whose directory holds the input of a run that stays (a `retry-failed`
child reads its parent's copy of stdin or of a query), and a run a delta job's sync state still needs
(sync/needed_runs.py) are never removed. Runs are grouped by job (the job file's path in
`run.json`). A run is removed when every rule given says so: it is not among
the newest `keep` runs of its job (a mirror night's deletion run counts with its night), and it is
older than `older_than`. Each removal takes the run's
lock first, so a `resume` that starts meanwhile either wins the lock (the run is kept) or finds it gone.
The spool files of processes that ended without removing them (a run killed while it took its query's
snapshot) go too, whatever the rule: no run reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import BulkRelayError, RunLocked, UsageError
from bulkrelay.job.inputs import abandoned_spools
from bulkrelay.ops.results import PruneResult
from bulkrelay.ops.settings import Retention, load_settings
from bulkrelay.store.manifest import RunManifest
from bulkrelay.store.rundir import RunDir, is_locked
from bulkrelay.store.runs import survey
from bulkrelay.sync import runs_state_needs


@dataclass(frozen=True)
class _Candidate:
    run: RunDir
    job: str
    created: datetime


@dataclass
class PruneReport:
    removed: list[str]
    kept: int
    warnings: list[EnvelopeWarning]
    spools: tuple[tuple[Path, int], ...] = ()  # abandoned spool files removed (or, dry, that would go)

    def result(self, runs_dir: Path, retention: Retention, dry_run: bool) -> PruneResult:
        return PruneResult(
            runs_dir=str(runs_dir),
            dry_run=dry_run,
            keep=retention.keep,
            older_than=retention.older_than,
            removed=tuple(self.removed),
            kept=self.kept,
            spools_removed=tuple(path.name for path, _ in self.spools),
            spool_bytes=sum(size for _, size in self.spools),
        )


def _created(manifest: RunManifest) -> datetime:
    return datetime.strptime(manifest.created_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _read_runs(runs_dir: Path, warnings: list[EnvelopeWarning]) -> tuple[list[_Candidate], int]:
    """The runs prune may remove, and how many runs the directory holds: the alpha's and those that
    cannot be read stay, and count among the kept."""
    listed, unreadable = survey(runs_dir)
    for damaged in unreadable:
        warnings.append(
            EnvelopeWarning(
                "RUN_UNREADABLE",
                f"kept {damaged.path}: its run files cannot be read ({damaged.reason})",
                {"run_dir": str(damaged.path), "reason": damaged.reason},
            )
        )
    ours = [run for run in listed if isinstance(run, RunDir)]  # the alpha's runs are the alpha's to manage
    candidates = [_Candidate(run, run.plan.job_path, _created(run.manifest)) for run in ours]
    return candidates, len(listed) + len(unreadable)


def _doomed(runs: list[_Candidate], retention: Retention, now: datetime) -> list[_Candidate]:
    """The runs every given rule lets go, never the newest of a job nor an unfinished one."""
    by_job: dict[str, list[_Candidate]] = {}
    for candidate in runs:
        by_job.setdefault(candidate.job, []).append(candidate)
    age = retention.older_than_seconds
    doomed: list[_Candidate] = []
    keep = max(retention.keep or 1, 1)  # the newest run of a job always stays
    for group in by_job.values():
        for candidate in _beyond_keep(group, keep):
            if not candidate.run.state.final or is_locked(candidate.run.path):
                continue
            if age is not None and (now - candidate.created).total_seconds() <= age:
                continue
            doomed.append(candidate)
    return sorted(doomed, key=lambda c: c.run.run_id)


def _beyond_keep(group: list[_Candidate], keep: int) -> list[_Candidate]:
    """The runs of one job outside its newest `keep`. A mirror night is its run and the deletion run
    after it: `keep` counts nights, and a deletion run goes with its night (else `--keep 2` kept one
    night and a half)."""
    nights = sorted(
        (c for c in group if c.run.plan.mirror_of is None),
        key=lambda c: (c.created, c.run.run_id),
        reverse=True,
    )
    kept = {c.run.run_id for c in nights[:keep]}
    return nights[keep:] + [c for c in group if c.run.plan.mirror_of not in (None, *kept)]


def _remove(run: RunDir, warnings: list[EnvelopeWarning]) -> bool:
    """Delete a run under its own lock, re-checking its state there; False when it came alive, or
    when it could not be removed (a warning says why: the runs removed before it are still reported)."""
    try:
        with run.locked():
            current = RunDir.open(run.path)
            if not current.state.final:
                return False
            current.remove()
    except RunLocked:
        return False
    except (BulkRelayError, OSError) as exc:
        reason = exc.message if isinstance(exc, BulkRelayError) else str(exc)
        warnings.append(
            EnvelopeWarning(
                "PRUNE_FAILED",
                f"could not remove {run.path}: {reason}",
                {"run_dir": str(run.path), "reason": reason},
            )
        )
        return False
    return True


def _linked(run: RunDir, warnings: list[EnvelopeWarning]) -> bool:
    """A run directory that is a symbolic link is never removed: deleting the link frees nothing and
    deleting what it points at reaches outside the runs directory. Say so, and leave it to its owner."""
    if not run.path.is_symlink():
        return False
    warnings.append(
        EnvelopeWarning(
            "RUN_LINK_SKIPPED",
            f"kept {run.path}: it is a symbolic link (to {os.path.realpath(run.path)}); remove it by hand",
            {"run_dir": str(run.path), "target": os.path.realpath(run.path)},
        )
    )
    return True


def _kept_for_readers(runs: list[_Candidate], doomed: list[_Candidate]) -> list[_Candidate]:
    """`doomed` less the runs whose directory holds the input of a run that stays: a run fed from
    stdin or a query keeps its input there, and its `retry-failed` children read it there (to relay,
    resume and export). Such a run goes only together with every run that reads it."""
    going = {c.run.run_id for c in doomed}
    inputs = {c.run.run_id: Path(os.path.realpath(c.run.plan.input.path)) for c in runs}
    homes = {c.run.run_id: Path(os.path.realpath(c.run.path)) for c in doomed}
    changed = True
    while changed:
        read = [path for run_id, path in inputs.items() if run_id not in going]
        kept = {run_id for run_id in going if any(path.is_relative_to(homes[run_id]) for path in read)}
        going -= kept
        changed = bool(kept)
    return [c for c in doomed if c.run.run_id in going]


def _kept_for_state(
    runs_dir: Path, doomed: list[_Candidate], warnings: list[EnvelopeWarning]
) -> list[_Candidate]:
    """`doomed` less the runs a delta job's sync state needs, named in one warning."""
    needed = runs_state_needs(runs_dir, [c.run for c in doomed]) if doomed else set()
    kept = sorted(c.run.run_id for c in doomed if c.run.run_id in needed)
    if kept:
        warnings.append(
            EnvelopeWarning(
                "KEPT_FOR_SYNC_STATE",
                f"kept {len(kept)} run(s) the rule lets go: a delta job's sync state still names their "
                "deliveries, which `sync-state rebuild` reads from their journals",
                {"runs": kept},
            )
        )
    return [c for c in doomed if c.run.run_id not in needed]


def prune(runs_dir: Path, retention: Retention, *, dry_run: bool = False) -> PruneReport:
    """Remove (or, dry, list) the finished runs `retention` no longer keeps."""
    if not retention.active:
        raise UsageError(
            "prune needs a rule: --keep N, --older-than AGE, or retention in .bulkrelay/config.yaml",
            suggestion="bulkrelay prune --keep 14",
        )
    warnings: list[EnvelopeWarning] = []
    runs, present = _read_runs(runs_dir, warnings)
    removed: list[str] = []
    doomed = _kept_for_readers(runs, _doomed(runs, retention, datetime.now(UTC)))
    for candidate in _kept_for_state(runs_dir, doomed, warnings):
        if _linked(candidate.run, warnings):
            continue
        if dry_run or _remove(candidate.run, warnings):
            removed.append(candidate.run.run_id)
    spools = tuple(abandoned_spools(runs_dir / ".spool", remove=not dry_run))
    return PruneReport(removed, present - len(removed), warnings, spools)


def prune_command(runs_dir: Path, retention: Retention, *, dry_run: bool) -> Result:
    report = prune(runs_dir, retention, dry_run=dry_run)
    return Result(data=report.result(runs_dir, retention, dry_run), warnings=report.warnings)


def retention_after_run(runs_dir: Path, settings_file: Path | None = None) -> PruneReport:
    """`run`'s retention at its end, from `.bulkrelay/config.yaml`: it never fails the run; a bad
    settings file or a failed removal becomes a `PRUNE_FAILED` warning."""
    try:
        retention = load_settings(settings_file).retention
        if not retention.active:
            return PruneReport([], 0, [])
        return prune(runs_dir, retention)
    except (BulkRelayError, OSError) as exc:
        reason = exc.message if isinstance(exc, BulkRelayError) else str(exc)
        warning = EnvelopeWarning(
            "PRUNE_FAILED", f"retention could not prune {runs_dir}: {reason}", {"runs_dir": str(runs_dir)}
        )
        return PruneReport([], 0, [warning])
