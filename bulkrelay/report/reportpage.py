"""The run report as one self-contained HTML page: inline style, inline SVG, no script, nothing fetched.

The page is `templates/report.html.j2`; this module gives it what it shows (the facts, the tallies, the
charts as shapes). Its Content-Security-Policy (`default-src 'none'; style-src 'unsafe-inline'; img-src
data:`) makes the browser refuse any fetch, so the page opens the same offline, from a mail or an
artifact store. Every value is autoescaped by the template, its control characters shown (`templating`);
failure bodies are the journal's, redacted before they were written. Numbers the summary also holds
carry `data-summary="<its key>"`, so a test can hold them side by side.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bulkrelay.report import words
from bulkrelay.report.bulkjobs import BulkJobRow
from bulkrelay.report.failuregroups import FailureGroup
from bulkrelay.report.nights import Comparison
from bulkrelay.report.reportdata import (
    LATENCY_EDGES,
    STATUS_CLASSES,
    Interval,
    JournalTally,
    Timeline,
    class_of,
)
from bulkrelay.report.svgchart import (
    Chart,
    Frame,
    Shape,
    bar,
    category_bars,
    chart,
    marker,
    nice_ceiling,
    stacked,
    step_line,
    x_labels,
    y_axis,
)
from bulkrelay.report.templating import render
from bulkrelay.report.words import clock
from bulkrelay.store.summary import RequestCounts

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
BODY_SHOWN = 600  # characters of a failure body shown in an example
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True)
class QueryInput:
    """A query input as run.json records it: the text, and the database named without credentials
    (`input.source`). None where a run of an earlier version did not record it."""

    text: str | None
    database: str | None


@dataclass(frozen=True)
class Deletions:
    """A mirror job's deletions. Of a deletion run: the night whose vanished keys it deletes (`of_night`),
    how many and how many it sent. Of a night: the deletion run that sent them (`run`), or neither: none
    were sent for it."""

    of_night: str | None = None
    run: str | None = None
    deletes: int = 0
    sent: int = 0


@dataclass(frozen=True)
class ReportFacts:
    """What the page shows besides the journal's and the run log's own tallies."""

    run_id: str
    run_dir: str
    name: str
    job_path: str
    input_path: str
    input_format: str
    query: QueryInput | None  # None: the input is a file
    state: str
    liveness: str
    exit_code: int | None
    started: str
    ended: str | None
    duration_seconds: float | None
    rows_total: int
    summary: dict[str, Any] | None
    requests: RequestCounts | None  # sent by status, retries and splits apart (summary.json's requests)
    tool_version: str
    parent_run: str | None
    generated_at: str
    sync: dict[str, Any] | None
    deletions: Deletions | None  # a mirror job's deletions: this run's, or the run that sent them
    missing: tuple[str, ...]
    stop_reason: str | None = None
    skipped: int = 0  # a delta run's rows not sent because they had not changed
    comparisons: tuple[Comparison, ...] = ()  # this night against the job's nights before it


@dataclass(frozen=True)
class Headline:
    """The answer the page leads with: the result in words and its numbers."""

    verdict: str
    tone: str  # good, bad or live: the headline's colour
    sent: int
    failed: int
    skipped: int
    percent_failed: str
    duration: str
    rate: str
    continue_command: str | None = None  # a night that stopped (or whose process died) goes on with it


def headline(facts: ReportFacts, tally: JournalTally, timeline: Timeline) -> Headline:
    live = facts.liveness == "live"
    bad = tally.failed > 0 or facts.state not in ("completed", "running")
    seconds = timeline.relaying_seconds if timeline.intervals else facts.duration_seconds
    return Headline(
        verdict=words.verdict(facts.state, facts.stop_reason, live, tally.failed),
        tone="live" if live else "bad" if bad else "good",
        sent=tally.done,
        failed=tally.failed,
        skipped=facts.skipped,
        percent_failed=words.percent(tally.failed, tally.done),
        duration=words.duration(facts.duration_seconds),
        rate=words.rate(tally.done, seconds),
        continue_command=_continue_command(facts, live),
    )


def _continue_command(facts: ReportFacts, live: bool) -> str | None:
    """Stopped, forced, or running with no process behind it: `resume` continues it."""
    if facts.state in ("stopped", "forced") or (facts.state == "running" and not live):
        return f"bulkrelay resume {shlex.quote(facts.run_dir)}"
    return None


@dataclass(frozen=True)
class FailureView:
    """A failure group as the page shows it: its title, count, retry command and examples."""

    status: str
    group: FailureGroup
    retry: str
    examples: tuple[tuple[int, str, int, str, str], ...]  # row, key, attempts, error, body


def page(
    facts: ReportFacts, tally: JournalTally, timeline: Timeline, bulk_jobs: tuple[BulkJobRow, ...] = ()
) -> str:
    run = shlex.quote(facts.run_dir)
    return render(
        "report.html.j2",
        csp=CSP,
        facts=facts,
        headline=headline(facts, tally, timeline),
        tally=tally,
        timeline=timeline,
        status_class=class_of,
        throughput=_throughput(timeline) if timeline.intervals else None,
        outcomes=_outcomes(timeline) if timeline.intervals else None,
        latency=_latency(tally) if tally.done else None,
        attempts=_attempts(tally) if tally.done else None,
        percentiles=tally.percentiles(),
        batch_sizes=_batch_sizes(tally) if tally.batches.rows else None,
        bulk_jobs=bulk_jobs,
        failures=tuple(_failure_view(group, run) for group in tally.groups()),
        retry_all=f"bulkrelay retry-failed {run}",
        mark_legend=_MARK_LEGEND,
        outcome_legend=[
            *((f"c{c}", "no answer" if c == "error" else c) for c in STATUS_CLASSES),
            ("retries-key", "retries/s"),
        ],
    )


# ---------------------------------------------------------------- time series


def _time_frame(timeline: Timeline, top: float) -> Frame:
    times = [t for i in timeline.intervals for t in (i.start, i.end)] + [m.at for m in timeline.marks]
    return Frame(min(times), max(*times, min(times) + 1.0), nice_ceiling(top))


def _time_ticks(frame: Frame) -> list[tuple[float, str]]:
    span = frame.x1 - frame.x0
    step = next((s for s in _TIME_STEPS if span / s <= 8), _TIME_STEPS[-1])
    first = math.ceil(frame.x0 / step) * step
    return [(t, clock(t)) for t in _frange(first, frame.x1, step)]


def _frange(start: float, stop: float, step: float) -> Iterable[float]:
    value = start
    while value <= stop:
        yield value
        value += step


def _marks(frame: Frame, timeline: Timeline) -> list[Shape]:
    return [
        shape
        for mark in timeline.marks
        for shape in marker(
            frame, mark.at, f"mark-{mark.kind}", f"{clock(mark.at)} {mark.label}", mark.seconds
        )
    ]


_MARK_LEGEND = (
    ("mark-start", "start"),
    ("mark-resume", "resume"),
    ("mark-pause", "429 pause"),
    ("mark-halt", "halt"),
    ("mark-stop_requested", "stop requested"),
    ("mark-stop", "stop"),
)


def _throughput(timeline: Timeline) -> Chart:
    top = max(
        [_per_second(i, i.committed) for i in timeline.intervals]
        + [r for i in timeline.intervals for r in (i.configured_rps, i.current_rps) if r is not None]
    )
    frame = _time_frame(timeline, top * 1.05)
    shapes = [*y_axis(frame, "rows/s"), *x_labels(frame, _time_ticks(frame))]
    for i in timeline.intervals:
        title = f"{clock(i.end)}: {i.committed} rows in {i.end - i.start:.1f}s ({i.ok} ok, {i.failed} failed)"
        layers = ((_per_second(i, i.ok), "ok"), (_per_second(i, i.failed), "failed"))
        shapes += stacked(frame, i.start, i.end, layers, title)
    shapes += step_line(frame, [(i.start, i.end, i.configured_rps) for i in timeline.intervals], "configured")
    shapes += step_line(frame, [(i.start, i.end, i.current_rps) for i in timeline.intervals], "current")
    shapes += _marks(frame, timeline)
    return chart(frame, "throughput", "rows committed per second over time", shapes)


def _per_second(interval: Interval, count: float) -> float:
    seconds = interval.end - interval.start
    return count / seconds if seconds > 0 else 0.0


def _outcomes(timeline: Timeline) -> Chart:
    top = max(_per_second(i, sum(i.responses.values())) for i in timeline.intervals)
    frame = _time_frame(timeline, top * 1.05)
    shapes = [*y_axis(frame, "responses/s"), *x_labels(frame, _time_ticks(frame))]
    for i in timeline.intervals:
        layers = [(_per_second(i, i.responses.get(c, 0)), f"c{c}") for c in STATUS_CLASSES]
        title = f"{clock(i.end)}: " + ", ".join(f"{c} {i.responses.get(c, 0)}" for c in STATUS_CLASSES)
        shapes += stacked(frame, i.start, i.end, layers, title)
    retries = [(i.start, i.end, _per_second(i, i.retries)) for i in timeline.intervals]
    shapes += step_line(frame, retries, "retries")
    shapes += _marks(frame, timeline)
    return chart(frame, "outcomes", "responses per second by status class", shapes)


# ---------------------------------------------------------------- latency and attempts


def _latency(tally: JournalTally) -> Chart:
    buckets = tally.latency_buckets
    first, last = min(buckets), max(buckets)
    values = [(_bucket_label(i), float(buckets.get(i, 0))) for i in range(first, last + 1)]
    frame = Frame(0, len(values), nice_ceiling(max(v for _, v in values)))
    shapes = [*y_axis(frame, "rows"), *x_labels(frame, [(i + 0.5, t) for i, (t, _) in enumerate(values)])]
    for index, (text, value) in enumerate(values):
        shapes.append(bar(frame, (index + 0.1, index + 0.9, 0, value), "latency", f"{text}: {value:g} rows"))
    percentiles = tally.percentiles()
    for name in ("p50", "p95", "p99"):
        ms = percentiles.get(name)
        if ms is not None:
            shapes += marker(frame, _latency_x(ms) - first, f"pct-{name}", f"{name} {ms:g} ms")
    return chart(frame, "latency", "latency histogram (ms, final attempt)", shapes)


def _attempts(tally: JournalTally) -> Chart:
    attempts = [(str(n), float(tally.attempts[n])) for n in range(1, max(tally.attempts) + 1)]
    return category_bars("attempts", "rows by attempts", attempts, "attempts", "rows")


def _bucket_label(index: int) -> str:
    if index >= len(LATENCY_EDGES):
        return f">{LATENCY_EDGES[-1]:g}"
    return f"≤{LATENCY_EDGES[index]:g}"


def _latency_x(ms: float) -> float:
    """Where `ms` falls on the histogram's bucket axis: its bucket's index plus a log fraction."""
    for index, edge in enumerate(LATENCY_EDGES):
        if ms <= edge:
            low = LATENCY_EDGES[index - 1] if index else edge / 2
            fraction = math.log(max(ms, low) / low) / math.log(edge / low)
            return index + fraction
    return len(LATENCY_EDGES) + 0.5


# ---------------------------------------------------------------- failures and batches


def _failure_view(group: FailureGroup, run: str) -> FailureView:
    status = "no answer" if group.status_code is None else str(group.status_code)
    narrow = (
        f"--classification {group.classification}"
        if group.status_code is None
        else f"--status {group.status_code}"
    )
    examples = tuple(
        (
            example.row_number,
            "—" if example.key is None else _plain(example.key),
            example.attempts,
            example.error or "",
            _shown_body(example.body),
        )
        for example in group.examples
    )
    return FailureView(status, group, f"bulkrelay retry-failed {run} {narrow}", examples)


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_plain(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def _shown_body(body: str | None) -> str:
    if not body:
        return ""
    return body if len(body) <= BODY_SHOWN else f"{body[:BODY_SHOWN]}…"


def _batch_sizes(tally: JournalTally) -> Chart:
    sizes = [(str(size), float(n)) for size, n in sorted(tally.batches.sizes.items())]
    return category_bars("batch-sizes", "batches by size", sizes, "batch", "batches")
