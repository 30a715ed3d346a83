"""`halt.consecutive_failures`: halt a call whose target looks down, judged in row order.

With `execution.workers` the run's process judges the streak over every worker's results
(`WorkersFailureStreak`, ops/workers.py): each worker hands every result on (`Unjudged`).
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry

STREAK_CLASSES = frozenset({"http_server_error", "timeout_error", "connect_error", "protocol_error"})


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

    def __init__(self, limit: int, stop: StopControl) -> None:
        self._limit = limit
        self._stop = stop
        self._held: list[JournalEntry] = []  # all after the breaker, in completion order
        self._breaker = 0  # the highest row number that ended other than in a streak failure

    def admit(self, entry: JournalEntry) -> list[JournalEntry]:
        """The entries to journal now, given one more final result."""
        if self._stop.reason is StopReason.HALT_UNAVAILABLE:
            return [entry] if entry.success else []
        row = entry.row_number
        if entry.classification not in STREAK_CLASSES:
            self._breaker = max(self._breaker, row)
            if not self._held:  # the common case: nothing held back, nothing to sort out
                return [entry]
            released = [held for held in self._held if held.row_number < row]
            self._held = [held for held in self._held if held.row_number > row]
            return [*released, entry]
        if row < self._breaker:
            return [entry]  # a later row already ended otherwise: this failure belongs to no streak
        self._held.append(entry)
        if self._limit > 0 and len(self._held) >= self._limit:
            self._stop.request_target_down(len(self._held), entry.classification, entry.error)
            self._held = []
        return []

    def release(self) -> list[JournalEntry]:
        """At the end: held results are real final results unless the target was declared down."""
        held, self._held = self._held, []
        return [] if self._stop.reason is StopReason.HALT_UNAVAILABLE else held


class WorkersFailureStreak:
    """The streak over every worker's rows (`execution.workers`), judged in the run's process. Each
    worker's rows run ahead of or behind the others', so nothing is judged by arrival: every failure of
    the streak's kinds is held, every other result goes to the journal at once and is noted as a
    breaker, and once every worker has settled the rows below the turn (`settled_below`) they are
    walked in row order: a breaker releases the failures before it as final, and `limit` failures in a
    row halt the run, whatever the workers' pace."""

    def __init__(self, limit: int, stop: StopControl) -> None:
        self._limit = limit
        self._stop = stop
        self._failures: list[tuple[int, JournalEntry]] = []  # held, not yet walked: a heap by row
        self._breakers: list[int] = []  # rows not yet walked that ended otherwise: a heap
        self._streak: list[JournalEntry] = []  # walked failures since the last breaker, in row order

    def admit(self, entry: JournalEntry) -> list[JournalEntry]:
        """The entries to journal now, given one more final result."""
        if self._stop.reason is StopReason.HALT_UNAVAILABLE:
            return [entry] if entry.success else []
        if entry.classification in STREAK_CLASSES:
            heapq.heappush(self._failures, (entry.row_number, entry))
            return []
        heapq.heappush(self._breakers, entry.row_number)
        return [entry]

    def settled_below(self, turn: float) -> list[JournalEntry]:
        """Every row below `turn` has its result here: walk them in row order; the failures a breaker
        released, final, to journal."""
        released: list[JournalEntry] = []
        failures, breakers = self._failures, self._breakers
        while self._stop.reason is not StopReason.HALT_UNAVAILABLE:
            failure = failures[0][0] if failures and failures[0][0] < turn else math.inf
            breaker = breakers[0] if breakers and breakers[0] < turn else math.inf
            if failure == breaker == math.inf:
                break
            if breaker < failure:
                heapq.heappop(breakers)
                released += self._streak
                self._streak = []
            else:
                self._streak.append(heapq.heappop(failures)[1])
                self._judge()
        return released

    @property
    def held_from(self) -> float:
        """The lowest row whose failure is held (not final yet): the failure rate counts only below it."""
        walked = self._streak[0].row_number if self._streak else math.inf
        return min(walked, self._failures[0][0] if self._failures else math.inf)

    def release(self) -> list[JournalEntry]:
        """At the end: held results are real final results unless the target was declared down."""
        held = [*self._streak, *(entry for _, entry in sorted(self._failures, key=_first))]
        self._streak, self._failures = [], []
        return [] if self._stop.reason is StopReason.HALT_UNAVAILABLE else held

    def _judge(self) -> None:
        if 0 < self._limit <= len(self._streak):
            last = self._streak[self._limit - 1]
            self._stop.request_target_down(self._limit, last.classification, last.error)
            self._streak, self._failures, self._breakers = [], [], []


def _first(pair: tuple[int, JournalEntry]) -> int:
    return pair[0]


class Unjudged:
    """A worker's streak: none. Its results go to the run's process, which judges the streak over every
    worker's rows; a worker judging its own would halt on failures that other workers' rows break."""

    def admit(self, entry: JournalEntry) -> list[JournalEntry]:
        return [entry]

    def release(self) -> list[JournalEntry]:
        return []
