"""The rows a run sends, found again by their line numbers: the relay parses just those rows.

Preflight notes each selected row (`RowPositions`: its row number, the line it starts on, and a hash
of the fields it parsed there). The relay then reads the input's bytes again, as `InputBytes` checks
them, but only counts the newlines of the lines it does not send (in C, a chunk at a time) and parses
just the selected ones (`open_selected`); each must parse to the fields preflight hashed, and at the
end the whole file must have the SHA-256 preflight read. Counting newlines costs a small fraction of
reading, parsing and fingerprinting every record again. A selection that is not sparse keeps no
positions (they would take memory, 24 bytes a row): the relay reads the input through as any run.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import itertools
from array import array
from collections.abc import Container, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from bulkrelay.errors import InputChanged
from bulkrelay.job.inputs import ExpectedInput, InputBytes, InputSpec, open_input_bytes
from bulkrelay.job.records import Record

# Positions are kept while the selection holds at most one row in `DENSE_SHARE` of the rows so far
# (or fewer than `_ALWAYS_KEPT` rows).
DENSE_SHARE = 10
_ALWAYS_KEPT = 1024
_CHUNK = 1 << 20
_HASH_SIZE = 16


def fields_hash(fields: dict[str, Any]) -> bytes:
    """What a row parsed to, in 16 bytes: the relay's reading must give the same."""
    return hashlib.blake2b(orjson.dumps(fields), digest_size=_HASH_SIZE).digest()


class RowPositions:
    """The selected rows in ascending order, with their lines and fields hashes; or, once the
    selection has grown dense, nothing (`kept` is False)."""

    def __init__(self) -> None:
        self.kept = True
        self._rows = array("q")
        self._lines = array("q")
        self._hashes = bytearray()

    def add(self, record: Record) -> None:
        if not self.kept:
            return
        count = len(self._rows)
        if count >= _ALWAYS_KEPT and count * DENSE_SHARE > record.row_number:
            self.drop()
            return
        self._rows.append(record.row_number)
        self._lines.append(record.line)
        self._hashes += fields_hash(record.fields)

    def drop(self) -> None:
        """Keep no positions: the relay reads the input through."""
        self.kept = False
        self._rows, self._lines, self._hashes = array("q"), array("q"), bytearray()

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[tuple[int, int, bytes]]:
        """(row number, line, fields hash) of each row, in row order."""
        hashes = memoryview(self._hashes)
        for index, (row, line) in enumerate(zip(self._rows, self._lines, strict=True)):
            yield row, line, bytes(hashes[index * _HASH_SIZE : (index + 1) * _HASH_SIZE])

    def only(self, rows: Container[int]) -> RowPositions:
        """The positions of the rows in `rows` (a shard's), in the same order."""
        kept = RowPositions()
        for row, line, digest in self:
            if row in rows:
                kept._rows.append(row)
                kept._lines.append(line)
                kept._hashes += digest
        return kept


class _Lines:
    """The lines of an input by number. A chunk at a time is split into lines (in C); lines before
    the one asked for are stepped over by index, never parsed."""

    def __init__(self, source: InputBytes) -> None:
        self._source = source
        self._lines: list[bytes] = []  # the lines of the current chunk, without their newline
        self._index = 0  # the next of them
        self._tail = b""  # an unfinished last line, waiting for the next chunk
        self._unterminated = False  # the file ends in a line without a newline: `_lines[-1]`
        self.number = 1  # the number of the line at `_index`

    def skip_to(self, line: int) -> None:
        while self.number < line:
            available = len(self._lines) - self._index
            if line - self.number < available:
                self._index += line - self.number
                self.number = line
                return
            self._index += available
            self.number += available
            if not self._fill():
                return

    def readline(self) -> bytes:
        """The next line with its newline as in the file (b"" at the end)."""
        while self._index >= len(self._lines):
            if not self._fill():
                return b""
        line = self._lines[self._index]
        self._index += 1
        self.number += 1
        last = self._unterminated and self._index == len(self._lines)
        return line if last else line + b"\n"

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def _fill(self) -> bool:
        """The next chunk's lines; False at the end of the input."""
        if self._unterminated:
            return False
        chunk = self._source.read(_CHUNK)
        if not chunk:
            if not self._tail:
                return False
            self._lines, self._tail, self._unterminated = [self._tail], b"", True
        else:
            self._lines = (self._tail + chunk).split(b"\n")
            self._tail = self._lines.pop()
        self._index = 0
        return True


class _Reader:
    """Parses the selected rows of one input as preflight did, and checks each against its hash."""

    def __init__(self, spec: InputSpec, source: InputBytes) -> None:
        self._spec = spec
        self._file = spec.display_name
        self._source = source
        self._lines = _Lines(source)

    def records(self, positions: RowPositions) -> Iterator[Record]:
        headers = self._header() if self._spec.format == "csv" else None
        for row, line, digest in positions:
            self._lines.skip_to(line)
            if self._lines.number != line:
                raise self._changed(line, "the line is gone")
            fields = self._csv_fields(line, headers) if headers is not None else self._json_fields(line)
            if fields_hash(fields) != digest:
                raise self._changed(line, f"row {row} is not what preflight read")
            self._source.check()  # a change after the chunk was read stops the relay here, not at the end
            yield Record(row, line, fields)
        self._source.finish()

    def _header(self) -> list[str]:
        first = self._lines.readline()
        if first.startswith(codecs.BOM_UTF8):
            first = first[len(codecs.BOM_UTF8) :]
        return self._csv_row(itertools.chain((first,) if first else (), self._lines), 1)

    def _csv_fields(self, line: int, headers: list[str]) -> dict[str, Any]:
        row = self._csv_row(self._lines, line)
        if len(row) != len(headers):
            raise self._changed(line, f"{len(row)} fields where the header has {len(headers)}")
        return dict(zip(headers, row, strict=True))

    def _csv_row(self, lines: Iterable[bytes], line: int) -> list[str]:
        """The first non-blank CSV row of `lines` (a quoted field may take several)."""
        reader = csv.reader(map(bytes.decode, lines), delimiter=self._spec.delimiter, strict=True)
        try:
            row = next((row for row in reader if row), None)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise self._changed(line, f"cannot be read as CSV any more ({exc})") from exc
        if row is None:
            raise self._changed(line, "the row is gone")
        return row

    def _json_fields(self, line: int) -> dict[str, Any]:
        raw = self._lines.readline()
        if line == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise self._changed(line, f"invalid JSON ({exc.msg})") from exc
        if type(value) is not dict:
            raise self._changed(line, "not a JSON object any more")
        return value

    def _changed(self, line: int, what: str) -> InputChanged:
        return InputChanged(
            f"{self._file} changed during the run: line {line}: {what}",
            context={"file": self._file, "line": line},
            suggestion="restore the input as preflight read it, or start a new run",
        )


@contextmanager
def open_selected(
    spec: InputSpec, expected: ExpectedInput, positions: RowPositions
) -> Iterator[Iterator[Record]]:
    """The records at `positions`, from exactly the bytes preflight read, or `InputChanged`: the file
    is checked after every read, each row against its hash, the whole file's SHA-256 at the end.
    Raises NotFound if the file is gone; closes it on exit."""
    with open_input_bytes(spec, expected) as source:
        yield _Reader(spec, source).records(positions)
