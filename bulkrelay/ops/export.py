"""`export`: the input rows joined with their latest result.

The latest result of a row is the one in the newest run of the family: the run itself, then its
`retry-failed` children in the order they were made. Results are located by byte offset (8 bytes
a row), and the input is streamed once (twice for `--with-reasons` JSON Lines rows going straight to
their reader: a first pass checks them all), so memory stays small for millions of rows. A file is
written beside itself and replaces the old one at the end: a refused or failed export leaves it as it was.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import stat
import sys
from array import array
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from bulkrelay.envelope import Result
from bulkrelay.errors import InputChanged, OutputClosed, StorageFailed, UsageError
from bulkrelay.job.inputs import InputFingerprint, InputSpec, open_records
from bulkrelay.ops.damage import check_committed_journal
from bulkrelay.ops.results import ExportResult
from bulkrelay.store.atomic import file_to_replace, replacing
from bulkrelay.store.journal import read_entry_at, read_journal_from
from bulkrelay.store.results import Row, iso_time, journal_groups, row_of, sink_job_name, write_rows
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.runs import runs_in
from bulkrelay.store.selection import load_selection

_RESULT_COLUMNS = ("success", "status_code", "classification", "attempts", "error", "run_id")
# A delta run's row that was not sent: an earlier run delivered this very request successfully.
_SKIPPED_UNCHANGED = {"success": True, "classification": "skipped_unchanged", "attempts": 0, "error": None}
# `--failed --with-reasons`: why each row failed, in columns a spreadsheet or `retry` script can read;
# the leading underscore keeps them apart from the input's own fields.
_REASON_COLUMNS = (("_status", "status_code"), ("_error", "error"), ("_attempts", "attempts"))
STDOUT = "-"


def _family(run: RunDir) -> list[RunDir]:
    """The run and its retry-failed descendants, oldest first."""
    children: dict[str, list[RunDir]] = {}
    for other in runs_in(run.path.parent):
        parent = other.plan.parent_run
        if parent:
            children.setdefault(parent, []).append(other)
    family, queue = [], [run]
    while queue:
        current = queue.pop(0)
        family.append(current)
        queue.extend(sorted(children.get(current.run_id, []), key=lambda r: r.run_id))
    return family


class _LatestResults:
    """Where each row's latest result line is: which journal, at which byte offset."""

    def __init__(self, family: list[RunDir], size: int) -> None:
        self._runs = family
        self._offset = array("q", [-1]) * (size + 1)
        self._journal = array("h", [0]) * (size + 1)
        for index, run in enumerate(family):
            self._index(index, run.journal_path)
        self._files = [run.journal_path.open("rb") if run.journal_path.exists() else None for run in family]

    def _index(self, index: int, journal: Path) -> None:
        for offset, _, entry in read_journal_from(journal, 0):
            self._offset[entry.row_number], self._journal[entry.row_number] = offset, index

    def get(self, row: int) -> dict[str, Any] | None:
        offset = self._offset[row]
        if offset < 0:
            return None
        index = self._journal[row]
        handle = self._files[index]
        assert handle is not None
        return {**read_entry_at(handle, offset).as_dict(), "run_id": self._runs[index].run_id}

    def close(self) -> None:
        for handle in self._files:
            if handle is not None:
                handle.close()


def _input_spec(run: RunDir) -> InputSpec:
    recorded = run.plan.input
    path = Path(recorded.path)
    spec = InputSpec.detect(path, recorded.format)
    return spec


def _same_input(run: RunDir, other_dir: Path) -> RunDir:
    """Another shard's run, refused unless it relayed the very same input."""
    other = RunDir.open(other_dir)
    if other.plan.input.sha256 != run.plan.input.sha256:
        raise UsageError(
            f"run {other.run_id} relayed another input than run {run.run_id}: only shards of one input join",
            context={"run_dir": str(other.path)},
        )
    return other


def _joined(
    spec: InputSpec,
    results: _LatestResults,
    failed_only: bool,
    recorded: InputFingerprint,
    delta_selected: RowSet | None = None,
) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    problems: list[object] = []
    with open_records(spec, problems.append) as stream:
        for record in stream:
            result = results.get(record.row_number)
            if result is None and delta_selected is not None and record.row_number not in delta_selected:
                result = {**_SKIPPED_UNCHANGED, "status_code": None, "run_id": None}
            if failed_only and (result is None or result["success"]):
                continue
            yield record.fields, result
        if stream.fingerprint() != recorded or problems:
            raise InputChanged(
                f"the input {spec.path} changed since the run; the export is incomplete",
                context={"path": str(spec.path)},
            )


def _with_reasons(
    rows: Iterator[tuple[dict[str, Any], dict[str, Any] | None]],
) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each failed row with `_status`, `_error`, `_attempts` added after its own fields. A row that
    has a field of that name already is refused, never overwritten: the export is meant to be fixed
    and fed to a new run, and a reason written over an input value would be sent as data."""
    for fields, result in rows:
        taken = [column for column, _ in _REASON_COLUMNS if column in fields]
        if taken:
            raise _reason_column_taken(taken, result)
        found = result or {}
        yield {**fields, **{column: found.get(key) for column, key in _REASON_COLUMNS}}, result


def _refuse_taken_reason_columns(rows: Iterator[tuple[dict[str, Any], dict[str, Any] | None]]) -> None:
    """A first pass over the rows, writing nothing: what `_with_reasons` would refuse midway."""
    for _ in _with_reasons(rows):
        pass


def _reason_column_taken(taken: list[str], result: dict[str, Any] | None) -> UsageError:
    row = None if result is None else result.get("row_number")
    names = ", ".join(taken)
    return UsageError(
        f"--with-reasons would overwrite the input's own field {names} (row {row}): refused",
        context={"fields": taken, "row": row},
        suggestion="export --failed without --with-reasons, or the full export (its columns are result_*)",
    )


def _peeked(rows: Iterator[Any]) -> Iterator[Any]:
    """`rows` with its first item already taken: what it refuses is refused before the output is opened
    (a CSV's fields are its header, the same in every row, so a taken name is found before anything
    is written)."""
    first = next(rows, None)
    return rows if first is None else itertools.chain([first], rows)


def _write(
    out: BinaryIO, fmt: str, rows: Iterator[tuple[dict[str, Any], dict[str, Any] | None]], with_results: bool
) -> int:
    """Write the rows in `fmt`; how many there were."""
    return (_write_csv if fmt == "csv" else _write_jsonl)(out, rows, with_results)


def _write_jsonl(
    out: BinaryIO, rows: Iterator[tuple[dict[str, Any], dict[str, Any] | None]], with_results: bool
) -> int:
    count = 0
    for fields, result in rows:
        count += 1
        out.write(orjson.dumps({"record": fields, "result": result} if with_results else fields) + b"\n")
    return count


def _write_csv(
    out: BinaryIO, rows: Iterator[tuple[dict[str, Any], dict[str, Any] | None]], with_results: bool
) -> int:
    """A header (from the first row's fields) and the rows; no header when there is no row."""
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    writer = csv.writer(text)
    result_columns = [f"result_{c}" for c in _RESULT_COLUMNS] if with_results else []
    count = 0
    try:
        for count, (fields, result) in enumerate(rows, 1):
            if count == 1:
                writer.writerow([*fields, *result_columns])
            writer.writerow([*fields.values(), *(_result_cells(result) if with_results else ())])
    finally:  # detached, never closed: closing the wrapper would close `out`, stdout itself for `-o -`
        text.flush()
        text.detach()
    return count


def _result_cells(result: dict[str, Any] | None) -> list[Any]:
    return ["" if result is None else result.get(c) for c in _RESULT_COLUMNS]


def _streamed(target: Path) -> bool:
    """Whether the export goes straight where it is read (stdout, a FIFO, a device), not into a file
    it can replace once the last row is written."""
    return str(target) == STDOUT or (target.exists() and not target.is_file())


@contextmanager
def _opened(target: Path) -> Iterator[BinaryIO]:
    """The export's destination: standard output for `-o -` (left open for the CLI); a file is
    written beside itself and replaces the old one at the end, so a refused or failed export leaves
    the file as it was (no half-written rows)."""
    if str(target) == STDOUT:
        try:
            yield sys.stdout.buffer
            sys.stdout.buffer.flush()
        except BrokenPipeError:  # the reader went away (`| head`): its choice, not a fault of ours
            _stdout_to_devnull()
            raise OutputClosed(
                "the reader of stdout closed the pipe before the export ended: the rows it got are cut short",
                suggestion="read the whole export, or write it to a file with -o FILE",
            ) from None
        return
    with ExitStack() as stack:
        try:
            out = stack.enter_context(_file(target))
        except (OSError, StorageFailed) as exc:  # the user's path, not a fault of ours: say which and why
            cause = exc.__cause__ if isinstance(exc, StorageFailed) else exc
            reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
            raise UsageError(
                f"cannot write the export to {target}: {reason}",
                context={"output": str(target)},
                suggestion="name with -o a file in a directory you can write to, or - for stdout",
            ) from None
        yield out


@contextmanager
def _file(target: Path) -> Iterator[BinaryIO]:
    """A FIFO or a device is written as it is; a file (through its link, if it is one) is replaced,
    keeping its permissions; a new one is made as `open` makes it (0666 less the umask)."""
    if _streamed(target):
        with target.open("wb") as out:
            yield out
        return
    real = file_to_replace(target, named="-o", suggestion="name with -o a file, or - for stdout")
    kept = stat.S_IMODE(real.stat().st_mode) if real.exists() else None
    with replacing(real, mode=0o666 if kept is None else kept) as out:
        if kept is not None:
            os.fchmod(out.fileno(), kept)  # as the file had it, whatever the umask
        yield out


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the rows still buffered for the closed pipe are dropped when the
    interpreter flushes stdout at exit, instead of failing again there."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def export(
    run_dir: Path,
    *,
    failed_only: bool,
    fmt: str | None,
    output: Path | None,
    with_reasons: bool = False,
    shards: tuple[Path, ...] = (),
) -> Result:
    """Write the joined rows to `output` (`-`: stdout; the CLI then sends the envelope to stderr).

    `shards`: the other shards' run directories of the same input, joined in (rows are disjoint)."""
    run = RunDir.open(run_dir)
    spec = _input_spec(run)
    fmt = fmt or spec.format
    _check_flags(spec, fmt, failed_only=failed_only, with_reasons=with_reasons)
    family = _family(run) + [member for other in shards for member in _family(_same_input(run, other))]
    for member in family:  # the rows after damage would pass for unsent: refuse instead
        check_committed_journal(member, "export")
    total = run.plan.input.record_count
    target = output or run.path / f"{'failed' if failed_only else 'export'}.{fmt}"
    results = _LatestResults(family, total)
    recorded = InputFingerprint.from_dict(run.plan.input.fingerprint())
    sync = run.plan.sync
    delta_selected = load_selection(run.path, total) if sync is not None and not sync.full else None
    rows = _joined(spec, results, failed_only, recorded, delta_selected)
    try:
        if with_reasons:
            if fmt == "jsonl" and _streamed(target):  # rows may differ: each is checked before any is out
                _refuse_taken_reason_columns(_joined(spec, results, failed_only, recorded, delta_selected))
            rows = _peeked(_with_reasons(rows))
        with _opened(target) as out:
            count = _write(out, fmt, rows, not failed_only)
    finally:
        results.close()
    data = ExportResult(
        run_id=run.run_id,
        output=str(target),
        format=fmt,
        rows=count,
        failed_only=failed_only,
        runs=tuple(r.run_id for r in family),
        # a delta run: its unsent rows are in the export as `skipped_unchanged`
        skipped_unchanged=sync.skipped_unchanged if sync is not None else None,
    )
    return Result(data=data)


def export_results(run_dir: Path, *, fmt: str | None, output: Path | None) -> Result:
    """`export --results`: each row's latest outcome in the results sink's columns (store/results.py),
    to stdout unless `output` names a file. A run's rows stream from its journal; a run with
    `retry-failed` children keeps one row a row number in memory, the newest."""
    run = RunDir.open(run_dir)
    family = _family(run)
    for member in family:
        check_committed_journal(member, "export")
    fmt = fmt or "csv"
    target = output or Path(STDOUT)
    rows = _result_rows(family)
    with _opened(target) as out:
        count = write_rows(out, rows, fmt)
    runs = tuple(r.run_id for r in family)
    return Result(data=ExportResult(run.run_id, str(target), fmt, count, failed_only=False, runs=runs))


def _result_rows(family: list[RunDir]) -> Iterator[Row]:
    def rows_of(member: RunDir) -> Iterator[Row]:
        job = sink_job_name(member)
        for entries, t, _ in journal_groups(member.journal_path, 0):
            at = iso_time(t)
            for entry in entries:
                yield row_of(job, member.run_id, entry, at)

    if len(family) == 1:
        yield from rows_of(family[0])
        return
    latest: dict[int, Row] = {}
    for member in family:  # oldest first: a child's outcome replaces its parent's
        latest.update((row[2], row) for row in rows_of(member))
    yield from (latest[number] for number in sorted(latest))


def _check_flags(spec: InputSpec, fmt: str, *, failed_only: bool, with_reasons: bool) -> None:
    if with_reasons and not failed_only:
        raise UsageError(
            "--with-reasons adds _status, _error, _attempts to --failed rows; the full export has them",
            suggestion="add --failed",
        )
    if failed_only and fmt != spec.format:
        raise UsageError(
            "--failed writes rows in the input's own format", suggestion=f"use --format {spec.format}"
        )
