"""How far one worker process may run ahead of the slowest (`execution.workers`), and which of its
rows have their results.

The run's process judges the halt rules over every worker's rows in row order (ops/workers.py): it
holds each result above the lowest row some worker has not yet answered (the turn), and the failures
of a streak not yet broken. Were a worker free to run ahead of a slow one without end, what the parent
holds would grow without end, and so would the rows a kill -9 of the parent leaves sent and not
journaled above the journal's highest row, which the next call must doubt (relay/earliersends.py).
So a worker takes no row more than `run_ahead_rows` above the turn the parent last told it: a
worker behind never waits (its rows are the turn), and two workers at one pace never notice. The
worker tells the parent below which row it has settled from the rows its slots hold (two stores a row).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio

from bulkrelay.relay.stopping import StopControl

_LOOK_AGAIN_SECONDS = 0.05  # a waiting slot sees a stop this soon


def run_ahead_rows(concurrency: int) -> int:
    """The bound: far above what a few milliseconds of results at full speed, and every row in flight,
    put between two workers at one pace."""
    return max(2048, 16 * concurrency)


class RunAhead:
    """A worker's rows against the run's turn: the row each of its slots holds, whence the row below
    which it has settled (every row it took below it has its result handed on), and the bound on the
    rows it takes, moved by the turns the parent tells it."""

    def __init__(self, rows: int, on_wait: Callable[[], None]) -> None:
        self.rows = rows
        self._turn: float = 0
        self._moved = anyio.Event()
        self._slots: list[list[float]] = []
        self._on_wait = on_wait  # a slot waits: the parent must hear where this worker stands

    def slot(self) -> list[float]:
        """A slot's cell: its row while in flight, the row + 1 once its result is handed on, 0 before
        it takes one, `math.inf` once no row is left for it. Every slot has one before any takes a row."""
        cell: list[float] = [0]
        self._slots.append(cell)
        return cell

    @property
    def settled(self) -> float:
        """The lowest row a slot holds in flight, or one past a slot's last row: no row below it that
        this worker took waits for its result (a row it takes next is above every row it took)."""
        return min((cell[0] for cell in self._slots), default=0)

    def heard(self, turn: float | None) -> None:
        """The parent's turn (None: every worker has ended but this one, which waits on no one)."""
        turn = math.inf if turn is None else turn
        if turn > self._turn:
            self._turn = turn
            self._moved.set()
            self._moved = anyio.Event()

    def allows(self, row: int) -> bool:
        """Whether `row` is within the bound now (asked a row: no await)."""
        return row <= self._turn + self.rows

    async def wait_for(self, row: int, stop: StopControl) -> bool:
        """Whether `row` may be sent: at once when it is within the bound, once the turn moves up to
        it otherwise; False when the run is asked to stop meanwhile."""
        self._on_wait()  # its settled row may be all the turn waits for (the first rows of a resume)
        while row > self._turn + self.rows:
            if stop.requested:
                return False
            with anyio.move_on_after(_LOOK_AGAIN_SECONDS):
                await self._moved.wait()
        return True
