"""What the run report shows, gathered in one streamed pass over each of the run's records.

The journal gives the totals, the latency and attempts distributions, the failures and the batches;
the run log gives the time series (its `interval` lines), the calls and the events on the time axis
(429 pauses, halts, stops, resumes) and the limits in force. Memory stays flat with the rows: counters
and bucketed histograms, a few examples per failure group, the batches still open, and a time series
that halves its resolution whenever it grows past a bound.

A run directory of an earlier version has no `interval` lines (or no run log at all): the series is
then absent, and `missing` says what the report could not show and why, rather than guessing.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.relay.metrics import status_class
from bulkrelay.report.failuregroups import FailureGroup, FailureTally, largest_first
from bulkrelay.store.journal import JournalEntry, read_journal
from bulkrelay.store.rundir import RUN_LOG, epoch
from bulkrelay.store.summary import LatencyHistogram, RequestCounts

MAX_POINTS = 400  # intervals kept for the time series; past twice this, neighbours are merged
SHORT_SECONDS = 1.0  # an interval shorter than this joins the one just before it
MAX_MARKS = 200  # events of one kind kept for the time axis (all are counted)
MAX_LOG_LINE = 1 << 20  # a longer run-log line is not one of ours: skipped
# Upper bounds (ms) of the latency histogram's buckets: 1-2-5 steps from 0.1 ms to 100 s, then the rest.
LATENCY_EDGES: tuple[float, ...] = (*(m * 10.0**e for e in range(-1, 5) for m in (1, 2, 5)), 1e5)


# ---------------------------------------------------------------- the journal


@dataclass
class BatchTally:
    """Batches as their rows' `batch: {seq, index, size}` tell them: sizes, and each one's outcome
    (all rows succeeded, some failed, all failed). A batch is counted once all its rows are read;
    one whose rows are not all committed (a live or stopped run) is counted as open."""

    sizes: Counter[int] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    rows: int = 0
    _open: dict[int, list[int]] = field(default_factory=dict)  # seq -> [size, seen, failed]

    def add(self, batch: Any, success: bool) -> None:
        if not isinstance(batch, dict) or not isinstance(batch.get("seq"), int):
            return
        size = batch.get("size")
        size = size if isinstance(size, int) and size > 0 else 1
        self.rows += 1
        state = self._open.setdefault(batch["seq"], [size, 0, 0])
        state[1] += 1
        state[2] += 0 if success else 1
        if state[1] >= state[0]:
            del self._open[batch["seq"]]
            self._close(state)

    def _close(self, state: list[int]) -> None:
        size, seen, failed = state
        self.sizes[size] += 1
        self.outcomes["all failed" if failed == seen else "some failed" if failed else "all succeeded"] += 1

    @property
    def batches(self) -> int:
        return sum(self.sizes.values())

    @property
    def still_open(self) -> int:
        return len(self._open)


@dataclass
class JournalTally:
    """Everything the report counts from the committed journal lines."""

    ok: int = 0
    failed: int = 0
    attempts_total: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    by_classification: Counter[str] = field(default_factory=Counter)
    attempts: Counter[int] = field(default_factory=Counter)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    latency_buckets: Counter[int] = field(default_factory=Counter)  # index into LATENCY_EDGES
    failure_groups: dict[tuple[int | None, str], FailureTally] = field(default_factory=dict)
    batches: BatchTally = field(default_factory=BatchTally)

    @property
    def done(self) -> int:
        return self.ok + self.failed

    def add(self, entry: JournalEntry) -> None:
        if entry.success:
            self.ok += 1
        else:
            self.failed += 1
            key = (entry.status_code, entry.classification)
            group = self.failure_groups.get(key)
            if group is None:
                group = self.failure_groups[key] = FailureTally(*key)
            group.add(entry)
        status = entry.status_code
        self.by_status["none" if status is None else str(status)] += 1
        self.by_classification[entry.classification] += 1
        self.attempts[entry.attempts] += 1
        self.attempts_total += entry.attempts
        # the summary's latency: the final attempt's round trip, else (early journals) the row's duration
        latency = entry.duration_ms if entry.latency_ms is None else entry.latency_ms
        self.latency.add(latency)
        self.latency_buckets[_latency_bucket(latency)] += 1
        batch = vars(entry).get("batch")  # journals of batched runs (docs/batching.md)
        if batch is not None:
            self.batches.add(batch, entry.success)

    def groups(self) -> tuple[FailureGroup, ...]:
        return largest_first(self.failure_groups.values())

    def percentiles(self) -> dict[str, float | None]:
        return {**self.latency.percentiles((0.5, 0.95, 0.99)), "max": self.latency.maximum()}


def _latency_bucket(ms: float) -> int:
    for index, edge in enumerate(LATENCY_EDGES):
        if ms <= edge:
            return index
    return len(LATENCY_EDGES)  # beyond the last edge


def tally_journal(journal: Path) -> JournalTally:
    tally = JournalTally()
    for entry in read_journal(journal):
        tally.add(entry)
    return tally


def requests_sent(summary: dict[str, Any] | None) -> RequestCounts | None:
    """The requests the run's calls sent, by status, with the retries and the splits apart (summary.json's
    `requests`); None for a run of an earlier version or without a summary yet."""
    return None if summary is None else RequestCounts.from_json(summary.get("requests"))


# ---------------------------------------------------------------- the run log


@dataclass
class Interval:
    """One stretch of relaying: [start, end] in epoch seconds and what happened in it."""

    start: float
    end: float
    committed: int
    ok: int
    failed: int
    responses: Counter[str]
    retries: int
    pauses: int
    configured_rps: float | None
    current_rps: float | None

    def merge(self, later: Interval) -> Interval:
        """This and the next interval as one; the rate is the later one's (where it stood at the end)."""
        return Interval(
            self.start,
            later.end,
            self.committed + later.committed,
            self.ok + later.ok,
            self.failed + later.failed,
            self.responses + later.responses,
            self.retries + later.retries,
            self.pauses + later.pauses,
            later.configured_rps,
            min(_rates(self.current_rps, later.current_rps), default=None),
        )


def _rates(*values: float | None) -> Iterator[float]:
    return (value for value in values if value is not None)


@dataclass(frozen=True)
class Mark:
    """An event on the time axis: `kind` is pause, halt, stop_requested, stop, start or resume."""

    kind: str
    at: float
    label: str
    seconds: float = 0.0  # a pause's length


@dataclass
class Call:
    """One command that worked on the run (run, resume, retry-failed, a background job's worker)."""

    command: str
    started: float
    pid: object = None
    ended: float | None = None
    exit_code: int | None = None
    error_code: str | None = None
    state: str | None = None


@dataclass
class Timeline:
    """What the run log says, in time order."""

    present: bool = False
    intervals: list[Interval] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    mark_counts: Counter[str] = field(default_factory=Counter)
    calls: list[Call] = field(default_factory=list)
    limits: dict[str, Any] | None = None
    transport: dict[str, Any] | None = None
    pauses: int = 0  # 429 pauses, overlapping ones counted once (the rows in flight answered together)
    pause_seconds: float = 0.0  # the time their union held every start
    pause_end: float = -math.inf
    unreadable_lines: int = 0
    relayed: bool = False  # a preflight_done seen: a later call's start is a resume

    def add_interval(self, interval: Interval) -> None:
        last = self.intervals[-1] if self.intervals else None
        if (
            last is not None
            and interval.end - interval.start < SHORT_SECONDS
            and interval.start - last.end < 0.5
        ):
            # a call's last line comes whenever it ends, maybe a moment after the one before: as a bar
            # of its own its rate would be a spike of a few rows over a few milliseconds
            self.intervals[-1] = last.merge(interval)
            return
        self.intervals.append(interval)
        if len(self.intervals) > 2 * MAX_POINTS:  # halve the resolution: memory stays bounded
            pairs = self.intervals
            merged = [a.merge(b) for a, b in zip(pairs[0::2], pairs[1::2], strict=False)]
            if len(pairs) % 2:
                merged.append(pairs[-1])
            self.intervals = merged

    def add_pause(self, at: float, seconds: float) -> None:
        """A 429 pause of `seconds` from `at`: a new pause, or part of the one in force."""
        if at >= self.pause_end:
            self.pauses += 1
            self.pause_seconds += seconds
        else:
            self.pause_seconds += max(0.0, at + seconds - self.pause_end)
        self.pause_end = max(self.pause_end, at + seconds)

    def mark(self, mark: Mark) -> None:
        self.mark_counts[mark.kind] += 1
        if self.mark_counts[mark.kind] <= MAX_MARKS:
            self.marks.append(mark)

    def call_of(self, pid: object) -> Call | None:
        """The latest call of process `pid`: a call that handed its work to a background job logs its
        exit while the job's worker, another process, goes on logging the run."""
        return next((call for call in reversed(self.calls) if call.pid == pid), None)

    @property
    def relaying_seconds(self) -> float:
        return sum(interval.end - interval.start for interval in self.intervals)


def _log_lines(path: Path) -> Iterator[dict[str, Any] | None]:
    """The run log's lines as objects, streamed; None for a line that is not one (counted, skipped)."""
    with path.open("rb") as stream:
        for raw in iter(lambda: stream.readline(MAX_LOG_LINE), b""):
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                line = None
            yield line if isinstance(line, dict) and epoch(line.get("ts")) is not None else None


def read_timeline(run_dir: Path) -> Timeline:
    timeline = Timeline()
    path = run_dir / RUN_LOG
    with contextlib.suppress(FileNotFoundError):
        for line in _log_lines(path):
            timeline.present = True
            if line is None:
                timeline.unreadable_lines += 1
            else:
                _read_event(timeline, line)
    return timeline


def _read_event(timeline: Timeline, line: dict[str, Any]) -> None:
    at = epoch(line["ts"])
    assert at is not None  # _log_lines yields only lines with a timestamp
    event = line.get("event")
    if event == "interval":
        interval = _interval(line, at)
        if interval is not None:
            timeline.add_interval(interval)
    elif event == "start":
        command = str(line.get("command", "?"))
        timeline.calls.append(Call(command, at, line.get("pid")))
    elif event == "preflight_done":
        kind = "resume" if timeline.relayed else "start"
        timeline.relayed = True
        command = timeline.calls[-1].command if timeline.calls else "run"
        timeline.mark(Mark(kind, at, command))
        timeline.limits = _mapping(line.get("limits")) or timeline.limits
        timeline.transport = _mapping(line.get("transport")) or timeline.transport
    elif event == "pause_429":
        seconds = _number(line.get("seconds")) or 0.0
        timeline.add_pause(at, seconds)
        timeline.mark(Mark("pause", at, f"429 pause {seconds:g}s", seconds))
    elif event in ("halt", "stop_requested"):
        timeline.mark(Mark(str(event), at, str(line.get("reason", event))))
    elif event == "stop":
        timeline.mark(Mark("stop", at, f"{line.get('state')} ({line.get('stop_reason') or 'ended'})"))
        call = timeline.call_of(line.get("pid"))
        if call is not None:
            call.state = _text(line.get("state"))
    elif event == "exit":
        call = timeline.call_of(line.get("pid"))
        if call is not None:
            call.ended, call.exit_code = at, _integer(line.get("exit_code"))
            call.error_code = _text(line.get("error_code"))
            call.state = call.state or _text(line.get("state"))


def _interval(line: dict[str, Any], end: float) -> Interval | None:
    seconds = _number(line.get("seconds"))
    if seconds is None or seconds < 0 or not math.isfinite(seconds):
        return None
    responses = Counter(
        {str(k): v for k, v in (_mapping(line.get("responses")) or {}).items() if isinstance(v, int)}
    )
    return Interval(
        start=end - seconds,
        end=end,
        committed=_integer(line.get("committed")) or 0,
        ok=_integer(line.get("ok")) or 0,
        failed=_integer(line.get("failed")) or 0,
        responses=responses,
        retries=_integer(line.get("retries")) or 0,
        pauses=_integer(line.get("pauses_429")) or 0,
        configured_rps=_number(line.get("configured_rps")),
        current_rps=_number(line.get("current_rps")),
    )


def _mapping(value: object) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "error")  # the outcome chart's stack, bottom up


def class_of(status: str) -> str:
    """`by_status`'s key (`"200"`, `"none"`) as a status class."""
    return status_class(None if status == "none" else int(status))
