"""The rows a run sends, found again by their line numbers: the relay parses just those rows.

Preflight notes each selected row (`RowPositions`: its row number, the line it starts on, and a
16-byte token of what it parsed there: for a delta run, of the row's key and request digest, else of
its fields). The relay then reads the input's bytes again, as `InputBytes` checks them, splits them
into lines a chunk at a time (in C), steps over the lines it does not send and parses just the
selected ones (`open_selected`); each must give its token again, and at the end the whole file must
have the SHA-256 preflight read. That costs a small fraction of parsing, rendering and fingerprinting every
record again. A selection that is not sparse keeps no positions (they would take memory, 32 bytes a
row): the relay reads the input through as any run.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import itertools
from array import array
from collections.abc import Callable, Container, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from bulkrelay.errors import InputChanged
from bulkrelay.job.digest import key_text
from bulkrelay.job.inputs import ExpectedInput, InputBytes, InputSpec, open_input_bytes
from bulkrelay.job.preflight import Preflight
from bulkrelay.job.records import Record
from bulkrelay.job.request import RenderError

# Positions are kept while the selection holds at most one row in `DENSE_SHARE` of the rows so far
# (or fewer than `_ALWAYS_KEPT` rows).
DENSE_SHARE = 10
_ALWAYS_KEPT = 1024
# A delta run's changed rows, while no more than this many, are kept whole from preflight and sent
# from memory (about 0.7 KB a row): the relay then reads nothing again, where reading the input back
# to find them cost a third of what sending them does.
KEPT_RECORDS = 16_384
_CHUNK = 1 << 20
_TOKEN_SIZE = 16


def fields_token(fields: dict[str, Any]) -> bytes:
    """The token of a row chosen by its fields (a shard's): what it parsed to, in 16 bytes."""
    return hashlib.blake2b(orjson.dumps(fields), digest_size=_TOKEN_SIZE).digest()


def request_token(key: str, digest: bytes) -> bytes:
    """The token of a row chosen by its request (a delta run's): its key and request digest, which
    fix what goes on the wire, idempotency key included."""
    return hashlib.blake2b(key.encode() + b"\0" + digest, digest_size=_TOKEN_SIZE).digest()


class RowPositions:
    """The selected rows in ascending order, with their lines and tokens (`by_request`: request
    tokens, else fields tokens); or, once the selection has grown dense, nothing (`kept` is False).

    With `keep_records`, each row's record too, while there are at most `KEPT_RECORDS`
    (`records`; None once a row came without one or there were more)."""

    def __init__(self, *, by_request: bool, keep_records: bool = False) -> None:
        self.by_request = by_request
        self.kept = True
        self._rows = array("q")
        self._lines = array("q")
        self._tokens = bytearray()
        self.records: list[Record] | None = [] if keep_records else None

    def add(self, row: int, line: int, token: bytes, record: Record | None = None) -> None:
        if not self.kept:
            return
        count = len(self._rows)
        if count >= _ALWAYS_KEPT and count * DENSE_SHARE > row:
            self.drop()
            return
        self._rows.append(row)
        self._lines.append(line)
        self._tokens += token
        if self.records is not None:
            if record is None or count >= KEPT_RECORDS:
                self.records = None
            else:
                self.records.append(record)

    def drop(self) -> None:
        """Keep no positions: the relay reads the input through."""
        self.kept = False
        self._rows, self._lines, self._tokens = array("q"), array("q"), bytearray()
        self.records = None

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[tuple[int, int, bytes]]:
        """(row number, line, token) of each row, in row order."""
        tokens = memoryview(self._tokens)
        for index, (row, line) in enumerate(zip(self._rows, self._lines, strict=True)):
            yield row, line, bytes(tokens[index * _TOKEN_SIZE : (index + 1) * _TOKEN_SIZE])

    def only(self, rows: Container[int]) -> RowPositions:
        """The positions of the rows in `rows` (a shard's), in the same order."""
        kept = RowPositions(by_request=self.by_request, keep_records=self.records is not None)
        records = self.records if self.records is not None else itertools.repeat(None)
        for (row, line, token), record in zip(self, records, strict=False):
            if row in rows:
                kept.add(row, line, token, record)
        return kept


def _token_function(preflight: Preflight, by_request: bool) -> Callable[[Record], bytes]:
    """How the relay computes a re-read row's token, as preflight did."""
    if not by_request:
        return lambda record: fields_token(record.fields)
    digester, key_field = preflight.digester, preflight.job.config.input.key
    assert digester is not None and key_field is not None  # only a delta job has request tokens
    batcher = preflight.batcher  # a batch job's row renders as its item, as preflight observed it
    render = preflight.renderer.render if batcher is None else (lambda record: batcher.item(record).request)

    def token(record: Record) -> bytes:
        fields = record.fields
        return request_token(key_text(fields.get(key_field)), digester.digest(render(record), fields))

    return token


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

    def __init__(self, spec: InputSpec, source: InputBytes, token_of: Callable[[Record], bytes]) -> None:
        self._token_of = token_of
        self._spec = spec
        self._file = spec.display_name
        self._source = source
        self._lines = _Lines(source)

    def records(self, positions: RowPositions) -> Iterator[Record]:
        headers = self._header() if self._spec.format == "csv" else None
        for row, line, token in positions:
            self._lines.skip_to(line)
            if self._lines.number != line:
                raise self._changed(line, "the line is gone")
            fields = self._csv_fields(line, headers) if headers is not None else self._json_fields(line)
            record = Record(row, line, fields)
            try:
                same = self._token_of(record) == token
            except RenderError as exc:
                raise self._changed(line, f"row {row} does not render any more ({exc.message})") from exc
            if not same:
                raise self._changed(line, f"row {row} is not what preflight read")
            self._source.check()  # a change after the chunk was read stops the relay here, not at the end
            yield record
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
    preflight: Preflight, expected: ExpectedInput | None, positions: RowPositions
) -> Iterator[Iterator[Record]]:
    """The records at `positions` of the input `preflight` read: the ones preflight kept, when it
    kept them (no byte is read again, none can have changed); else from exactly the bytes it read, or
    `InputChanged`: the file is checked after every read and before each row is handed out, each row
    against its token, the whole file's SHA-256 at the end. NotFound if the file is gone."""
    if positions.records is not None:
        yield iter(positions.records)
        return
    assert expected is not None  # positions that were not kept are read back against what preflight read
    spec = preflight.input_spec
    token_of = _token_function(preflight, positions.by_request)
    with open_input_bytes(spec, expected) as source:
        yield _Reader(spec, source, token_of).records(positions)
