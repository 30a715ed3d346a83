"""`halt.failure_rate`: stop a call whose committed rows fail too often, judged in row order.

Rows complete out of order (a window of workers), so judging results as they arrive would halt at a
different row each time under load. The share is therefore counted over this call's rows in the order
the workers took them, which is row order: a result is counted only once every row before it has its
own. The rule is judged from the `after_rows`-th row on; the first row at which more than `above` of
the rows so far failed requests the stop, so the halt falls at the same row however the answers
interleave. The counts are this call's: a resume after the cause was fixed starts them again.

With `execution.workers` the rule is the run's, judged in the run's process over every worker's rows
in row order (`WorkersFailureRate`), so it halts at the row one process would halt at. Each worker takes
its rows in row order and tells, with its results, below which row all it took has ended
(relay/runahead.py); a result is counted once every worker has settled the rows below it (ops/workers.py).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from typing import Protocol

from bulkrelay.job.config import FailureRateHalt
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry


class RowOrder(Protocol):
    """What a window tells of its rows: each taken (in row order), each result final."""

    def taken(self, row: int) -> None: ...
    def ended(self, entry: JournalEntry) -> None: ...


class _Counts:
    """This call's final results, counted in row order by the caller; requests HALT_FAILURE_RATE when due."""

    def __init__(self, rule: FailureRateHalt, stop: StopControl) -> None:
        self._above = rule.above
        self._after = rule.after_rows
        self._stop = stop
        self.rows = 0
        self.failed = 0
        self._errors: Counter[tuple[str, int | None]] = Counter()  # (classification, status) of failures
        self._texts: dict[tuple[str, int | None], str | None] = {}  # an error text of each

    def _count(self, entry: JournalEntry) -> None:
        self.rows += 1
        if not entry.success:
            self.failed += 1
            kind = (entry.classification, entry.status_code)
            self._errors[kind] += 1
            self._texts.setdefault(kind, entry.error)
        if self.rows >= self._after and self.failed > self._above * self.rows and not self._stop.requested:
            self._stop.request(StopReason.HALT_FAILURE_RATE, **self.detail(entry.row_number))

    def detail(self, row: int) -> dict[str, object]:
        """The halt's context: the counts when it fired, the rule, and the commonest error."""
        (kind, count), *_ = self._errors.most_common(1)
        classification, status = kind
        return {
            "rows": self.rows,
            "failed": self.failed,
            "failure_rate": round(self.failed / self.rows, 4),
            "above": self._above,
            "after_rows": self._after,
            "row": row,
            "commonest_error": {
                "classification": classification,
                "status_code": status,
                "error": self._texts[kind],
                "rows": count,
            },
        }


class FailureRate(_Counts):
    """The rule over one window's rows, counted in the order its slots took them."""

    def __init__(self, rule: FailureRateHalt, stop: StopControl) -> None:
        super().__init__(rule, stop)
        self._order: deque[int] = deque()  # rows taken and not counted yet, in row order
        self._ended: dict[int, JournalEntry] = {}  # their results that arrived ahead of their turn

    def taken(self, row: int) -> None:
        """A slot took `row` (the slots take rows in row order)."""
        self._order.append(row)

    def ended(self, entry: JournalEntry) -> None:
        """`entry` is a final result bound for the journal; count every result whose turn has come."""
        order, ended = self._order, self._ended
        ended[entry.row_number] = entry
        while order and order[0] in ended:
            self._count(ended.pop(order.popleft()))


class WorkersFailureRate(_Counts):
    """The rule over every worker's rows (`execution.workers`), judged in the run's process: results
    arrive from each worker out of order, and each is counted once every worker has settled the rows
    below it (`count_below`), which is row order over the whole call."""

    def __init__(self, rule: FailureRateHalt, stop: StopControl) -> None:
        super().__init__(rule, stop)
        self._waiting: list[tuple[int, JournalEntry]] = []  # a heap by row number

    def ended(self, entry: JournalEntry) -> None:
        heapq.heappush(self._waiting, (entry.row_number, entry))

    def count_below(self, turn: float) -> None:
        """Every row below `turn` has its result here: count those waiting, in row order."""
        waiting = self._waiting
        while waiting and waiting[0][0] < turn:
            self._count(heapq.heappop(waiting)[1])
