"""CSV with a header row: RFC 4180 quoting (strict), values as strings, each record reported at the
physical line where it starts."""

from __future__ import annotations

import csv
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from bulkrelay.errors import Problem
from bulkrelay.job.inputs.lines import MAX_LINE_BYTES, TOO_LONG, lines_of, too_long_message
from bulkrelay.job.inputs.raw import GZIP_ERRORS, damaged
from bulkrelay.job.inputs.rowstarts import ChunkShare, RowStartsBuilder, step_over
from bulkrelay.job.inputs.spec import ProblemSink, no_records
from bulkrelay.job.records import Record

if TYPE_CHECKING:
    from _csv import Reader as _CsvReader

_COMPILED_WIDTH = 1000  # a CSV header wider than this makes its rows' dicts with dict(zip(...))

# The csv module's own field limit (128 KiB) would refuse a value the line limit allows (a JSON blob in
# a column); a value as long as a line is read, and a record's size is bounded below (`_RecordLines`).
csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE_BYTES))


class _RecordTooLong(Exception):
    """A record (a quoted value over many lines) past the line limit: raised through the csv reader."""


class _RecordLines:
    """The decoded lines fed to the csv reader, counting the bytes of the record being read: a quoted
    value that never closes would otherwise gather the rest of the file into one record."""

    def __init__(self, lines: Iterable[bytes], limit: int = MAX_LINE_BYTES) -> None:
        self._lines = iter(lines)
        self._limit = limit
        self.used = 0  # bytes read since the last record ended (the caller resets it)

    def __iter__(self) -> Iterator[str]:
        return self  # an iterator object, not a generator: a line that fails to decode ends no reading

    def __next__(self) -> str:
        line = next(self._lines)
        self.used += len(line)
        if self.used > self._limit:
            raise _RecordTooLong
        return line.decode()

    def step_over(self, count: int) -> None:
        """Pass `count` lines by, undecoded, between two records (the csv reader reads none ahead)."""
        step_over(self._lines, count)


class CsvReader:
    """The records of a CSV text, bad records reported to `report` and skipped.

    `starts` (preflight's) hears where every few rows start; with `share` (a worker's, over the bytes
    preflight read) only that worker's chunks of rows are parsed, the others' lines stepped over
    (job/inputs/rowstarts.py)."""

    def __init__(
        self,
        binary: BinaryIO,
        file: str,
        report: ProblemSink,
        delimiter: str,
        *,
        starts: RowStartsBuilder | None = None,
        share: ChunkShare | None = None,
    ) -> None:
        self._binary = binary
        self._file = file
        self._report = report
        self._delimiter = delimiter
        self._starts = starts
        self._share = share

    def records(self) -> Generator[Record, None, int]:  # noqa: PLR0912, PLR0915 (one loop a row, kept whole)
        """CSV with a header row. `reader.line_num` counts physical lines, which gives each record's start."""
        lines = _RecordLines(lines_of(self._binary))
        reader = csv.reader(lines, delimiter=self._delimiter, strict=True)
        headers = self._csv_header(reader)
        if headers is None:
            return 0
        lines.used = 0
        width = len(headers)
        fields_of = _row_to_fields(headers)
        new_record = tuple.__new__  # Record(...) would go through a Python-level __new__
        row_number = 0
        skipped = 0  # lines the csv reader never saw (undecodable, or stepped over): line_num misses them
        end = reader.line_num
        starts, share = self._starts, self._share
        mark = -1 if starts is None else starts.next_row  # the row whose start line preflight notes next
        boundary = -1  # a worker's: the last row of the chunk of its own it reads
        if share is not None:
            at = self._own_chunk(share, 0, lines, end)
            if at is None:
                return share.rows
            row_number, boundary, end, skipped = at[0], at[1], at[2], skipped + at[2] - end
        while True:
            try:
                for row in reader:
                    lines.used = 0
                    start = end + 1
                    end = reader.line_num + skipped
                    if not row:  # a blank line, skipped like csv.DictReader does
                        continue
                    row_number += 1
                    if len(row) != width:
                        self._report(self._ragged(row, width, start, row_number))
                        continue
                    if row_number == mark:
                        assert starts is not None  # mark is -1 without them
                        starts.add(start)
                        mark = starts.next_row
                    yield new_record(Record, (row_number, start, fields_of(row)))
                    if row_number == boundary:  # the end of a chunk of ours: on to the next
                        assert share is not None  # boundary is -1 without it
                        at = self._own_chunk(share, row_number // share.starts.chunk, lines, end)
                        if at is None:
                            return share.rows
                        row_number, boundary, end, skipped = at[0], at[1], at[2], skipped + at[2] - end
                break
            except (UnicodeDecodeError, csv.Error) as exc:
                lines.used = 0
                row_number += 1
                end, skipped = self._bad_record(exc, reader.line_num, row_number, end, skipped)
            except GZIP_ERRORS as exc:
                self._report(damaged(self._file, exc))
                return row_number
            except _RecordTooLong:
                self._report(self._too_long(end + 1, row_number + 1))
                return row_number + 1
        if row_number == 0:
            self._report(no_records(self._file))
        return row_number

    def _bad_record(
        self, exc: UnicodeDecodeError | csv.Error, line_num: int, row_number: int, end: int, skipped: int
    ) -> tuple[int, int]:
        """Report row `row_number`, which the csv reader failed to read up to its `line_num`: (the
        line it ends on, the lines the csv reader missed so far)."""
        if isinstance(exc, UnicodeDecodeError):  # the line never reached the csv reader
            skipped += 1
            self._report(self._undecodable(exc, line_num + skipped, row_number))
        else:
            message = f"malformed CSV: {_csv_error(exc)}"
            self._report(Problem(message, file=self._file, line=end + 1, row=row_number))
        return line_num + skipped, skipped

    @staticmethod
    def _own_chunk(
        share: ChunkShare, chunk: int, lines: _RecordLines, end: int
    ) -> tuple[int, int, int] | None:
        """Step over the lines after line `end` up to the start of this worker's next chunk from
        `chunk` on: (the row before that chunk's first, the chunk's last row, the line before its
        start); None when no chunk is left to it (the stream still reads and checks the rest)."""
        own = share.step_to_own(chunk)
        if own is None:
            return None
        line, size = share.starts.lines[own], share.starts.chunk
        lines.step_over(line - 1 - end)
        return own * size, (own + 1) * size, line - 1

    def _csv_header(self, reader: _CsvReader) -> list[str] | None:
        """The header row (the first non-blank line), or None after reporting why the file cannot be read."""
        try:
            headers = next((row for row in reader if row), None)
        except _RecordTooLong:
            self._report(self._too_long(1, None))
            return None
        except UnicodeDecodeError as exc:
            self._report(self._undecodable(exc, reader.line_num + 1, None))
            return None
        except csv.Error as exc:
            self._report(
                Problem(f"malformed CSV header: {_csv_error(exc)}", file=self._file, line=reader.line_num)
            )
            return None
        if headers is None:
            self._report(no_records(self._file))
            return None
        line = reader.line_num
        seen: set[str] = set()
        for column, name in enumerate(headers, 1):
            if not name.strip():
                self._report(Problem(f"header column {column} has no name", file=self._file, line=line))
                return None
            if name in seen:
                self._report(Problem("duplicate header", file=self._file, line=line, field=name))
                return None
            seen.add(name)
        return headers

    def _too_long(self, line: int, row_number: int | None) -> Problem:
        return Problem(
            f"the record is longer than {MAX_LINE_BYTES:,} bytes (a quoted value that does not close?); "
            "reading stops",
            file=self._file,
            line=line,
            row=row_number,
        )

    def _ragged(self, row: list[str], width: int, line: int, row_number: int) -> Problem:
        return Problem(
            f"expected {width} fields (as in the header), got {len(row)}",
            file=self._file,
            line=line,
            row=row_number,
        )

    def _undecodable(self, exc: UnicodeDecodeError, line: int, row: int | None) -> Problem:
        """A line that does not decode, or one too long to read (its stand-in, TOO_LONG, does not)."""
        if exc.object == TOO_LONG:
            return Problem(too_long_message(), file=self._file, line=line, row=row)
        return Problem(
            f"invalid UTF-8: {exc.reason} at byte {exc.start + 1} of the line",
            file=self._file,
            line=line,
            row=row,
        )


def _row_to_fields(headers: list[str]) -> Callable[[list[str]], dict[str, str]]:
    """What makes a CSV row (as wide as the header) its fields: one dict display, `{_0: r[0], ...}`,
    about twice as fast as `dict(zip(headers, row))`. The header's names are bound in the function's
    namespace, never written into its code."""
    if len(headers) > _COMPILED_WIDTH:
        return lambda row: dict(zip(headers, row, strict=True))
    namespace: dict[str, Any] = {f"_{column}": name for column, name in enumerate(headers)}
    display = ", ".join(f"_{column}: r[{column}]" for column in range(len(headers)))
    exec(compile(f"def fields(r):\n    return {{{display}}}\n", "<bulkrelay csv row>", "exec"), namespace)
    fields: Callable[[list[str]], dict[str, str]] = namespace["fields"]
    return fields


def _csv_error(exc: csv.Error) -> str:
    """The csv module's complaint in the user's terms: its advice about Python's newline mode means
    a carriage return outside quotes, which a file with CR-only line ends has on every line."""
    if "new-line character seen in unquoted field" in str(exc):
        return (
            "a carriage return (\\r) outside quotes: lines that end in CR alone (an old Mac format) "
            "must end in LF or CRLF, and a CR inside a value needs the value quoted"
        )
    return str(exc)
