"""A Parquet file (`input.file: x.parquet`, or `--input x.parquet`), read row group by row group with
pyarrow, 2,000 rows at a time, into a JSON Lines snapshot, as a query is: memory bounded by a batch of
rows and a row group's encoded pages, not by the file nor the group's decoded rows. Nested
structs and lists become JSON objects and lists; other values map as a query's do (docs/inputs.md).
The file's own bytes are hashed as it is read and must not change while it is: the snapshot's source
names them (`parquet sha256:...`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
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
    if on_rows is not None:
        on_rows(0)
    for record in _records(parquet):
        count += 1
        try:
            out.write(json_line(record))
        except (TypeError, ValueError, orjson.JSONEncodeError) as exc:
            raise InputInvalid([Problem(f"{exc}", file=str(path), row=count)]) from None
        if on_rows is not None and not count % _ROWS_TOLD_EVERY:
            on_rows(count)
    if on_rows is not None:
        on_rows(count)
    return count


def _records(parquet: Any) -> Iterator[dict[str, Any]]:
    """The rows, a row group at a time and within it `_BATCH_ROWS` at a time: a row group is never
    decoded whole (pyarrow's default group is 1,048,576 rows, ~0.6 KiB a row once made Python dicts),
    so memory holds a batch of rows and the group's encoded pages. A reader per group, on one thread:
    one reader over every group grows with the file, and threads decode ahead
    (benchmarks/bench_snapshot.py, docs/performance.md)."""
    for group in range(parquet.num_row_groups):
        for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group], use_threads=False):
            yield from batch.to_pylist()
