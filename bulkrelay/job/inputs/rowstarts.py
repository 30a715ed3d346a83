"""Where the rows of an input start (CSV or JSON Lines), so that a worker process parses only its own rows.

Preflight notes the physical line on which every `chunk`-th row starts (rows 1, chunk + 1, 2 chunk + 1,
...): one number for `chunk` rows, so memory stays small (8 bytes for 32 rows; the chunk doubles past
`_MOST_STARTS` entries). A run in several worker processes (`execution.workers`) gives chunk `c` to
worker `c mod N` (`ChunkShare`). Each worker still reads every byte of the input, checked region by
region against what preflight read (raw.GuardedReader), but steps over the lines of the other workers'
chunks without parsing them: a row's parse is most of what reading it costs, and with N workers
each would otherwise parse N times the rows it sends. Since the bytes are the ones preflight read, a
row starts on the line preflight saw it start on, and the rows stepped over are the ones it counted.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

_FIRST_CHUNK = 32  # rows: small beside the run-ahead bound (relay/runahead.py) over 8 workers
_MOST_STARTS = 1 << 20  # 8 MiB of line numbers at most: past them, the chunk doubles


@dataclass(frozen=True)
class RowStarts:
    """The line on which row `c * chunk + 1` starts, for each chunk `c` of the input."""

    chunk: int
    lines: array[int]


class RowStartsBuilder:
    """Fed the start line of each row preflight reads in turn (`add` at the rows `next_row` names)."""

    def __init__(self) -> None:
        self._chunk = _FIRST_CHUNK
        self._lines: array[int] = array("q")
        self.next_row = 1  # the row whose start line is wanted next

    def add(self, line: int) -> None:
        """Row `next_row` starts on `line`."""
        self._lines.append(line)
        if len(self._lines) > _MOST_STARTS:
            self._lines = self._lines[::2]
            self._chunk *= 2
        self.next_row = len(self._lines) * self._chunk + 1

    def starts(self) -> RowStarts:
        return RowStarts(self._chunk, self._lines)


@dataclass(frozen=True)
class ChunkShare:
    """The chunks of rows worker `index` of `count` parses (chunk `c` is worker `c mod count`'s), of an
    input of `rows` rows whose chunks start where `starts` says."""

    starts: RowStarts
    index: int
    count: int
    rows: int

    def owns(self, row: int) -> bool:
        return ((row - 1) // self.starts.chunk) % self.count == self.index

    def step_to_own(self, chunk: int) -> int | None:
        """The first chunk from `chunk` on that is this worker's; None when there is none."""
        own = chunk + (self.index - chunk) % self.count
        return own if own < len(self.starts.lines) else None


def step_over(lines: Iterator[bytes], count: int) -> None:
    """Consume `count` lines of `lines` without looking at them (in C)."""
    deque(islice(lines, count), maxlen=0)
