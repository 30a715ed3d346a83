"""The commands that read run directories: `status` and `runs`, and a run's committed progress."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import BulkRelayError
from bulkrelay.ops.results import (
    RunRow,
    RunsResult,
    StatusResult,
)
from bulkrelay.relay.progress import Snapshot
from bulkrelay.store.atomic import read_json
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.rundir import (
    ALPHA,
    CHECKPOINT,
    LOCK,
    SUMMARY,
    AlphaRun,
    RunDir,
    RunState,
    epoch,
    probe_lock,
)
from bulkrelay.store.runs import survey
from bulkrelay.store.selection import load_selection
from bulkrelay.store.summary import summarized_outcomes

REPORT = "report.html"  # the run report's file in the run directory (ops/report.py writes it)


def committed_progress(run: RunDir) -> Snapshot:
    """What the checkpoint says is durably done, or for a run that completed or was cancelled (and
    keeps no checkpoint) its summary; a retry-failed run counts only its selected rows."""
    checkpoint = read_checkpoint(run.path)
    record_count = run.plan.input.record_count
    selection = load_selection(run.path, record_count)
    if checkpoint is not None:
        ok, failed = checkpoint.ok, checkpoint.failed
    else:
        final = run.state.final
        counted = summarized_outcomes(run.path, required=run.state.every_row_ended) if final else None
        ok, failed = counted or (0, 0)
    return Snapshot(
        total=len(selection) if selection is not None else record_count,
        done=ok + failed,
        ok=ok,
        failed=failed,
    )


LIVE = "live"
CRASHED = "crashed \u2014 resumable"
RESUMABLE = "stopped \u2014 resumable"
FINISHED = "finished"
# How `runs` lists a run whose run.json says `running` while nobody holds its lock: its process died
# (kill -9, out of memory, a lost job's worker). It is resumable; it is not running.
INTERRUPTED = "interrupted"


def liveness(run: RunDir) -> str:
    """Whether a process works on the run now, judged by its lock (the OS drops it when the holder
    dies), not by the manifest's state, which a killed process leaves at `running`. A lock this user
    cannot probe (another user's run) is taken as held, unless the run has ended for good: no process
    works on a final run again, and an operator watching another user's runs sees them finished."""
    held = probe_lock(run.path / LOCK)
    if held or (held is None and not run.state.final):
        return LIVE
    if run.state is RunState.RUNNING:
        return CRASHED
    return RESUMABLE if run.state.resumable else FINISHED


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; it is someone else's
    return True


def _rate(run: RunDir, alive: str, summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """A live run's pace from its checkpoint; a finished call's from its summary."""
    if alive == LIVE:
        checkpoint = read_checkpoint(run.path)
        return checkpoint.live if checkpoint is not None else None
    this_call = (summary or {}).get("this_call")
    return {"rows_per_second": this_call["rows_per_second"]} if this_call else None


def status(run_dir: Path) -> Result:
    """One run's state, liveness, pace and counters, read without changing anything."""
    run = RunDir.open(run_dir)
    summary_path = run.path / SUMMARY
    summary = read_json(summary_path) if summary_path.exists() else None
    alive = liveness(run)
    pid = run.manifest.pid
    resumable = alive in (CRASHED, RESUMABLE)
    return Result(
        data=StatusResult(
            run_id=run.run_id,
            run_dir=str(run.path),
            state=run.state,
            live=alive == LIVE,
            liveness=alive,
            pid=pid if alive == LIVE and _pid_alive(pid) else None,
            stop_reason=run.manifest.stop_reason,
            created_at=run.manifest.created_at,
            updated_at=run.manifest.updated_at,
            parent_run=run.plan.parent_run,
            progress=committed_progress(run),
            rate=_rate(run, alive, summary),
            latency_ms=_known_latency(summary),
            summary=summary,
            # a delta run: its mode, rows selected and rows skipped unchanged
            sync=run.plan.sync.to_json() if run.plan.sync is not None else None,
            lookups=run.plan.lookups,  # each frozen map's sha256 and entries
            continue_command=f"bulkrelay resume {shlex.quote(str(run.path))}" if resumable else None,
            report=str(report) if (report := run.path / REPORT).is_file() else None,
        )
    )


def _known_latency(summary: dict[str, Any] | None) -> dict[str, float]:
    """Latency percentiles that exist: none before the first committed row, never a `null`."""
    latency = (summary or {}).get("latency_ms") or {}
    return {name: value for name, value in latency.items() if value is not None}


def _alpha_progress(run: AlphaRun) -> tuple[int, int | None, int]:
    """Done, total and failed rows of a public alpha run, from its own `checkpoint.json`
    (`processed`, `failed`); its manifest may not know the total."""
    path = run.path / CHECKPOINT
    checkpoint = read_json(path) if path.is_file() else {}
    return checkpoint.get("processed", 0), run.manifest.input_total, checkpoint.get("failed", 0)


def runs(runs_dir: Path) -> Result:
    """A table of runs; one whose files cannot be read is left out with a warning naming it."""
    table: list[RunRow] = []
    listed, unreadable = survey(runs_dir)
    warnings = [_unreadable_run(damaged.path, damaged.reason) for damaged in unreadable]
    for run in listed:
        try:
            table.append(_run_row(run))
        except (BulkRelayError, KeyError, TypeError, ValueError) as exc:  # its checkpoint or selection
            reason = exc.message if isinstance(exc, BulkRelayError) else f"{type(exc).__name__}: {exc}"
            warnings.append(_unreadable_run(run.path, reason))
    return Result(data=RunsResult(str(runs_dir), tuple(table)), warnings=warnings)


def _run_row(run: RunDir | AlphaRun) -> RunRow:
    ended = None
    if isinstance(run, AlphaRun):
        done, total, failed = _alpha_progress(run)
        state, name = ALPHA, run.manifest.name
    else:
        progress = committed_progress(run)
        done, total, failed = progress.done, progress.total, progress.failed
        state, name = run.state, run.plan.name
        if liveness(run) == CRASHED:
            state = INTERRUPTED
        elif run.state != RunState.RUNNING:  # run.json was last written when the run ended
            ended = run.manifest.updated_at
    return RunRow(
        ended_at=ended,
        duration_seconds=_seconds_between(run.manifest.created_at, ended),
        run_id=run.run_id,
        state=state,
        format=run.format,
        name=name,
        created_at=run.manifest.created_at,
        done=done,
        total=total,
        failed=failed,
        run_dir=str(run.path),
    )


def _seconds_between(started: str | None, ended: str | None) -> float | None:
    begin, end = epoch(started), epoch(ended)
    return None if begin is None or end is None else round(max(end - begin, 0.0), 3)


def _unreadable_run(run_dir: Path, reason: str) -> EnvelopeWarning:
    return EnvelopeWarning(
        "RUN_UNREADABLE",
        f"skipped {run_dir}: its run files are damaged or cannot be read ({reason})",
        {"run_dir": str(run_dir), "reason": reason},
    )
