"""The rows a run sends, found again by their byte offsets: no second pass over the whole input.

Preflight notes where each selected row starts (`RowPositions`: its row and line number, offset, and
a hash of the fields it parsed there). The relay then reads just those rows (`open_selected`), and
only while the file is the one preflight read: same device, inode, size and modification time,
checked when it opens the file, after every read and at the end; each row read must parse to the
fields preflight hashed. Anything else raises `InputChanged`. A selection that is not sparse keeps
no positions: reading the input through costs less than seeking to every tenth row.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import os
from array import array
from collections.abc import Container, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from bulkrelay.errors import InputChanged, NotFound
from bulkrelay.job.inputs import ExpectedInput, InputIdentity, InputSpec, input_changed
from bulkrelay.job.records import Record

# Positions are kept while the selection holds at most one row in `DENSE_SHARE` of the rows so far
# (or fewer than `_ALWAYS_KEPT` rows): beyond that, one sequential pass is cheaper than the seeks.
DENSE_SHARE = 10
_ALWAYS_KEPT = 1024
_BLOCK = 4096  # bytes read at a time from a row's offset: a row or a few, rarely more


def fields_hash(fields: dict[str, Any]) -> bytes:
    """What a row parsed to, in 16 bytes: the relay's reading must give the same."""
    return hashlib.blake2b(orjson.dumps(fields), digest_size=16).digest()


class RowPositions:
    """Where each selected row starts, in ascending row order, 40 bytes a row; or, once the
    selection has grown dense (or a row had no offset: gzip), nothing (`kept` is False)."""

    def __init__(self) -> None:
        self.kept = True
        self._rows = array("q")
        self._lines = array("q")
        self._offsets = array("q")
        self._hashes = bytearray()

    def add(self, record: Record, offset: int | None) -> None:
        if not self.kept:
            return
        if offset is None or (len(self._rows) >= _ALWAYS_KEPT and len(self._rows) * DENSE_SHARE > record[0]):
            self.drop()
            return
        self._rows.append(record.row_number)
        self._lines.append(record.line)
        self._offsets.append(offset)
        self._hashes += fields_hash(record.fields)

    def drop(self) -> None:
        """Keep no positions: the relay reads the input through."""
        self.kept = False
        self._rows, self._lines, self._offsets, self._hashes = array("q"), array("q"), array("q"), bytearray()

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[tuple[int, int, int, bytes]]:
        """(row number, line, offset, fields hash) of each row."""
        hashes = self._hashes
        for index, (row, line, offset) in enumerate(zip(self._rows, self._lines, self._offsets, strict=True)):
            yield row, line, offset, bytes(hashes[index * 16 : index * 16 + 16])

    def only(self, rows: Container[int]) -> RowPositions:
        """The positions of the rows in `rows` (a shard's), in the same order."""
        kept = RowPositions()
        for row, line, offset, digest in self:
            if row in rows:
                kept._rows.append(row)
                kept._lines.append(line)
                kept._offsets.append(offset)
                kept._hashes += digest
        return kept


class _Reader:
    """Reads rows at their offsets from one open file, checked against what preflight read."""

    def __init__(self, fd: int, spec: InputSpec, expected: ExpectedInput) -> None:
        self._fd = fd
        self._spec = spec
        self._file = spec.display_name
        self._expected = expected.identity
        self.check()

    def check(self) -> None:
        now = InputIdentity.of(self._fd)
        if now != self._expected:
            raise input_changed(self._file, "during the run", self._expected.differences(now))

    def lines_at(self, offset: int) -> Iterator[bytes]:
        """The lines from `offset` on, never past the size preflight read, the file checked after
        every read (before its bytes can reach a record)."""
        end = self._expected.size
        pending = b""
        while offset < end:
            block = os.pread(self._fd, min(_BLOCK, end - offset), offset)
            self.check()
            if not block:
                break
            offset += len(block)
            pending += block
            start = 0
            while (cut := pending.find(b"\n", start)) >= 0:
                yield pending[start : cut + 1]
                start = cut + 1
            pending = pending[start:]
        if pending:
            yield pending

    def header(self) -> list[str]:
        lines = self.lines_at(0)
        first = next(lines, b"")
        if first.startswith(codecs.BOM_UTF8):
            first = first[len(codecs.BOM_UTF8) :]
        return self._csv_row(_chain(first, lines), 1)

    def _csv_row(self, lines: Iterator[bytes], line: int) -> list[str]:
        """The first non-blank CSV row of `lines`."""
        try:
            reader = csv.reader(map(bytes.decode, lines), delimiter=self._spec.delimiter, strict=True)
            row = next((row for row in reader if row), None)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise self._changed(line, f"cannot read the row any more ({exc})") from exc
        if row is None:
            raise self._changed(line, "the row is gone")
        return row

    def fields_at(self, offset: int, line: int, headers: list[str] | None) -> dict[str, Any]:
        if headers is not None:
            row = self._csv_row(self.lines_at(offset), line)
            if len(row) != len(headers):
                raise self._changed(line, f"{len(row)} fields where the header has {len(headers)}")
            return dict(zip(headers, row, strict=True))
        raw = next(self.lines_at(offset), b"")
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

    def records(self, positions: RowPositions) -> Iterator[Record]:
        headers = self.header() if self._spec.format == "csv" else None
        for row, line, offset, digest in positions:
            fields = self.fields_at(offset, line, headers)
            if fields_hash(fields) != digest:
                raise self._changed(line, f"row {row} is not what preflight read")
            yield Record(row, line, fields)
        self.check()


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


@contextmanager
def open_selected(
    spec: InputSpec, expected: ExpectedInput, positions: RowPositions
) -> Iterator[Iterator[Record]]:
    """The records at `positions`, read from exactly the file preflight read, or `InputChanged`.
    Raises NotFound if the file is gone; closes it on exit."""
    try:
        fd = os.open(spec.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NotFound(
            f"input file not found: {spec.display_name}", context={"file": spec.display_name}
        ) from exc
    except OSError as exc:
        raise InputChanged(
            f"{spec.display_name} cannot be read any more: {exc.strerror or exc}",
            context={"file": spec.display_name},
            suggestion="restore the input as preflight read it, or start a new run",
        ) from exc
    try:
        yield _Reader(fd, spec, expected).records(positions)
    finally:
        os.close(fd)
