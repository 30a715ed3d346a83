"""Progress reporters: a live rich bar on a terminal, a line every 10 s otherwise, or nothing.

The engine calls one reporter and never asks which kind it is (no `if quiet:` branches).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TextIO


@dataclass(frozen=True)
class Snapshot:
    """Committed progress: only rows whose results are durable count."""

    total: int
    done: int
    ok: int
    failed: int

    def to_dict(self) -> dict[str, int | str]:
        return {"done": self.done, "total": self.total, "unit": "rows", "ok": self.ok, "failed": self.failed}


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
        self._started = time.monotonic()
        self._last = self._started

    def update(self, snapshot: Snapshot) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        rate = snapshot.done / max(now - self._started, 1e-9)
        self._stream.write(
            f"bulkrelay: {snapshot.done}/{snapshot.total} rows, {snapshot.ok} ok, "
            f"{snapshot.failed} failed, {rate:,.0f} rows/s\n"
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
            TextColumn("{task.fields[rate]} rows/s"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(description, total=None, ok=0, failed=0, rate="-")
        self._started = time.monotonic()
        self._first_done: int | None = None
        self._progress.start()

    def update(self, snapshot: Snapshot) -> None:
        if self._first_done is None:
            self._first_done = snapshot.done
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = (snapshot.done - self._first_done) / elapsed
        self._progress.update(
            self._task,
            total=snapshot.total,
            completed=snapshot.done,
            ok=snapshot.ok,
            failed=snapshot.failed,
            rate=f"{rate:,.0f}",
        )

    def close(self) -> None:
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
