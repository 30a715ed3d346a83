"""A Parquet file (`input.file: x.parquet`, or `--input x.parquet`), read row group by row group with
pyarrow, 2,000 rows at a time, into a JSON Lines snapshot, as a query is: memory bounded by a batch of
rows and a row group's encoded pages, not by the file nor the group's decoded rows. Nested
structs and lists become JSON objects and lists; other values map as a query's do (docs/inputs.md).
The file's own bytes are hashed as it is read and must not change while it is: the snapshot's source
names them (`parquet sha256:...`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from bulkrelay.errors import InputInvalid, NotFound, Problem, UsageError
from bulkrelay.job.inputs.query import RowsRead, json_line
from bulkrelay.job.inputs.spec import PARQUET_SOURCE, InputIdentity, input_changed
from bulkrelay.private import open_private

_CHUNK = 1 << 20
_ROWS_TOLD_EVERY = 1000
_BATCH_ROWS = 2000  # rows decoded at a time, as many as a query's server-side cursor fetches


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        raise UsageError(
            "a Parquet input needs pyarrow, which the extra bulkrelay[parquet] installs",
            suggestion="pip install 'bulkrelay[parquet]' (or: uv add 'bulkrelay[parquet]')",
        ) from None
    return pq


def parquet_source(path: Path) -> str:
    """What names a Parquet file's bytes in a run's manifest: their SHA-256 and size."""
    digest, size = hashlib.sha256(), 0
    try:
        with open(path, "rb") as raw:
            while chunk := raw.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        raise NotFound(f"input file not found: {path}", context={"file": str(path)}) from None
    return f"{PARQUET_SOURCE}sha256:{digest.hexdigest()} size:{size}"


def parquet_into(path: Path, dest: Path, on_rows: RowsRead | None = None) -> tuple[int, str]:
    """Write the rows of the Parquet file `path` to a new private (0600) file `dest` as JSON Lines,
    fsynced; the row count and the file's source. A failed snapshot is removed."""
    pq = _pyarrow_parquet()
    before = InputIdentity.of_path(path) if path.exists() else None
    source = parquet_source(path)
    try:
        with open(dest, "xb", opener=open_private) as out:
            count = _write(pq, path, out, on_rows)
            out.flush()
            os.fsync(out.fileno())
        now = InputIdentity.of_path(path)
        if before is not None and now != before:
            raise input_changed(str(path), "while it was being read", before.differences(now))
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return count, source


def _write(pq: Any, path: Path, out: BinaryIO, on_rows: RowsRead | None) -> int:
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's ArrowInvalid and friends: not a Parquet file
        raise InputInvalid([Problem(f"cannot read the Parquet file: {exc}", file=str(path))]) from None
    names = parquet.schema_arrow.names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        problem = Problem(f"the column {twice[0]!r} appears twice", file=str(path), field=twice[0])
        raise InputInvalid([problem])
    count = 0
    kinds = {field.name: str(field.type) for field in parquet.schema_arrow}  # what messages call them
    if on_rows is not None:
        on_rows(0)
    for record in _records(parquet, str(path)):
        count += 1
        try:
            out.write(json_line(record, kinds))
        except (TypeError, ValueError, orjson.JSONEncodeError) as exc:
            raise InputInvalid([Problem(f"{exc}", file=str(path), row=count)]) from None
        if on_rows is not None and not count % _ROWS_TOLD_EVERY:
            on_rows(count)
    if on_rows is not None:
        on_rows(count)
    return count


def _records(parquet: Any, file: str) -> Iterator[dict[str, Any]]:
    """The rows, a row group at a time and within it `_BATCH_ROWS` at a time: a row group is never
    decoded whole (pyarrow's default group is 1,048,576 rows, ~0.6 KiB a row once made Python dicts),
    so memory holds a batch of rows and the group's encoded pages. A reader per group, on one thread:
    one reader over every group grows with the file, and threads decode ahead
    (benchmarks/bench_snapshot.py, docs/performance.md)."""
    first = 1
    in_utc = _in_utc(parquet.schema_arrow)
    for group in range(parquet.num_row_groups):
        for read in parquet.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], use_threads=False):
            batch = read if in_utc is None else read.cast(in_utc)
            try:
                yield from batch.to_pylist()
            except (ValueError, OverflowError):  # a time Python cannot hold: column by column
                columns = [_values(column, _Where(file, first, name)) for name, column in _named(batch)]
                yield from (
                    dict(zip(batch.schema.names, row, strict=True)) for row in zip(*columns, strict=True)
                )
            first += batch.num_rows


def _in_utc(schema: Any) -> Any:
    """The schema with every zoned timestamp in UTC (the same instants), or None when it has none in
    another zone: a zoned timestamp is written in UTC, as a query's `timestamptz` is (docs/inputs.md)."""
    import pyarrow

    def utc(kind: Any) -> Any:
        if _pa_types().is_timestamp(kind) and kind.tz is not None:
            return pyarrow.timestamp(kind.unit, tz="UTC")
        if _pa_types().is_struct(kind):
            return pyarrow.struct([field.with_type(utc(field.type)) for field in kind])
        if _pa_types().is_list(kind) or _pa_types().is_large_list(kind):
            of = pyarrow.list_ if _pa_types().is_list(kind) else pyarrow.large_list
            return of(kind.value_field.with_type(utc(kind.value_type)))
        return kind

    converted = pyarrow.schema([field.with_type(utc(field.type)) for field in schema], schema.metadata)
    return None if converted == schema else converted


def _named(batch: Any) -> Iterator[tuple[str, Any]]:
    return zip(batch.schema.names, batch.columns, strict=True)


@dataclass(frozen=True)
class _Where:
    file: str
    first_row: int  # the row number of the batch's first row
    column: str

    def refused(self, index: int, message: str) -> InputInvalid:
        problem = Problem(f"column {self.column!r}: {message}", file=self.file, row=self.first_row + index)
        return InputInvalid([problem])


def _values(column: Any, where: _Where) -> list[Any]:
    """One column's values as Python and JSON take them. Times are read as the integers Parquet keeps:
    nanoseconds, which Python's `datetime` cannot hold, are written as ISO 8601 with nine digits; a date
    outside the years 1 to 9999 (beyond ISO 8601's four-digit years) is refused naming its row."""
    kind = column.type
    try:
        return list(column.to_pylist())
    except (ValueError, OverflowError):
        pass
    if _pa_types().is_timestamp(kind):
        zoned = kind.tz is not None
        return [_or_refused(where, i, v, lambda v: _timestamp(v, kind.unit, zoned)) for i, v in _ints(column)]
    if _pa_types().is_time(kind):
        return [_or_refused(where, i, v, lambda v: _time_of_day(v, kind.unit)) for i, v in _ints(column)]
    if _pa_types().is_date(kind):
        per_day = 1 if _pa_types().is_date32(kind) else 86_400_000
        return [_or_refused(where, i, v, lambda v: _date(v // per_day)) for i, v in _ints(column)]
    for index in range(len(column)):  # a nested time: refused naming the first row it is in
        try:
            column[index].as_py()
        except (ValueError, OverflowError):
            raise where.refused(index, f"a {kind} value Python cannot hold; write it as text") from None
    raise AssertionError("unreachable: to_pylist failed on no value")


def _pa_types() -> Any:
    import pyarrow.types  # type: ignore[import-untyped]

    return pyarrow.types


def _ints(column: Any) -> Iterator[tuple[int, int | None]]:
    import pyarrow

    width = pyarrow.int32() if column.type.bit_width == 32 else pyarrow.int64()
    return enumerate(column.cast(width).to_pylist())


_PER_SECOND = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}
_EPOCH = datetime(1970, 1, 1)


def _or_refused(where: _Where, index: int, value: int | None, text: Callable[[int], str]) -> str | None:
    if value is None:
        return None
    try:
        return text(value)
    except OverflowError:
        raise where.refused(
            index, "a date outside the years 1 to 9999, which ISO 8601 writes with four digits"
        ) from None


def _timestamp(value: int, unit: str, zoned: bool) -> str:
    """ISO 8601, as `datetime.isoformat` writes it (six digits of a fraction), or with nine digits when
    the value has nanoseconds; a zoned timestamp in UTC, as a query's `timestamptz` is."""
    seconds, fraction = divmod(value, _PER_SECOND[unit])
    moment = _EPOCH + timedelta(seconds=seconds)
    zone = "+00:00" if zoned else ""
    if unit == "ns" and fraction % 1000:
        return f"{moment.isoformat()}.{fraction:09d}{zone}"
    micro = fraction * 1_000_000 // _PER_SECOND[unit]
    return moment.replace(microsecond=micro).isoformat() + zone


def _time_of_day(value: int, unit: str) -> str:
    seconds, fraction = divmod(value, _PER_SECOND[unit])
    clock = (_EPOCH + timedelta(seconds=seconds)).time()
    if unit == "ns" and fraction % 1000:
        return f"{clock.isoformat()}.{fraction:09d}"
    return clock.replace(microsecond=fraction * 1_000_000 // _PER_SECOND[unit]).isoformat()


def _date(days: int) -> str:
    return (_EPOCH + timedelta(days=days)).date().isoformat()
