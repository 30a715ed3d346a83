"""One streaming pass over an input: its format's reader over the (decompressed) bytes, the raw bytes
hashed as they are read (compressed bytes for .gz), records yielded one at a time, bad records reported
through a callback and skipped, so memory stays flat however large the file is. Row numbers count records
from 1 and stay stable: a bad record still consumes its row number.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from bulkrelay.job.inputs.csv import CsvReader
from bulkrelay.job.inputs.jsonl import JsonlReader
from bulkrelay.job.inputs.lines import READ_BUFFER
from bulkrelay.job.inputs.raw import GZIP_ERRORS, GuardedReader, HashingReader, damaged, open_raw
from bulkrelay.job.inputs.rowstarts import ChunkShare, RowStarts, RowStartsBuilder
from bulkrelay.job.inputs.spec import (
    ExpectedInput,
    InputFingerprint,
    InputIdentity,
    InputSpec,
    ProblemSink,
    RegionDigests,
    changed_values,
    input_changed,
)
from bulkrelay.job.records import Record

# How many records a verified reader hands out between two checks that its file is unchanged (a
# check is one fstat; each region read is checked too, before its bytes can reach a record).
_CHECK_EVERY = 64


class RecordStream:
    """The records of one input, read once. After a full iteration `fingerprint()` describes the file."""

    def __init__(
        self,
        spec: InputSpec,
        raw: io.FileIO,
        on_problem: ProblemSink,
        expected: ExpectedInput | None = None,
        share: ChunkShare | None = None,
    ) -> None:
        self._spec = spec
        self._file = spec.display_name
        self._report = on_problem
        self._expected = expected
        # Preflight's pass notes where the rows start; a worker's pass parses its own rows only.
        self._starts = RowStartsBuilder() if expected is None else None
        self._share = share if expected is not None else None
        self._opened = InputIdentity.of(raw.fileno())
        self._guard = None if expected is None else GuardedReader(raw, expected, self._file)
        self._hashing = HashingReader(raw) if self._guard is None else self._guard
        self._gzip: gzip.GzipFile | None = None
        source: BinaryIO = io.BufferedReader(self._hashing, READ_BUFFER)
        if spec.gzip:
            self._gzip = gzip.GzipFile(fileobj=source, mode="rb")
            source = io.BufferedReader(self._gzip, READ_BUFFER)
        self._binary = source
        self._started = False
        self._row_count: int | None = None

    @property
    def bytes_read(self) -> int:
        """Raw bytes read from the file so far (for progress against the file size)."""
        return self._hashing.size

    def __iter__(self) -> Iterator[Record]:
        if self._started:
            raise RuntimeError("a RecordStream can be iterated only once")
        self._started = True
        return self._records()

    def fingerprint(self) -> InputFingerprint:
        if self._row_count is None:
            raise RuntimeError("fingerprint() needs the stream read to the end first")
        return InputFingerprint(
            format=self._spec.format,
            gzip=self._spec.gzip,
            sha256=self._hashing.sha256(),
            size=self._hashing.size,
            record_count=self._row_count,
        )

    def row_starts(self) -> RowStarts | None:
        """Where the input's rows start (after a full first pass, like `fingerprint`)."""
        if self._row_count is None:
            raise RuntimeError("row_starts() needs the stream read to the end first")
        return None if self._starts is None else self._starts.starts()

    def regions(self) -> RegionDigests:
        """The digest of each region of the raw bytes (after a full iteration, like `fingerprint`)."""
        if self._row_count is None:
            raise RuntimeError("regions() needs the stream read to the end first")
        return self._hashing.regions.digests()

    def identity(self) -> InputIdentity:
        """The file as this stream read it; `InputChanged` if it changed while it was being read."""
        now = self._hashing.identity()
        if now != self._opened:
            raise input_changed(self._file, "while it was being read", self._opened.differences(now))
        return now

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()
        self._hashing.close()

    def _records(self) -> Iterator[Record]:
        rows = self._format_records()
        if self._guard is not None and self._expected is not None:
            rows = self._verified(rows, self._guard.check, self._expected.fingerprint.record_count)
        count = 0
        try:
            count = yield from rows
        except GZIP_ERRORS as exc:  # damage found while reading the header or first line
            self._report(damaged(self._file, exc))
        if self._share is not None:
            count = self._share.rows  # the rows stepped over count: the bytes are the ones preflight read
        self._hashing.drain()
        self._row_count = count
        if self._expected is not None:
            self._verify_end(self._expected.fingerprint)

    def _verified(
        self, rows: Iterator[Record], check: Callable[[], None], limit: int
    ) -> Generator[Record, None, int]:
        """The records, with the file checked every few of them (so a change stops the relay soon even
        when the rest of the input is already buffered), and none past preflight's record count."""
        count = 0
        for count, record in enumerate(rows, 1):
            if count > limit:
                raise input_changed(
                    self._file, "during the run", {"record_count": {"recorded": limit, "now": count}}
                )
            if not count % _CHECK_EVERY:
                check()
            yield record
        return count

    def _verify_end(self, expected: InputFingerprint) -> None:
        """At the end, the bytes read must be the bytes preflight read (a change the file's size and
        modification time did not show is caught here, if nowhere before)."""
        changed = changed_values(expected.to_dict(), self.fingerprint().to_dict())
        if changed:
            raise input_changed(self._file, "during the run", changed)

    def _format_records(self) -> Generator[Record, None, int]:
        starts, share = self._starts, self._share
        if self._spec.format == "csv":
            reader = CsvReader(
                self._binary, self._file, self._report, self._spec.delimiter, starts=starts, share=share
            )
            return reader.records()
        # A query's answer may hold no row: "every order changed since yesterday" is empty on a quiet
        # night, and that night's run is a run of no rows. A file (a Parquet file too) may not.
        empty = self._spec.query_answer
        jsonl = JsonlReader(
            self._binary, self._file, self._report, may_be_empty=empty, starts=starts, share=share
        )
        return jsonl.records()


@contextmanager
def open_records(
    spec: InputSpec,
    on_problem: ProblemSink,
    expected: ExpectedInput | None = None,
    share: ChunkShare | None = None,
) -> Iterator[RecordStream]:
    """Open an input for one streaming pass. Raises NotFound if the file is missing; closes it on exit.

    With `expected` (what preflight read), the stream reads exactly those bytes or raises
    `InputChanged`: at the open, at every region (before any of its bytes reaches a record), every few
    records, and at the end. With `share` too (a worker's), the other workers' rows are not parsed."""
    raw = open_raw(spec)
    try:
        stream = RecordStream(spec, raw, on_problem, expected, share)
    except BaseException:
        raw.close()
        raise
    try:
        yield stream
    finally:
        stream.close()
