"""`halt.consecutive_failures`: halt a call whose target looks down, judged in row order.

With `execution.workers` the run's process judges the streak over every worker's results
(`WorkersFailureStreak`, ops/workers.py): each worker hands every result on (`Unjudged`).
"""

from __future__ import annotations

import math
from typing import Protocol

from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry


class Streak(Protocol):
    def admit(self, entry: JournalEntry) -> list[JournalEntry]: ...
    def release(self) -> list[JournalEntry]: ...


class FailureStreak:
    """Holds back the results of a run of consecutive transport errors and 5xx, counted in row order.

    Rows complete out of order (a window of workers), so arrival order would let a late success of
    an earlier row end a streak that follows it, and journal 503s of a target that is down as final.
    The streak is therefore the failures of rows after the last row, in row order, that ended
    otherwise (the breaker); a row still in flight does not break it. When the streak reaches
    `halt.consecutive_failures` the run halts and the held rows are never journaled, so a resume
    sends them again. A breaker releases the held failures before it (in row order) as final.
    """

    _STREAK_CLASSES = frozenset({"http_server_error", "timeout_error", "connect_error", "protocol_error"})

    def __init__(self, limit: int, stop: StopControl) -> None:
        self._limit = limit
        self._stop = stop
        self._held: list[JournalEntry] = []  # all after the breaker, in completion order
        self._breaker = 0  # the highest row number that ended other than in a streak failure
        self._turn = math.inf  # held failures of rows below it count (one process: all of them)

    def admit(self, entry: JournalEntry) -> list[JournalEntry]:
        """The entries to journal now, given one more final result."""
        if self._stop.reason is StopReason.HALT_UNAVAILABLE:
            return [entry] if entry.success else []
        row = entry.row_number
        if entry.classification not in self._STREAK_CLASSES:
            self._breaker = max(self._breaker, row)
            if not self._held:  # the common case: nothing held back, nothing to sort out
                return [entry]
            released = [held for held in self._held if held.row_number < row]
            self._held = [held for held in self._held if held.row_number > row]
            return [*released, entry]
        if row < self._breaker:
            return [entry]  # a later row already ended otherwise: this failure belongs to no streak
        self._held.append(entry)
        self._judge()
        return []

    def release(self) -> list[JournalEntry]:
        """At the end: held results are real final results unless the target was declared down."""
        held, self._held = self._held, []
        return [] if self._stop.reason is StopReason.HALT_UNAVAILABLE else held

    def _judge(self) -> None:
        """Halt once the streak is `limit` long: the held failures of rows below `_turn` (one process:
        all of them, the last one held being the `limit`-th), named by the `limit`-th in row order."""
        if self._limit <= 0:
            return
        if self._turn == math.inf:
            streak = self._held
        else:
            streak = sorted((held for held in self._held if held.row_number < self._turn), key=_row)
        if len(streak) >= self._limit:
            last = streak[self._limit - 1]
            self._stop.request_target_down(self._limit, last.classification, last.error)
            self._held = []


class WorkersFailureStreak(FailureStreak):
    """The streak over every worker's rows (`execution.workers`), judged in the run's process. Each
    worker's rows run ahead of or behind the others', so a failure counts only once every worker has
    settled the rows below it (`settled_below`): the streak is then failures with no row between them
    that ended otherwise, in row order over the whole call, whatever the workers' pace."""

    def __init__(self, limit: int, stop: StopControl) -> None:
        super().__init__(limit, stop)
        self._turn = 0

    def settled_below(self, turn: float) -> None:
        """Every row below `turn` has its result here."""
        self._turn = turn
        self._judge()


def _row(entry: JournalEntry) -> int:
    return entry.row_number


class Unjudged:
    """A worker's streak: none. Its results go to the run's process, which judges the streak over every
    worker's rows; a worker judging its own would halt on failures that other workers' rows break."""

    def admit(self, entry: JournalEntry) -> list[JournalEntry]:
        return [entry]

    def release(self) -> list[JournalEntry]:
        return []
