"""A job's nights: its runs in one runs directory, each read from its two small files (`run.json` and
`summary.json`, never the journal), oldest first; and whether a night's numbers are usual for the job.

A night is a run of the job (same name): a `retry-failed` run or a mirror job's deletion run belongs to
its night and is left out. A run whose files cannot be read is left out too (`bulkrelay runs` names it).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from bulkrelay.errors import BulkRelayError
from bulkrelay.store.atomic import read_json
from bulkrelay.store.manifest import RunState
from bulkrelay.store.rundir import SUMMARY, RunDir, epoch
from bulkrelay.store.runs import survey

USUAL_NIGHTS = 14  # the nights before this one that say what is usual
LEAST_NIGHTS = 2  # fewer than this before it: nothing is called unusual yet
HIGH, LOW = 1.5, 0.5  # outside [LOW x the least, HIGH x the most] of those nights: unusual


@dataclass(frozen=True)
class Night:
    run_id: str
    path: Path
    name: str
    state: str
    stop_reason: str | None
    started: float | None
    ended: float | None
    rows_total: int
    rows_done: int
    failed: int
    skipped: int
    by_classification: dict[str, int] = field(default_factory=dict)

    @property
    def duration(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return max(self.ended - self.started, 0.0)

    @property
    def rate(self) -> float | None:
        seconds = self.duration
        return self.rows_done / seconds if seconds else None

    @property
    def halted(self) -> bool:
        return (self.stop_reason or "").startswith("halt")

    @property
    def bad(self) -> bool:
        """A night someone should look at: rows failed, or it did not finish."""
        return self.failed > 0 or self.state not in (RunState.COMPLETED, RunState.RUNNING)


def job_name(run: RunDir) -> str:
    return run.plan.name or Path(run.plan.job_path).stem


def night_of(run: RunDir) -> Night:
    summary: dict[str, object] = {}
    with contextlib.suppress(BulkRelayError, OSError):
        read = read_json(run.path / SUMMARY)
        summary = read if isinstance(read, dict) else {}
    outcome = summary.get("by_outcome")
    failed = outcome.get("failed") if isinstance(outcome, dict) else None
    classes = summary.get("by_classification")
    skipped = summary.get("skipped_unchanged")
    done = summary.get("rows_done")
    running = run.state == RunState.RUNNING
    return Night(
        run_id=run.run_id,
        path=run.path.absolute(),
        name=job_name(run),
        state=str(run.state),
        stop_reason=run.manifest.stop_reason,
        started=epoch(run.manifest.created_at),
        ended=None if running else epoch(run.manifest.updated_at),
        rows_total=run.plan.input.record_count,
        rows_done=done if isinstance(done, int) else 0,
        failed=failed if isinstance(failed, int) else 0,
        skipped=skipped if isinstance(skipped, int) else 0,
        by_classification={str(k): v for k, v in classes.items() if isinstance(v, int)}
        if isinstance(classes, dict)
        else {},
    )


def nights_of(runs_dir: Path, name: str) -> list[Night]:
    """Every night of job `name` in `runs_dir`, oldest first."""
    nights = []
    runs, _ = survey(runs_dir)  # a run that cannot be read is no night of the job's
    for run in runs:
        if not isinstance(run, RunDir) or run.plan.parent_run or run.plan.mirror_deletes:
            continue
        with contextlib.suppress(BulkRelayError, OSError):
            if job_name(run) == name:
                nights.append(night_of(run))
    nights.sort(key=lambda night: (night.started or 0.0, night.run_id))
    return nights


@dataclass(frozen=True)
class Comparison:
    """One measure of a night against the nights before it."""

    measure: str  # rows, failures, duration
    value: float
    least: float
    most: float
    nights: int
    unusual: bool


def compare(night: Night, before: list[Night]) -> list[Comparison]:
    """This night's rows, failures and duration against the (at most USUAL_NIGHTS) finished nights before
    it; empty when there are fewer than LEAST_NIGHTS of them."""
    earlier = [n for n in before if n.ended is not None and n.run_id != night.run_id][-USUAL_NIGHTS:]
    if len(earlier) < LEAST_NIGHTS:
        return []
    measures: list[tuple[str, float | None, list[float]]] = [
        ("rows", night.rows_done, [n.rows_done for n in earlier]),
        ("failures", night.failed, [n.failed for n in earlier]),
        ("duration", night.duration, [n.duration for n in earlier if n.duration is not None]),
    ]
    found = []
    for measure, value, values in measures:
        if value is None or not values:
            continue
        least, most = min(values), max(values)
        # fewer failures than usual is no news; more rows, fewer rows, a longer or shorter night is
        unusual = value > most * HIGH or (measure != "failures" and value < least * LOW)
        found.append(Comparison(measure, value, least, most, len(values), unusual))
    return found
