"""The run report as one self-contained HTML page: inline style, inline SVG, no script, nothing fetched.

Its Content-Security-Policy (`default-src 'none'; style-src 'unsafe-inline'; img-src data:`) makes the
browser refuse any fetch, so the page opens the same offline, from a mail or an artifact store. Every
value from the run is HTML-escaped; failure bodies are the journal's, redacted before they were written.
Numbers the summary also holds carry `data-summary="<its key>"`, so a test can hold them side by side.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from bulkrelay.ops.reportdata import (
    LATENCY_EDGES,
    STATUS_CLASSES,
    Interval,
    JournalTally,
    Timeline,
    class_of,
)
from bulkrelay.ops.results import FailureGroup
from bulkrelay.ops.svgchart import (
    Frame,
    bar,
    category_bars,
    legend,
    marker,
    nice_ceiling,
    stacked,
    step_line,
    svg,
    x_labels,
    y_axis,
)
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
    requests: RequestCounts | None  # sent by status, retries and splits apart (issue 43)
    tool_version: str
    parent_run: str | None
    generated_at: str
    sync: dict[str, Any] | None
    deletions: Deletions | None  # a mirror job's deletions: this run's, or the run that sent them
    missing: tuple[str, ...]


def page(facts: ReportFacts, tally: JournalTally, timeline: Timeline) -> str:
    sections = (
        _header(facts, tally, timeline),
        _missing(facts.missing),
        _throughput(timeline),
        _outcomes(facts, tally, timeline),
        _latency(facts, tally),
        _failures(facts, tally),
        _batches_and_delta(facts, tally),
    )
    title = f"BulkRelay run {facts.run_id}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><main><h1>{escape(facts.name)} <small>{escape(facts.run_id)}</small></h1>"
        f"{''.join(sections)}<footer>generated {escape(facts.generated_at)} by bulkrelay "
        f"{escape(facts.tool_version)} from {escape(facts.run_dir)}</footer></main></body></html>\n"
    )


# ---------------------------------------------------------------- header


def _header(facts: ReportFacts, tally: JournalTally, timeline: Timeline) -> str:
    state = (
        facts.state if facts.liveness in ("finished", facts.state) else f"{facts.state} ({facts.liveness})"
    )
    exit_text = "—" if facts.exit_code is None else str(facts.exit_code)
    duration = "—" if facts.duration_seconds is None else _duration(facts.duration_seconds)
    rows: list[tuple[str, str]] = [
        ("job", _code(facts.job_path)),
        ("input", _input(facts)),
        ("state", f'<span class="state {escape(facts.state)}" id="state">{escape(state)}</span>'),
        ("exit code", f'<span id="exit-code">{exit_text}</span>'),
        ("started", escape(facts.started)),
        ("ended", escape(facts.ended or "— (not ended)")),
        (
            "duration",
            f"{duration}; relaying {_duration(timeline.relaying_seconds)}"
            if timeline.intervals
            else duration,
        ),
        (
            "rows",
            f'<span data-summary="rows_done">{tally.done}</span> of '
            f'<span data-summary="rows_total">{facts.rows_total}</span> done',
        ),
        ("calls", _calls(timeline)),
        ("transport", _pairs(timeline.transport)),
        ("limits", _pairs(timeline.limits)),
    ]
    if facts.parent_run:
        rows.append(("retry of", _code(facts.parent_run)))
    cells = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    return f'<section id="header"><table class="facts">{cells}</table></section>'


def _input(facts: ReportFacts) -> str:
    """The file read; for a query, the query and its database first, then the snapshot it was taken into."""
    file = f'<code id="input-path">{escape(facts.input_path)}</code> ({escape(facts.input_format)})'
    query = facts.query
    if query is None:
        return file
    text = _recorded("input-query", query.text, ' class="query"')
    database = _recorded("input-database", query.database)
    return f"query {text} on {database}, taken into the snapshot {file}"


def _recorded(element: str, value: str | None, css: str = "") -> str:
    """`value` in a code element with this id, or "not recorded" (a run of an earlier version)."""
    if value is None:
        return f'<span class="absent" id="{element}">not recorded</span>'
    return f'<code id="{element}"{css}>{escape(value)}</code>'


def _calls(timeline: Timeline) -> str:
    if not timeline.calls:
        return "—"
    items = []
    for call in timeline.calls:
        ended = "" if call.exit_code is None else f" → exit {call.exit_code}"
        why = f" {call.error_code}" if call.error_code else ""
        items.append(f"{escape(call.command)} at {_clock(call.started)}{ended}{escape(why)}")
    return "; ".join(items)


def _pairs(mapping: dict[str, Any] | None) -> str:
    if not mapping:
        return '<span class="absent">not recorded</span>'
    return ", ".join(f"{escape(str(k))} {escape(_plain(v))}" for k, v in mapping.items())


def _plain(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_plain(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def _missing(missing: Sequence[str]) -> str:
    if not missing:
        return ""
    items = "".join(f"<li>{escape(text)}</li>" for text in missing)
    return f'<section id="missing"><h2>Not in this report</h2><ul>{items}</ul></section>'


# ---------------------------------------------------------------- time series


def _time_frame(timeline: Timeline, top: float) -> Frame:
    times = [t for i in timeline.intervals for t in (i.start, i.end)] + [m.at for m in timeline.marks]
    return Frame(min(times), max(*times, min(times) + 1.0), nice_ceiling(top))


def _time_ticks(frame: Frame) -> list[tuple[float, str]]:
    span = frame.x1 - frame.x0
    step = next((s for s in _TIME_STEPS if span / s <= 8), _TIME_STEPS[-1])
    first = math.ceil(frame.x0 / step) * step
    return [(t, _clock(t)) for t in _frange(first, frame.x1, step)]


def _frange(start: float, stop: float, step: float) -> Iterable[float]:
    value = start
    while value <= stop:
        yield value
        value += step


def _marks(frame: Frame, timeline: Timeline) -> str:
    return "".join(
        marker(frame, mark.at, f"mark-{mark.kind}", f"{_clock(mark.at)} {mark.label}", mark.seconds)
        for mark in timeline.marks
    )


_MARK_LEGEND = (
    ("mark-start", "start"),
    ("mark-resume", "resume"),
    ("mark-pause", "429 pause"),
    ("mark-halt", "halt"),
    ("mark-stop_requested", "stop requested"),
    ("mark-stop", "stop"),
)


def _throughput(timeline: Timeline) -> str:
    head = '<section id="throughput"><h2>Throughput</h2>'
    if not timeline.intervals:
        return f"{head}{_no_series(timeline)}</section>"
    top = max(
        [_per_second(i, i.committed) for i in timeline.intervals]
        + [r for i in timeline.intervals for r in (i.configured_rps, i.current_rps) if r is not None]
    )
    frame = _time_frame(timeline, top * 1.05)
    parts = [y_axis(frame, "rows/s"), x_labels(frame, _time_ticks(frame))]
    for i in timeline.intervals:
        title = (
            f"{_clock(i.end)}: {i.committed} rows in {i.end - i.start:.1f}s ({i.ok} ok, {i.failed} failed)"
        )
        layers = ((_per_second(i, i.ok), "ok"), (_per_second(i, i.failed), "failed"))
        parts.append(stacked(frame, i.start, i.end, layers, title))
    parts.append(
        step_line(frame, [(i.start, i.end, i.configured_rps) for i in timeline.intervals], "configured")
    )
    parts.append(step_line(frame, [(i.start, i.end, i.current_rps) for i in timeline.intervals], "current"))
    parts.append(_marks(frame, timeline))
    chart = svg(frame, "throughput", "rows committed per second over time", "".join(parts))
    keys = legend(
        (
            ("ok", "rows succeeded/s"),
            ("failed", "rows failed/s"),
            ("configured-key", "configured rate limit"),
            ("current-key", "adapted rate limit"),
            *_MARK_LEGEND,
        )
    )
    return f"{head}{chart}{keys}{_mark_counts(timeline)}</section>"


def _per_second(interval: Interval, count: float) -> float:
    seconds = interval.end - interval.start
    return count / seconds if seconds > 0 else 0.0


def _mark_counts(timeline: Timeline) -> str:
    counts = timeline.mark_counts
    pause = f"{timeline.pauses} 429 pauses ({round(timeline.pause_seconds, 3):g} s in all)"
    text = f"{pause}, {counts['halt']} halts, {counts['stop']} stops, {counts['resume']} resumes"
    return f'<p class="note" id="events">{escape(text)}</p>'


def _no_series(timeline: Timeline) -> str:
    if not timeline.present:
        why = "this run has no run log (run.log), so there is no time series"
    else:
        why = (
            "the run log has no interval lines (written by BulkRelay from this version on), "
            "so there is no time series"
        )
    return f'<p class="absent">{escape(why)}.</p>'


def _outcomes(facts: ReportFacts, tally: JournalTally, timeline: Timeline) -> str:
    head = '<section id="outcomes"><h2>Outcomes</h2>'
    chart = ""
    if timeline.intervals:
        top = max(_per_second(i, sum(i.responses.values())) for i in timeline.intervals)
        frame = _time_frame(timeline, top * 1.05)
        parts = [y_axis(frame, "responses/s"), x_labels(frame, _time_ticks(frame))]
        for i in timeline.intervals:
            layers = [(_per_second(i, i.responses.get(c, 0)), f"c{c}") for c in STATUS_CLASSES]
            title = f"{_clock(i.end)}: " + ", ".join(f"{c} {i.responses.get(c, 0)}" for c in STATUS_CLASSES)
            parts.append(stacked(frame, i.start, i.end, layers, title))
        retries = [(i.start, i.end, _per_second(i, i.retries)) for i in timeline.intervals]
        parts.append(step_line(frame, retries, "retries"))
        parts.append(_marks(frame, timeline))
        chart = svg(frame, "outcomes", "responses per second by status class", "".join(parts))
        keys = [(f"c{c}", "no answer" if c == "error" else c) for c in STATUS_CLASSES]
        chart += legend([*keys, ("retries-key", "retries/s")])
        chart += (
            '<p class="note">every response, retried attempts included; '
            "the tables count rows' final results.</p>"
        )
    else:
        chart = _no_series(timeline)
    return f"{head}{chart}{_totals(tally)}</section>"


def _totals(tally: JournalTally) -> str:
    numbers = (
        ("succeeded", "by_outcome.succeeded", tally.ok),
        ("failed", "by_outcome.failed", tally.failed),
        ("attempts", "attempts", tally.attempts_total),
        ("retries", "retries", tally.attempts_total - tally.done),
    )
    outcome = "".join(
        f'<tr><th>{name}</th><td data-summary="{key}">{value}</td></tr>' for name, key, value in numbers
    )
    outcome = f'<table class="totals">{outcome}</table>'
    statuses = "".join(
        f"<tr><td>{escape(s)}</td><td>{class_of(s)}</td>"
        f'<td data-summary="by_status.{escape(s)}">{n}</td></tr>'
        for s, n in sorted(tally.by_status.items())
    )
    classes = "".join(
        f'<tr><td>{escape(c)}</td><td data-summary="by_classification.{escape(c)}">{n}</td></tr>'
        for c, n in sorted(tally.by_classification.items())
    )
    return (
        f'<div class="tables">{outcome}'
        f'<table class="totals"><tr><th>status</th><th>class</th><th>rows</th></tr>{statuses}</table>'
        f'<table class="totals"><tr><th>classification</th><th>rows</th></tr>{classes}</table></div>'
    )


# ---------------------------------------------------------------- latency and attempts


def _latency(facts: ReportFacts, tally: JournalTally) -> str:
    head = '<section id="latency"><h2>Latency and attempts</h2>'
    if not tally.done:
        return f'{head}<p class="absent">no committed row yet.</p></section>'
    buckets = tally.latency_buckets
    first, last = min(buckets), max(buckets)
    values = [(_bucket_label(i), float(buckets.get(i, 0))) for i in range(first, last + 1)]
    frame = Frame(0, len(values), nice_ceiling(max(v for _, v in values)))
    parts = [y_axis(frame, "rows"), x_labels(frame, [(i + 0.5, text) for i, (text, _) in enumerate(values)])]
    for index, (text, value) in enumerate(values):
        parts.append(bar(frame, (index + 0.1, index + 0.9, 0, value), "latency", f"{text}: {value:g} rows"))
    percentiles = tally.percentiles()
    for name in ("p50", "p95", "p99"):
        ms = percentiles.get(name)
        if ms is not None:
            parts.append(marker(frame, _latency_x(ms) - first, f"pct-{name}", f"{name} {ms:g} ms"))
    chart = svg(frame, "latency", "latency histogram (ms, final attempt)", "".join(parts))
    numbers = "".join(
        f'<tr><th>{name}</th><td data-summary="latency_ms.{name}">{_ms(percentiles.get(name))}</td></tr>'
        for name in ("p50", "p95", "p99", "max")
    )
    keys = legend((("pct-p50-key", "p50"), ("pct-p95-key", "p95"), ("pct-p99-key", "p99")))
    attempts = [(str(n), float(tally.attempts[n])) for n in range(1, max(tally.attempts) + 1)]
    attempts_chart = category_bars("attempts", "rows by attempts", attempts, "attempts", "rows")
    return (
        f"{head}<h3>Latency of each row's final attempt (ms)</h3>{chart}{keys}"
        f'<table class="totals">{numbers}</table>'
        f"<h3>Attempts per row</h3>{attempts_chart}</section>"
    )


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


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


# ---------------------------------------------------------------- failures


def _failures(facts: ReportFacts, tally: JournalTally) -> str:
    head = '<section id="failures"><h2>Failures</h2>'
    groups = tally.groups()
    if not groups:
        return f'{head}<p class="good">no row failed.</p></section>'
    run = shlex.quote(facts.run_dir)
    retry = (
        f'<p>retry every failed row: <code class="command">bulkrelay retry-failed {escape(run)}</code></p>'
    )
    return head + retry + "".join(_group(group, run) for group in groups) + "</section>"


def _group(group: FailureGroup, run: str) -> str:
    status = "no answer" if group.status_code is None else str(group.status_code)
    narrow = (
        f"--classification {group.classification}"
        if group.status_code is None
        else f"--status {group.status_code}"
    )
    rows = "".join(
        "<tr>"
        f"<td>{example.row_number}</td>"
        f"<td>{escape(_plain(example.key)) if example.key is not None else '—'}</td>"
        f"<td>{example.attempts}</td><td>{escape(example.error or '')}</td>"
        f"<td><pre>{escape(_shown_body(example.body))}</pre></td></tr>"
        for example in group.examples
    )
    return (
        f'<div class="group"><h3>{escape(status)} {escape(group.classification)}: '
        f'<span class="count">{group.count}</span> rows</h3>'
        '<p>retry these: <code class="command">'
        f"bulkrelay retry-failed {escape(run)} {escape(narrow)}</code></p>"
        '<table class="examples"><tr><th>row</th><th>key</th><th>attempts</th><th>error</th>'
        f"<th>body (redacted)</th></tr>{rows}</table></div>"
    )


def _shown_body(body: str | None) -> str:
    if not body:
        return ""
    return body if len(body) <= BODY_SHOWN else f"{body[:BODY_SHOWN]}…"


# ---------------------------------------------------------------- batches and delta


def _batches_and_delta(facts: ReportFacts, tally: JournalTally) -> str:
    batches = tally.batches
    if not batches.rows:
        batch_html = '<p class="absent" id="not-batched">not a batched run.</p>'
    else:
        sizes = [(str(size), float(n)) for size, n in sorted(batches.sizes.items())]
        chart = category_bars("batch-sizes", "batches by size", sizes, "batch", "batches")
        outcomes = "".join(
            f"<tr><th>{escape(name)}</th><td>{batches.outcomes.get(name, 0)}</td></tr>"
            for name in ("all succeeded", "some failed", "all failed")
        )
        still = f"<tr><th>open (not all rows committed)</th><td>{batches.still_open}</td></tr>"
        batch_html = (
            f'<p><span id="batches">{batches.batches}</span> batches of {batches.rows} rows</p>'
            f'<h3>Batch sizes</h3>{chart}<table class="totals">{outcomes}{still}</table>'
        )
    return (
        f'<section id="batches-section"><h2>Batches</h2>{batch_html}</section>'
        f'<section id="delta"><h2>Delta sync</h2>{_delta(facts)}</section>'
    )


def _delta(facts: ReportFacts) -> str:
    sync, deletions = facts.sync, facts.deletions
    if sync is None and deletions is None:
        return '<p class="absent" id="not-delta">not a delta run.</p>'
    rows: list[tuple[str, str]] = []
    if sync is not None:
        rows += [
            ("mode", f'<span id="delta-mode">{escape(str(sync.get("mode")))}</span>'),
            ("full pass", "yes" if sync.get("full") else "no"),
            ("rows sent (changed)", str(sync.get("selected"))),
            (
                "rows skipped as unchanged",
                f'<span data-summary="skipped_unchanged">{sync.get("skipped_unchanged")}</span>',
            ),
        ]
    if deletions is not None:
        rows += _deletion_rows(deletions)
    cells = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    return f'<table class="facts">{cells}</table>'


def _deletion_rows(deletions: Deletions) -> list[tuple[str, str]]:
    counts = [
        ("deletes", f'<span id="deletes">{deletions.deletes}</span>'),
        ("sent", f'<span id="sent">{deletions.sent}</span>'),
    ]
    if deletions.of_night is not None:
        mode = '<span id="delta-mode">deletion run of a mirror job</span>'
        night = f'<code id="deletions-of">{escape(deletions.of_night)}</code>'
        return [("mode", mode), ("deletes the keys gone since run", night), *counts]
    if deletions.run is None:
        return [("deletions", "none sent for this run")]
    return [("deletions run", f'<code id="deletions-run">{escape(deletions.run)}</code>'), *counts]


# ---------------------------------------------------------------- words and numbers


def _code(text: str) -> str:
    return f"<code>{escape(text)}</code>"


def _clock(epoch_seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch_seconds))


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1d2330;background:#f6f7f9;margin:0}
main{max-width:1100px;margin:0 auto;padding:16px 24px 40px}
h1{font-size:22px;margin:8px 0 12px}h1 small{font-weight:400;color:#667;font-size:14px}
h2{font-size:17px;margin:0 0 8px}h3{font-size:14px;margin:14px 0 6px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:14px 16px;margin:0 0 14px}
table{border-collapse:collapse}th,td{text-align:left;padding:3px 10px 3px 0;vertical-align:top}
table.facts th{color:#556;font-weight:600;white-space:nowrap}
.tables{display:flex;gap:28px;flex-wrap:wrap;margin-top:10px}
table.totals td,table.totals th{border-bottom:1px solid #eef0f3}
table.examples{width:100%;font-size:13px}table.examples td,table.examples th{border-bottom:1px solid #eef0f3}
pre{margin:0;white-space:pre-wrap;word-break:break-all;font-size:12px;max-width:520px}
code{font-size:13px;background:#f0f2f5;padding:1px 4px;border-radius:3px}code.query{white-space:pre-wrap}
.absent{color:#8a6d1c}.good{color:#2a7a3a}.note{color:#667;font-size:12px}
.state.completed{color:#2a7a3a}.state.completed_with_failures,.state.stopped,.state.forced{color:#b0560b}
.legend{font-size:12px;color:#445}.key{margin-right:14px;white-space:nowrap}
svg.chart{width:100%;height:auto;display:block}
.grid{stroke:#edf0f3}.axis{stroke:#99a}.tick,.unit{font-size:11px;fill:#556}
.ok{fill:#3c9a5f}.failed{fill:#d4553f}.latency{fill:#4c78a8}.attempts{fill:#7a5cc2}.batch{fill:#4c9aa8}
.c2xx{fill:#52b788}.c3xx{fill:#adb5bd}.c4xx{fill:#f4a261}.c5xx{fill:#e63946}.cerror{fill:#6a4c93}
.configured{fill:none;stroke:#1d2330;stroke-width:2;stroke-dasharray:6 4}
.current{fill:none;stroke:#2f6fd6;stroke-width:2}
.configured-key{fill:#1d2330}.current-key{fill:#2f6fd6}
.retries{fill:none;stroke:#264653;stroke-width:2;stroke-dasharray:2 2}.retries-key{fill:#264653}
.mark-start,.mark-resume{stroke:#2a7a3a;stroke-width:2}.mark-pause{stroke:#e0a030;stroke-width:1.5}
.mark-pause-band{fill:#e0a030;opacity:.18}.mark-halt{stroke:#c0392b;stroke-width:2.5}
.mark-stop_requested{stroke:#7b2d8b;stroke-width:2;stroke-dasharray:3 3}
.mark-stop{stroke:#1d2330;stroke-width:2}
rect.mark-start,rect.mark-resume{fill:#2a7a3a}rect.mark-pause{fill:#e0a030}rect.mark-halt{fill:#c0392b}
rect.mark-stop_requested{fill:#7b2d8b}rect.mark-stop{fill:#1d2330}
.pct-p50,.pct-p95,.pct-p99{stroke-width:2}.pct-p50{stroke:#2a7a3a}.pct-p95{stroke:#e0a030}.pct-p99{stroke:#c0392b}
.pct-p50-key{fill:#2a7a3a}.pct-p95-key{fill:#e0a030}.pct-p99-key{fill:#c0392b}
footer{color:#889;font-size:12px;margin-top:10px}
"""
