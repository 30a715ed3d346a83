"""JSON Lines: one JSON object per line, every line a row (so row number and line number agree), values
keeping their JSON types; an integer orjson would read as a float is refused naming its line."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from typing import BinaryIO

import orjson

from bulkrelay.errors import Problem
from bulkrelay.job.inputs.lines import TOO_LONG, line_blocks, too_long_message
from bulkrelay.job.inputs.raw import GZIP_ERRORS, damaged
from bulkrelay.job.inputs.rowstarts import ChunkShare, RowStartsBuilder
from bulkrelay.job.inputs.spec import ProblemSink, no_records
from bulkrelay.job.records import Record

_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
# orjson reads an integer beyond its 64-bit range as a float (a 30-digit id would go out as 1.2e+29):
# a line with a run of 19 digits is read again, its integers checked (the fewest digits out of range
# is 19, -9999999999999999999). The run is found by mapping every digit to "0", then a substring
# search, over a block of lines at once (a regular expression took five times as long).
_DIGITS_AS_ZEROS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_INTEGER_RANGE = (-(1 << 63), (1 << 64) - 1)


class _OutOfRange(ValueError):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class JsonlReader:
    """The records of a JSON Lines text, bad lines reported to `report` and skipped.

    `starts` (preflight's) hears where every few rows start, as for a CSV (here each on its own line);
    with `share` (a worker's, over the bytes preflight read) only the lines of that worker's chunks of
    rows are parsed (job/inputs/rowstarts.py)."""

    def __init__(
        self,
        binary: BinaryIO,
        file: str,
        report: ProblemSink,
        *,
        may_be_empty: bool = False,
        starts: RowStartsBuilder | None = None,
        share: ChunkShare | None = None,
    ) -> None:
        self._binary = binary
        self._file = file
        self._report = report
        self._may_be_empty = may_be_empty
        self._starts = starts
        self._share = share

    def records(self) -> Generator[Record, None, int]:
        """One JSON object per line; every line is a row, so row number and line number agree."""
        if self._share is not None:
            return (yield from self._shared_records(self._share))
        starts = self._starts
        line = 0
        try:
            for block in line_blocks(self._binary):
                first = line + 1
                line += len(block)
                if starts is not None:
                    while starts.next_row <= line:
                        starts.add(starts.next_row)  # the row starts on the line of its number
                yield from self._block_records(block, first, first, line)
        except GZIP_ERRORS as exc:
            self._report(damaged(self._file, exc))
            return line
        if line == 0 and not self._may_be_empty:
            self._report(no_records(self._file))
        return line

    def _shared_records(self, share: ChunkShare) -> Generator[Record, None, int]:
        """The records of this worker's chunks of rows; the other lines are not parsed."""
        size = share.starts.chunk
        own = share.step_to_own(0)
        line = 0
        for block in line_blocks(self._binary):
            if own is None:
                break  # none left to it: the stream still reads and checks the rest
            first = line + 1
            line += len(block)
            while own is not None and own * size < line:  # this block holds rows of chunk `own`
                low, high = own * size + 1, (own + 1) * size
                yield from self._block_records(block, first, max(low, first), min(high, line))
                if high > line:
                    break  # the chunk goes on in the next block
                own = share.step_to_own(own + 1)
        return share.rows

    def _block_records(self, block: list[bytes], first: int, low: int, high: int) -> Iterator[Record]:
        """The records of lines `low` to `high` of `block`, whose first line is line `first`."""
        loads = orjson.loads
        new_record = tuple.__new__  # Record(...) would go through a Python-level __new__
        lines = block[low - first : high - first + 1]
        # The long-run search once a block: per line it cost two thirds as much as orjson.loads.
        suspect = _LONG_RUN in b"".join(lines).translate(_DIGITS_AS_ZEROS)
        for line, raw in enumerate(lines, low):
            try:
                value = loads(raw)
            except orjson.JSONDecodeError as exc:
                self._report(self._json_problem(raw, exc, line))
                continue
            if type(value) is not dict:
                self._report(self._not_an_object(value, line))
                continue
            if suspect and (problem := self._integer_out_of_range(raw, line)):
                self._report(problem)
                continue
            yield new_record(Record, (line, line, value))

    def _integer_out_of_range(self, raw: bytes, line: int) -> Problem | None:
        """The problem of a line holding an integer that orjson would have read as a float."""
        shown = integer_beyond_64_bits(raw)
        if shown is None:
            return None
        message = f"the integer {shown} is outside the 64-bit range (send it as a string)"
        return Problem(message, file=self._file, line=line, row=line)

    def _not_an_object(self, value: object, line: int) -> Problem:
        kind = "null" if value is None else _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
        return Problem(f"expected a JSON object, got {kind}", file=self._file, line=line, row=line)

    def _json_problem(self, raw: bytes, exc: orjson.JSONDecodeError, line: int) -> Problem:
        if raw is TOO_LONG:
            return Problem(too_long_message(), file=self._file, line=line, row=line)
        if not raw.strip():
            return Problem("blank line", file=self._file, line=line, row=line)
        return Problem(f"invalid JSON: {exc.msg} at column {exc.colno}", file=self._file, line=line, row=line)


def integer_beyond_64_bits(text: bytes | str) -> str | None:
    """The first integer of the JSON `text` that orjson reads as a float (shortened to 40 characters), or
    None: a JSON Lines line, or a `type: json` value, is checked before its value is taken."""
    raw = text.encode() if isinstance(text, str) else text
    if _LONG_RUN not in raw.translate(_DIGITS_AS_ZEROS):
        return None
    low, high = _INTEGER_RANGE

    def checked(digits: str) -> int:
        if len(digits.lstrip("-")) > 20:  # past the range (JSON has no leading zeros); int() stops at 4,300
            raise _OutOfRange(digits)
        number = int(digits)
        if not low <= number <= high:
            raise _OutOfRange(digits)
        return number

    try:
        json.loads(raw, parse_int=checked)
    except _OutOfRange as exc:
        return exc.text if len(exc.text) <= 40 else f"{exc.text[:37]}..."
    except ValueError:  # stricter than orjson somewhere: orjson's reading stands
        return None
    return None
