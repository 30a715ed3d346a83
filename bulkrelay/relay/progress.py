"""Progress reporters: a live rich bar on a terminal, a line every 10 s otherwise, or nothing.

The engine calls one reporter and never asks which kind it is (no `if quiet:` branches).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from bulkrelay.relay.ratelimit import Pace

_clock = time.monotonic  # one name for the reporters' clock, which tests replace


@dataclass(frozen=True)
class JobCounts:
    """A bulk run's jobs (request.bulk_job), as its journal records them: every job created on the
    target; of them, those closed and working there (`processing`), those whose results are journaled
    (`done`), and those aborted before they ran (a crash before the close, a refused upload)."""

    created: int = 0
    processing: int = 0
    done: int = 0
    aborted: int = 0
    polls: int = field(default=0, compare=False)  # answered: a job working, the target alive (idleness)

    def to_dict(self) -> dict[str, int]:
        return {
            "created": self.created,
            "processing": self.processing,
            "done": self.done,
            "aborted": self.aborted,
        }


@dataclass(frozen=True)
class Snapshot:
    """Committed progress: only rows whose results are durable count; a bulk run's jobs beside them."""

    total: int
    done: int
    ok: int
    failed: int
    pace: Pace | None = field(default=None, compare=False)  # the limiter's state (`state()`)
    jobs: JobCounts | None = None  # request.bulk_job: its jobs so far

    @property
    def movement(self) -> tuple[int, int]:
        """What changes while a run moves on (the idle watchdog's measure): rows committed, and a bulk
        run's polls answered, as a job can work for hours with no row to commit meanwhile."""
        return self.done, self.jobs.polls if self.jobs is not None else 0

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "done": self.done, "total": self.total, "unit": "rows", "ok": self.ok, "failed": self.failed
        }  # fmt: skip
        if self.jobs is not None:
            data["jobs"] = self.jobs.to_dict()
        return data


def pace_text(pace: Pace, rows_per_second: float | None = None) -> str:
    """The limiter's state in words (and this call's rows/s, when known): the current limit when a 429
    lowered it, and any pause."""
    parts = []
    if rows_per_second is not None:
        parts.append(f"{rows_per_second:,.1f} rows/s")
    if pace.rate_cuts:
        limit = "unlimited" if pace.current_rps is None else f"{pace.current_rps:g}/s"
        of = f" of {pace.configured_rps:g}/s" if pace.configured_rps else ""
        parts.append(f"limit {limit}{of} after {pace.rate_limited_responses} 429s")
    if pace.paused_until:
        parts.append(f"paused until {pace.paused_until}")
    return ", ".join(parts) or "-"


def _pace_suffix(snapshot: Snapshot) -> str:
    """The limiter's state and a bulk run's jobs, after the rows: ", 2 jobs done, 1 processing"."""
    jobs = snapshot.jobs
    said = ""
    if jobs is not None:
        said = f", {jobs.done} of {jobs.created} jobs done, {jobs.processing} processing"
    if snapshot.pace is None:
        return said
    text = pace_text(snapshot.pace)
    return said if text == "-" else f"{said}, {text}"


class _CallRate:
    """Rows per second of this call alone. It counts from the first snapshot, which the engine sends
    before its first row: rows committed by earlier calls (a resume) and the time preflight took
    never enter the rate."""

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None

    def rows_per_second(self, snapshot: Snapshot, now: float) -> float:
        if self._first is None:
            self._first = (now, snapshot.done)
        started, done_before = self._first
        return (snapshot.done - done_before) / max(now - started, 1e-9)


class Reporter(Protocol):
    def update(self, snapshot: Snapshot) -> None: ...

    def close(self) -> None: ...


class NullReporter:
    def update(self, snapshot: Snapshot) -> None:
        pass

    def close(self) -> None:
        pass


class LineReporter:
    """One line on stderr at most every `interval` seconds, for logs and pipes."""

    def __init__(self, stream: TextIO | None = None, interval: float = 10.0) -> None:
        self._stream = stream or sys.stderr
        self._interval = interval
        self._last = _clock()
        self._rate = _CallRate()

    def update(self, snapshot: Snapshot) -> None:
        now = _clock()
        rate = self._rate.rows_per_second(snapshot, now)
        if now - self._last < self._interval:
            return
        self._last = now
        self._stream.write(
            f"bulkrelay: {snapshot.done}/{snapshot.total} rows, {snapshot.ok} ok, "
            f"{snapshot.failed} failed, {rate:,.0f} rows/s{_pace_suffix(snapshot)}\n"
        )
        self._stream.flush()

    def close(self) -> None:
        pass


class BarReporter:
    """A live bar on stderr: rows, ok, failed, rate, ETA."""

    def __init__(self, description: str = "relaying") -> None:
        # rich loads only when there is a terminal to draw on: a pipe or a cron job never pays for it.
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[green]{task.fields[ok]} ok[/] [red]{task.fields[failed]} failed[/]"),
            TextColumn("{task.fields[rate]} rows/s{task.fields[pace]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(description, total=None, ok=0, failed=0, rate="-", pace="")
        self._rate = _CallRate()
        self._started = False

    def update(self, snapshot: Snapshot) -> None:
        if not self._started:  # its drawing thread starts with the first rows: a run's worker
            self._started = True  # processes are forked before it, from one thread (ops/workerfork.py)
            self._progress.start()
        rate = self._rate.rows_per_second(snapshot, _clock())
        self._progress.update(
            self._task,
            total=snapshot.total,
            completed=snapshot.done,
            ok=snapshot.ok,
            failed=snapshot.failed,
            rate=f"{rate:,.0f}",
            pace=_pace_suffix(snapshot),
        )

    def close(self) -> None:
        if self._started:
            self._progress.stop()


class CallbackReporter:
    """Hands every snapshot to a function (the background job's status file)."""

    def __init__(self, callback: Callable[[Snapshot], None]) -> None:
        self._callback = callback

    def update(self, snapshot: Snapshot) -> None:
        self._callback(snapshot)

    def close(self) -> None:
        pass


class FanOut:
    def __init__(self, *reporters: Reporter) -> None:
        self._reporters = reporters

    def update(self, snapshot: Snapshot) -> None:
        for reporter in self._reporters:
            reporter.update(snapshot)

    def close(self) -> None:
        for reporter in self._reporters:
            reporter.close()


def for_stderr(quiet: bool = False) -> Reporter:
    """A bar when stderr is a terminal, periodic lines otherwise, nothing when `quiet` (`--quiet`)."""
    if quiet:
        return NullReporter()
    return BarReporter() if sys.stderr.isatty() else LineReporter()
