"""`summary.json`: counts by outcome, status and classification, attempts, latency percentiles, rate.

The summary is rebuilt from the journal, the source of truth, so its counts always equal the
journal's, across any number of interruptions and resumes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bulkrelay.errors import JournalCorrupt, NotFound
from bulkrelay.store.atomic import read_json
from bulkrelay.store.journal import JournalEntry, read_journal
from bulkrelay.store.jsonfields import JsonFields

_TENTHS = 10  # latencies are bucketed to 0.1 ms: exact enough, and memory stays a few buckets


class LatencyHistogram:
    """Percentiles over bucketed durations; memory grows with distinct buckets, not rows."""

    def __init__(self) -> None:
        self._buckets: Counter[int] = Counter()
        self.count = 0

    def add(self, duration_ms: float) -> None:
        self._buckets[int(duration_ms * _TENTHS)] += 1
        self.count += 1

    def percentiles(self, quantiles: Iterable[float]) -> dict[str, float | None]:
        wanted = sorted(quantiles)
        out: dict[str, float | None] = {_label(q): None for q in wanted}
        if not self.count:
            return out
        seen = 0
        pending = list(wanted)
        for bucket in sorted(self._buckets):
            seen += self._buckets[bucket]
            while pending and seen >= pending[0] * self.count:
                out[_label(pending.pop(0))] = bucket / _TENTHS
            if not pending:
                break
        return out

    def maximum(self) -> float | None:
        return max(self._buckets) / _TENTHS if self._buckets else None


def _label(quantile: float) -> str:
    return f"p{round(quantile * 100)}"


@dataclass(frozen=True)
class ThisCall:
    """What the call that wrote the summary committed, and how fast."""

    rows_committed: int
    elapsed_seconds: float
    rows_per_second: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "rows_committed": self.rows_committed,
            "elapsed_seconds": self.elapsed_seconds,
            "rows_per_second": self.rows_per_second,
        }


@dataclass(frozen=True)
class RequestCounts:
    """What went on the wire, as the run's calls counted it (a call killed with -9 leaves its own
    uncounted): requests sent by status ("none": no answer), the retries among them, and the splits
    (batches bisected: new requests, no retry). In a batch run a row's `attempts` count every request
    that carried it, halves of a split too: these are the requests themselves."""

    sent: int
    by_status: dict[str, int]
    retries: int
    splits: int

    def plus(self, other: RequestCounts) -> RequestCounts:
        statuses = Counter(self.by_status) + Counter(other.by_status)
        return RequestCounts(
            self.sent + other.sent,
            dict(sorted(statuses.items())),
            self.retries + other.retries,
            self.splits + other.splits,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "by_status": dict(self.by_status),
            "retries": self.retries,
            "splits": self.splits,
        }

    @classmethod
    def from_json(cls, data: Any) -> RequestCounts | None:
        """The block again; None when it is absent or not one (a summary of an earlier version)."""
        try:
            return cls(int(data["sent"]), dict(data["by_status"]), int(data["retries"]), int(data["splits"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class RunSummary:
    """A run's summary: the counts of its journal (`summarize`, `SummaryCounts.report`) and, as
    `summary.json` holds it, the run, a delta run's unchanged rows and this call's pace (`with_run`).
    `to_json` is the file's and the envelope's form, key for key in their order."""

    rows_total: int
    rows_done: int
    succeeded: int
    failed: int
    by_status: dict[str, int]  # status code (or "none") -> rows, sorted
    by_classification: dict[str, int]
    attempts: int
    latency_ms: dict[str, float | None]  # p50, p95, p99, max; None before the first row
    run_id: str | None = None
    skipped_unchanged: int | None = None  # a delta run: rows not sent because they had not changed
    this_call: ThisCall | None = None
    updated_at: str | None = None
    requests: RequestCounts | None = None  # the wire's view, across the run's calls
    # Rows done with at least one attempt; a row done without a request (a lookup miss) has none to
    # retry. None: every done row was sent (a summary made without this count).
    rows_sent: int | None = None

    @property
    def rows_pending(self) -> int:
        return self.rows_total - self.rows_done

    @property
    def retries(self) -> int:
        """Attempts past each sent row's first (never below 0, even for a summary of an earlier
        version, which counted a row never sent as a retry less)."""
        sent = self.rows_done if self.rows_sent is None else self.rows_sent
        return max(0, self.attempts - sent)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "rows_total": self.rows_total,
            "rows_done": self.rows_done,
            "rows_pending": self.rows_pending,
            "by_outcome": {"succeeded": self.succeeded, "failed": self.failed},
            "by_status": dict(self.by_status),
            "by_classification": dict(self.by_classification),
            "attempts": self.attempts,
            "retries": self.retries,
            "latency_ms": dict(self.latency_ms),
        }
        if self.run_id is not None:
            data["run_id"] = self.run_id
        if self.skipped_unchanged is not None:
            data["skipped_unchanged"] = self.skipped_unchanged
        if self.this_call is not None:
            data["this_call"] = self.this_call.to_json()
        if self.updated_at is not None:
            data["updated_at"] = self.updated_at
        if self.requests is not None:
            data["requests"] = self.requests.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        """The summary again from its JSON (an envelope's `data.summary`, `summary.json`)."""
        this_call = data.get("this_call")
        return cls(
            rows_total=data["rows_total"],
            rows_done=data["rows_done"],
            succeeded=data["by_outcome"]["succeeded"],
            failed=data["by_outcome"]["failed"],
            by_status=data["by_status"],
            by_classification=data["by_classification"],
            attempts=data["attempts"],
            latency_ms=data["latency_ms"],
            run_id=data.get("run_id"),
            skipped_unchanged=data.get("skipped_unchanged"),
            this_call=None if this_call is None else ThisCall(**this_call),
            updated_at=data.get("updated_at"),
            requests=RequestCounts.from_json(data.get("requests")),
            rows_sent=_rows_sent(data),
        )


def _rows_sent(data: dict[str, Any]) -> int | None:
    """The rows sent, from the summary's JSON (attempts less retries); None when they are every done row."""
    retries = data.get("retries")
    if not isinstance(retries, int) or data["attempts"] - retries == data["rows_done"]:
        return None
    return int(data["attempts"] - retries)


class SummaryCounts:
    """What the summary reports, counted one committed entry at a time: fed from the journal by
    `summarize`, or by the relay as it commits, so a run that wrote its journal from the start
    need not read it back to summarise it."""

    def __init__(self) -> None:
        self._by_status: Counter[int | None] = Counter()  # named "none" or "200" in the report
        self._by_classification: Counter[str] = Counter()
        self._latency = LatencyHistogram()
        self._ok = self._failed = self._attempts = self._sent = 0

    def add(self, entry: JournalEntry) -> None:
        self.add_all((entry,))

    def add_all(self, entries: Iterable[JournalEntry]) -> None:
        """Count `entries`: the relay's commit hands over a journal batch at a time, so the lookups are
        made once a batch and each row costs its few increments."""
        by_status, by_classification = self._by_status, self._by_classification
        latency = self._latency  # LatencyHistogram.add, inline: this runs once a committed row
        buckets = latency._buckets
        ok = count = attempts = sent = 0
        for entry in entries:
            ok += entry.success
            count += 1
            by_status[entry.status_code] += 1
            by_classification[entry.classification] += 1
            attempts += entry.attempts
            sent += entry.attempts > 0
            milliseconds = entry.duration_ms if entry.latency_ms is None else entry.latency_ms
            buckets[int(milliseconds * _TENTHS)] += 1
        self._ok += ok
        self._failed += count - ok
        self._attempts += attempts
        self._sent += sent
        latency.count += count

    def report(self, total_rows: int) -> RunSummary:
        latency = self._latency
        return RunSummary(
            rows_total=total_rows,
            rows_done=self._ok + self._failed,
            succeeded=self._ok,
            failed=self._failed,
            by_status=dict(
                sorted(
                    ("none" if status is None else str(status), n) for status, n in self._by_status.items()
                )
            ),
            by_classification=dict(sorted(self._by_classification.items())),
            attempts=self._attempts,
            rows_sent=self._sent,
            latency_ms={**latency.percentiles((0.5, 0.95, 0.99)), "max": latency.maximum()},
        )


def summarize(journal: Path, *, total_rows: int) -> RunSummary:
    """Stream the journal once and count everything the summary reports."""
    counts = SummaryCounts()
    for entry in read_journal(journal):
        counts.add(entry)
    return counts.report(total_rows)


def summarized_outcomes(run_dir: Path, *, required: bool = False) -> tuple[int, int] | None:
    """(succeeded, failed) rows as `summary.json` counted them, or None without a summary: what a run
    that completed (or was cancelled) and so keeps no checkpoint has committed. A damaged summary is
    `JournalCorrupt` naming the file and field; so is a missing one when `required`: a run whose every
    row ended wrote its summary before its state, so no crash leaves it without one, and without it
    nothing says how many rows its journal must hold."""
    path = run_dir / "summary.json"
    try:
        data = read_json(path)
    except NotFound:
        if required:
            raise JournalCorrupt(
                f"{path} is missing: the run ended with every row done, so it always has one",
                context={"path": str(path), "reason": "missing"},
            ) from None
        return None
    outcome = JsonFields(path, data, JournalCorrupt).block("by_outcome")
    return outcome.integer("succeeded"), outcome.integer("failed")
