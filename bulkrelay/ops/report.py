"""`report RUN [-o FILE]`: the run report, one self-contained HTML page (see `reportpage`).

Built from the run's own records, each streamed once (`reportdata`): the journal, the run log, the
summary and the manifest. It reads only, so it works on a live run too: the page is then a snapshot
of what is committed now. What the records cannot tell (a run of an earlier version without interval
lines, a journal shorter than its checkpoint) is said on the page, never guessed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from bulkrelay.envelope import Result, SideChannel, printable
from bulkrelay.errors import BulkRelayError, StorageFailed, UsageError
from bulkrelay.job.inputs.spec import PARQUET_SOURCE, shown_format
from bulkrelay.ops.results import ReportResult
from bulkrelay.ops.status import LIVE, REPORT, committed_progress, liveness
from bulkrelay.report.bulkjobs import bulk_job_rows
from bulkrelay.report.nights import Comparison, compare, job_name, night_of, nights_of
from bulkrelay.report.reportdata import (
    JournalTally,
    Timeline,
    read_timeline,
    requests_sent,
    tally_journal,
)
from bulkrelay.report.reportpage import Deletions, QueryInput, ReportFacts, page
from bulkrelay.store.atomic import file_to_replace, read_json, write_atomic
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.rundir import SUMMARY, RunDir, epoch, utc_now
from bulkrelay.store.selection import load_selection

STDOUT = "-"
# What to do instead when -o names a device, a FIFO, a socket or a directory (store.atomic.file_to_replace).
TO_STDOUT_INSTEAD = "write the page to stdout and redirect it there: -o - > PATH"


def report(run_dir: Path, output: Path | None = None) -> Result:
    """Write the run's report to `output` (default `report.html` in the run; `-`: the page alone is
    the answer's stdout payload, and the CLI sends the envelope to stderr)."""
    run = RunDir.open(run_dir)
    to_stdout = output is not None and str(output) == STDOUT
    target = run.path / REPORT if output is None else output
    written = (
        target
        if output is None or to_stdout
        else file_to_replace(output, named="-o", suggestion=TO_STDOUT_INSTEAD)
    )
    html, facts = build_report(run)
    if not to_stdout:
        _write(written, html.encode(), explicit=output is not None, run=run)
    data = ReportResult(
        run_id=run.run_id,
        run_dir=str(run.path),
        output=STDOUT if to_stdout else str(target),
        state=run.state,
        rows_done=facts[0],
        rows_total=facts[1],
        missing=facts[2],
    )
    return Result(data=data, side=SideChannel(stdout_payload=html if to_stdout else None))


def build_report(run: RunDir) -> tuple[str, tuple[int, int, tuple[str, ...]]]:
    """The page, and the rows done, rows total and what is missing (for the command's answer)."""
    tally = tally_journal(run.journal_path)
    timeline = read_timeline(run.path)
    facts = facts_of(run, tally, timeline)
    html = page(facts, tally, timeline, bulk_job_rows(run.journal_path))
    return html, (tally.done, facts.rows_total, facts.missing)


def facts_of(run: RunDir, tally: JournalTally, timeline: Timeline) -> ReportFacts:
    """What the page shows of the run besides the two tallies."""
    summary = _summary(run)
    alive = liveness(run)
    rows_total = _rows_total(run)
    last = timeline.calls[-1] if timeline.calls else None
    started = run.manifest.created_at
    ended = None if alive == LIVE or run.state == "running" else run.manifest.updated_at
    first, final = epoch(started), epoch(ended)
    return ReportFacts(
        run_id=run.run_id,
        run_dir=printable(str(run.path.absolute())),  # a Latin-1 directory name shown as \xe9
        name=job_name(run),
        job_path=run.plan.job_path,
        input_path=run.plan.input.path,
        input_format=shown_format(run.plan.input.format, run.plan.input.source)
        + (", gzip" if run.plan.input.gzip else ""),
        query=_query_of(run),
        state=str(run.state),
        liveness=alive,
        exit_code=last.exit_code if last is not None and alive != LIVE else None,
        started=started,
        ended=ended,
        duration_seconds=None if first is None or final is None else final - first,
        rows_total=rows_total,
        summary=summary,
        requests=requests_sent(summary),
        tool_version=run.manifest.tool_version,
        parent_run=run.plan.parent_run,
        generated_at=utc_now(),
        sync=run.plan.sync.to_json() if run.plan.sync is not None else None,
        deletions=_deletions(run, rows_total, tally.done),
        missing=tuple(_missing(run, tally, timeline, summary)),
        stop_reason=run.manifest.stop_reason,
        skipped=_skipped(summary),
        comparisons=tuple(_comparisons(run)),
    )


def _skipped(summary: dict[str, Any] | None) -> int:
    skipped = (summary or {}).get("skipped_unchanged")
    return skipped if isinstance(skipped, int) else 0


def _comparisons(run: RunDir) -> list[Comparison]:
    """This night against the job's nights before it in the same runs directory."""
    if run.plan.parent_run or run.plan.mirror_deletes:
        return []  # a retry or a deletion run is part of a night, not a night
    night = night_of(run)
    before = [n for n in nights_of(run.path.parent, night.name) if (n.started or 0) < (night.started or 0)]
    return compare(night, before)


def _query_of(run: RunDir) -> QueryInput | None:
    """A query run's query and database as run.json records them (None: the input is a file). A run of
    an earlier version may lack the text: its configuration fingerprint has `input.query`, a digest."""
    record = run.plan.input
    database = record.source if record.source and not record.source.startswith(PARQUET_SOURCE) else None
    if database is None and record.query is None and "input.query" not in (run.plan.config_sections or {}):
        return None
    return QueryInput(text=record.query, database=database)


def _summary(run: RunDir) -> dict[str, Any] | None:
    path = run.path / SUMMARY
    if not path.is_file():
        return None
    with contextlib.suppress(BulkRelayError):
        summary = read_json(path)
        return summary if isinstance(summary, dict) else None
    return None


def _rows_total(run: RunDir) -> int:
    """Rows this run is for: a retry-failed run's selection, else every record of the input."""
    record_count = run.plan.input.record_count
    selection = load_selection(run.path, record_count)
    return len(selection) if selection is not None else record_count


def _missing(
    run: RunDir, tally: JournalTally, timeline: Timeline, summary: dict[str, Any] | None
) -> list[str]:
    missing = []
    if not timeline.present:
        missing.append("run.log is absent: no time series, no events, no limits (a run of an early version)")
    else:
        if not timeline.intervals:
            missing.append(
                "run.log has no interval lines (a run of an earlier version): "
                "no throughput or outcomes over time"
            )
        unrecorded = [
            name
            for name, value in (
                ("the limits in force", timeline.limits),
                ("the transport", timeline.transport),
            )
            if value is None
        ]
        if unrecorded:  # the header says "not recorded" for each
            missing.append(f"run.log does not record {' or '.join(unrecorded)} (a run of an earlier version)")
    if timeline.unreadable_lines:
        missing.append(f"{timeline.unreadable_lines} lines of run.log could not be read and were skipped")
    query = _query_of(run)
    if query is not None and query.text is None:
        missing.append(
            "run.json does not record the query's text, only its digest (a run of an earlier version)"
        )
    if query is not None and query.database is None:
        missing.append("run.json does not record the query's database (a run of an earlier version)")
    checkpoint = read_checkpoint(run.path)  # of a live run, newer than the journal read before it
    if liveness(run) != LIVE and checkpoint is not None and checkpoint.rows_done > tally.done:
        missing.append(
            f"the journal holds {tally.done} committed rows, the checkpoint {checkpoint.rows_done}: "
            f"the journal is damaged; `bulkrelay resume {run.path}` says where"
        )
    if summary is None:
        missing.append("summary.json is absent (no call has ended yet): totals are counted from the journal")
    elif summary.get("rows_done") != tally.done:
        missing.append(
            f"summary.json counts {summary.get('rows_done')} rows, the journal {tally.done} now "
            "(a live run, or a call that did not end): the page shows the journal's"
        )
    return missing


def _deletions(run: RunDir, rows_total: int, done: int) -> Deletions | None:
    """A mirror job's deletions: this run sends them (a deletion run), or names the run that sent them."""
    plan = run.plan
    if plan.mirror_deletes:
        return Deletions(of_night=plan.mirror_of, deletes=rows_total, sent=done)
    if plan.sync is None or plan.sync.mode != "mirror":
        return None
    for sibling in sorted(run.path.parent.iterdir()):
        manifest = sibling / "run.json"
        if sibling == run.path or not manifest.is_file():
            continue
        with contextlib.suppress(BulkRelayError, OSError):
            other = RunDir.open(sibling)
            if other.plan.mirror_of == run.run_id:
                done = committed_progress(other).done  # a finished run keeps its summary, no checkpoint
                return Deletions(run=other.run_id, deletes=other.plan.input.record_count, sent=done)
    return Deletions()


def _write(target: Path, data: bytes, *, explicit: bool, run: RunDir) -> None:
    try:
        write_atomic(target, data, None if explicit else run.storage)
    except StorageFailed as exc:
        if not explicit:
            raise
        raise UsageError(
            f"cannot write the report to {target}: {exc.message}",
            context={"output": str(target)},
            suggestion="name with -o a file in a directory you can write to, or - for stdout",
        ) from None
