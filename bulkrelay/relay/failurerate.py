"""`halt.failure_rate`: stop a call whose committed rows fail too often, judged in row order.

Rows complete out of order (a window of workers), so judging results as they arrive would halt at a
different row each time under load. The share is therefore counted over this call's rows in the order
the workers took them, which is row order: a result is counted only once every row before it has its
own. The rule is judged from the `after_rows`-th row on; the first row at which more than `above` of
the rows so far failed requests the stop, so the halt falls at the same row however the answers
interleave. The counts are this call's: a resume after the cause was fixed starts them again. With
`execution.workers` each worker counts its own rows (relay/engine.py `relay_share`), and the halt's
detail names it (ops/workers.py).
"""

from __future__ import annotations

from collections import Counter, deque

from bulkrelay.job.config import FailureRateHalt
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry


class FailureRate:
    """Counts this call's final results in row order and requests HALT_FAILURE_RATE when due."""

    def __init__(self, rule: FailureRateHalt, stop: StopControl) -> None:
        self._above = rule.above
        self._after = rule.after_rows
        self._stop = stop
        self._order: deque[int] = deque()  # rows taken and not counted yet, in row order
        self._ended: dict[int, JournalEntry] = {}  # their results that arrived ahead of their turn
        self.rows = 0
        self.failed = 0
        self._errors: Counter[tuple[str, int | None]] = Counter()  # (classification, status) of failures
        self._texts: dict[tuple[str, int | None], str | None] = {}  # an error text of each

    def taken(self, row: int) -> None:
        """A worker took `row` (workers take rows in row order)."""
        self._order.append(row)

    def ended(self, entry: JournalEntry) -> None:
        """`entry` is a final result bound for the journal; count every result whose turn has come."""
        order, ended = self._order, self._ended
        ended[entry.row_number] = entry
        while order and order[0] in ended:
            self._count(ended.pop(order.popleft()))

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
