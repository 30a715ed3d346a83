"""The results sink (`results: {to, table}`): each row's latest outcome, upserted by (job, key).

The journal is the source of truth; the sink lags it. While a run relays, a process of its own reads
the run's committed groups back from the journal and upserts them (store/sinkfeed.py), so the relay
never waits on the sink nor spends its CPU on it; before and after the relay the runs of the job catch
the sink up from their journals (`catch_up`), starting where each run's `results-sink.json` says the
sink got to. Both read the journal the same way (`upsert_groups`). Writing a row twice changes nothing, and
an older outcome never overwrites a newer one (`updated_at`, the time its group was committed, is
compared), so catching up in any order, or again, leaves the same table.

A sink that is locked or unreachable raises `SinkUnavailable`: the caller turns it into a warning
and the journal catches the sink up later. Nothing here knows the job file: the target comes
resolved (`SinkTarget`).

A CSV or JSON Lines sink is appended to as groups commit (under a lock file beside it), then
compacted to one line per (job, key) when a catch-up ends, by an atomic replace.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import os
import re
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Literal, Protocol
from urllib.parse import urlsplit

import orjson

from bulkrelay.errors import NotFound, RunLocked
from bulkrelay.private import open_private
from bulkrelay.store.atomic import read_json, write_atomic, write_json_atomic
from bulkrelay.store.journal import (
    JournalEntry,
    decode_line,
    decode_marker,
    is_commit_marker,
)
from bulkrelay.store.journal.jobrecords import is_job_record
from bulkrelay.store.manifest import RunState
from bulkrelay.store.rundir import JOURNAL, RunDir, is_locked
from bulkrelay.store.runs import runs_in
from bulkrelay.store.storage import Storage

COLUMNS = (
    "job",
    "key",
    "row_number",
    "run_id",
    "success",
    "classification",
    "status_code",
    "attempts",
    "error",
    "captured",
    "updated_at",
)
PROGRESS_FILE = "results-sink.json"  # in the run directory: {"sink": identity, "offset": journal bytes fed}
DEFAULT_TABLE = "bulkrelay_results"
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")
LOCK_WAIT_SECONDS = 2.0  # how long a write waits for another writer of the same table before giving up
_CHUNK_ROWS = 5000  # rows a catch-up upserts at once

Row = tuple[Any, ...]  # one value per column, in COLUMNS order
_FINISHED = (RunState.COMPLETED, RunState.COMPLETED_WITH_FAILURES)


class SinkUnavailable(Exception):
    """The sink cannot be written now (locked, unreachable, refused): `reason` says why."""

    def __init__(self, identity: str, reason: str) -> None:
        super().__init__(f"{identity}: {reason}")
        self.identity = identity
        self.reason = reason


@dataclass(frozen=True)
class SinkTarget:
    """Where results go: `kind`, `identity` (shown: no credentials), `url` (may hold a password:
    never shown), `path` (a SQLite database or a file) and `table`."""

    kind: Literal["sqlite", "postgresql", "csv", "jsonl"]
    identity: str
    url: str
    table: str = DEFAULT_TABLE
    path: Path | None = None

    def __repr__(self) -> str:  # the URL may hold a password: never in a traceback or a log
        return f"SinkTarget({self.identity!r})"


def iso_time(t: float) -> str:
    """A commit time as the sink keeps it: UTC, microseconds, sortable as text."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def row_of(job: str, run_id: str, entry: JournalEntry, updated_at: str) -> Row:
    """The sink's row of one journal entry; a row without a key is keyed by its row number."""
    key = entry.key
    if type(key) is not str:
        key = str(entry.row_number) if key is None else orjson.dumps(key).decode()
    captured = None if entry.captured is None else orjson.dumps(entry.captured).decode()
    return (
        job,
        key,
        entry.row_number,
        run_id,
        entry.success,
        entry.classification,
        entry.status_code,
        entry.attempts,
        entry.error,
        captured,
        updated_at,
    )


def as_record(row: Row) -> dict[str, Any]:
    """A row as a JSON object (`captured` parsed back)."""
    record = dict(zip(COLUMNS, row, strict=True))
    if isinstance(record["captured"], str):
        record["captured"] = orjson.loads(record["captured"])
    record["success"] = bool(record["success"])
    return record


# ---------------------------------------------------------------- the journal, read as sink rows


def journal_groups(
    journal: Path, offset: int, end: int | None = None
) -> Iterator[tuple[list[JournalEntry], float, int]]:
    """(entries, commit time, offset after its marker) for each whole group from byte `offset` (to
    `end`, a group's end, when given). A group whose marker is not on disk (a torn tail a resume will
    move aside) is not yielded; a bulk job's record between groups is skipped; a journal written
    before commit markers has one group, timed by the file's change time."""
    if not journal.exists():
        return
    if offset > journal.stat().st_size:
        offset = 0  # its torn tail was moved aside since: read it again (nothing changes twice)
    group: list[JournalEntry] = []
    marked = False
    with journal.open("rb") as stream:
        stream.seek(offset)
        for line in iter(stream.readline, b""):
            offset += len(line)
            if is_commit_marker(line):
                marker = decode_marker(line)
                assert marker is not None  # is_commit_marker decoded it
                marked = True
                yield group, marker.t, offset
                group = []
            elif is_job_record(line):
                pass  # written between groups: it holds no row
            else:
                try:
                    group.append(decode_line(line)[1])
                except ValueError:
                    break
            if end is not None and offset >= end:
                break
    if group and not marked:
        yield group, journal.stat().st_mtime, offset


# ---------------------------------------------------------------- writers, one a kind


class SinkWriter(Protocol):
    def upsert(self, rows: Sequence[Row]) -> None: ...
    def finish(self) -> None: ...  # after a catch-up: compact a file; nothing for a table
    def close(self) -> None: ...


def _quoted(table: str) -> str:
    return ".".join(f'"{part}"' for part in table.split("."))


def _json_upsert_sql(table: str) -> str:
    """The upsert of rows given as one JSON array of arrays (SQLite's `json_each`): the statement
    runs as one step, which takes Python's lock back once a group, not once a row. When the sink was
    fed from a thread beside the relay, `executemany` starved it of the lock, row after row; in the
    feeder's process (store/sinkfeed.py) the two cost the same (about 7 µs of CPU a row)."""
    values = ", ".join(f"json_extract(value, '$[{n}]')" for n in range(len(COLUMNS)))
    return _upsert_of(table, f"SELECT {values} FROM json_each(?) WHERE true")  # `true`: SQLite's grammar


def _pg_upsert_sql(table: str) -> str:
    """The upsert of rows given as one JSON array of arrays (PostgreSQL's `json_array_elements`): a
    group is one statement and one round trip, not one a row (with `executemany`, one a row)."""
    types = (
        "",
        "",
        "::bigint",
        "",
        "::boolean",
        "",
        "::integer",
        "::integer",
        "",
        "::jsonb",
        "::timestamptz",
    )
    values = ", ".join(f"(r ->> {n}){cast}" for n, cast in enumerate(types))
    return _upsert_of(table, f"SELECT {values} FROM json_array_elements(%s::json) AS r")


def _newest_a_key(rows: Sequence[Row]) -> Sequence[Row]:
    """Each (job, key) once, its newest row (of two as old, the later): what writing them in turn
    leaves, for a statement that may not touch a row twice (PostgreSQL's ON CONFLICT)."""
    latest: dict[tuple[Any, Any], Row] = {}
    for row in rows:
        known = latest.get((row[0], row[1]))
        if known is None or row[-1] >= known[-1]:
            latest[row[0], row[1]] = row
    return rows if len(latest) == len(rows) else list(latest.values())


def _upsert_of(table: str, rows: str) -> str:
    updates = ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[2:])
    return (
        f"INSERT INTO {_quoted(table)} ({', '.join(COLUMNS)}) {rows} ON CONFLICT (job, key) DO UPDATE SET "
        f"{updates} WHERE excluded.updated_at >= {_quoted(table)}.updated_at"
    )


def _create_sql(table: str, *, boolean: str, json: str, time_type: str, suffix: str = "") -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {_quoted(table)} (job TEXT NOT NULL, key TEXT NOT NULL, "
        "row_number BIGINT NOT NULL, run_id TEXT NOT NULL, "
        f"success {boolean} NOT NULL, classification TEXT NOT NULL, status_code INTEGER, "
        f"attempts INTEGER NOT NULL, error TEXT, captured {json}, updated_at {time_type} NOT NULL, "
        f"PRIMARY KEY (job, key)){suffix}"
    )


class _SqliteWriter:
    def __init__(self, target: SinkTarget, wait: float) -> None:
        assert target.path is not None
        self._target = target
        try:
            self._db = sqlite3.connect(
                target.path, timeout=wait, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")  # readers of the table never block the relay
            # The journal is the source of truth: a transaction lost to a power cut is caught up again.
            self._db.execute("PRAGMA synchronous=NORMAL")
            # WITHOUT ROWID: the rows live in the primary key's b-tree, one write a row instead of two.
            create = _create_sql(
                target.table, boolean="INTEGER", json="TEXT", time_type="TEXT", suffix=" WITHOUT ROWID"
            )
            self._db.execute(create)
        except sqlite3.Error as exc:
            raise SinkUnavailable(target.identity, str(exc)) from None
        self._sql = _json_upsert_sql(target.table)

    def upsert(self, rows: Sequence[Row]) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(self._sql, (orjson.dumps(rows),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise SinkUnavailable(self._target.identity, str(exc)) from None

    def finish(self) -> None:
        pass

    def close(self) -> None:
        self._db.close()


class _PostgresWriter:
    def __init__(self, target: SinkTarget, wait: float) -> None:
        try:
            import psycopg
        except ImportError:
            reason = "psycopg is not installed (pip install 'bulkrelay[postgres]')"
            raise SinkUnavailable(target.identity, reason) from None
        self._pg = psycopg
        self._target = target
        try:
            self._db = psycopg.connect(
                target.url, connect_timeout=max(1, int(wait)), application_name="bulkrelay", autocommit=True
            )
            self._db.execute(f"SET lock_timeout = '{int(wait * 1000)}ms'")
            self._db.execute(
                _create_sql(target.table, boolean="BOOLEAN", json="JSONB", time_type="TIMESTAMPTZ").encode()
            )
        except psycopg.Error as exc:
            raise self._unavailable(exc) from None
        self._sql = _pg_upsert_sql(target.table).encode()

    def _unavailable(self, exc: Exception) -> SinkUnavailable:
        text = " ".join(str(exc).split())
        password = urlsplit(self._target.url).password
        return SinkUnavailable(self._target.identity, text.replace(password, "***") if password else text)

    def upsert(self, rows: Sequence[Row]) -> None:
        try:
            self._db.execute(self._sql, (orjson.dumps(_newest_a_key(rows)).decode(),))
        except self._pg.Error as exc:
            raise self._unavailable(exc) from None

    def finish(self) -> None:
        pass

    def close(self) -> None:
        with contextlib.suppress(self._pg.Error):
            self._db.close()


class _FileWriter:
    """A CSV or JSON Lines file: rows appended under a lock file, compacted by `finish`."""

    def __init__(self, target: SinkTarget, wait: float) -> None:
        assert target.path is not None
        self._target = target
        self._path = target.path
        lock = target.path.with_name(f".{target.path.name}.lock")
        try:
            self._lock = open_private(lock, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise SinkUnavailable(target.identity, exc.strerror or str(exc)) from None
        self._wait = wait

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return _flock(self._lock, self._wait, self._target.identity)

    def upsert(self, rows: Sequence[Row]) -> None:
        with self._locked():
            try:
                fd = open_private(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            except OSError as exc:
                raise SinkUnavailable(self._target.identity, exc.strerror or str(exc)) from None
            with os.fdopen(fd, "ab") as out:
                if os.fstat(fd).st_size == 0 and self._target.kind == "csv":
                    out.write(encode_rows([], "csv", header=True))
                out.write(encode_rows(rows, self._target.kind, header=False))
                out.flush()
                os.fsync(out.fileno())

    def finish(self) -> None:
        """Rewrite the file with one line per (job, key), the newest: an atomic replace."""
        with self._locked():
            latest: dict[tuple[str, str], Row] = {}
            for row in read_file_rows(self._path, self._target.kind):
                known = latest.get((row[0], row[1]))
                if known is None or row[-1] >= known[-1]:
                    latest[row[0], row[1]] = row
            data = encode_rows(list(latest.values()), self._target.kind, header=self._target.kind == "csv")
            try:
                write_atomic(self._path, data)
            except Exception as exc:
                raise SinkUnavailable(self._target.identity, str(exc)) from None

    def close(self) -> None:
        os.close(self._lock)


@contextlib.contextmanager
def _flock(fd: int, wait: float, identity: str) -> Iterator[None]:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise SinkUnavailable(identity, "locked by another writer") from None
            time.sleep(0.05)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def open_writer(target: SinkTarget, wait: float = LOCK_WAIT_SECONDS) -> SinkWriter:
    """A writer of `target`; `SinkUnavailable` when it cannot be opened."""
    if target.kind == "sqlite":
        return _SqliteWriter(target, wait)
    if target.kind == "postgresql":
        return _PostgresWriter(target, wait)
    return _FileWriter(target, wait)


# ---------------------------------------------------------------- CSV and JSON Lines, also for export


def encode_rows(rows: Iterable[Row], kind: str, *, header: bool) -> bytes:
    """Rows as CSV (booleans `true`/`false`, null empty, `captured` as JSON text) or JSON Lines."""
    if kind == "jsonl":
        return b"".join(orjson.dumps(as_record(row)) + b"\n" for row in rows)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    if header:
        writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(
            ["" if v is None else ("true" if v else "false") if type(v) is bool else v for v in row]
        )
    return text.getvalue().encode()


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if type(value) is bool:
        return "true" if value else "false"
    return value


def read_file_rows(path: Path, kind: str) -> Iterator[Row]:
    """The rows of a CSV or JSON Lines sink file, as written (no file: none)."""
    if not path.exists():
        return
    with path.open("rb") as stream:
        if kind == "jsonl":
            for line in stream:
                record = orjson.loads(line)
                captured = record["captured"]
                record["captured"] = None if captured is None else orjson.dumps(captured).decode()
                yield tuple(record[c] for c in COLUMNS)
            return
        reader = csv.reader(io.TextIOWrapper(stream, encoding="utf-8", newline=""))
        next(reader, None)  # the header
        for cells in reader:
            yield _csv_row(cells)


def _csv_row(cells: list[str]) -> Row:
    values: list[Any] = [None if cell == "" else cell for cell in cells]
    values[2], values[7] = int(cells[2]), int(cells[7])
    values[4] = cells[4] == "true"
    values[6] = None if cells[6] == "" else int(cells[6])
    return tuple(values)


def write_rows(out: BinaryIO, rows: Iterable[Row], kind: str) -> int:
    """`rows` to `out` in chunks (a CSV header first, even without rows); how many."""
    count = 0
    chunk: list[Row] = []
    out.write(encode_rows([], kind, header=kind == "csv"))
    for row in rows:
        chunk.append(row)
        if len(chunk) == _CHUNK_ROWS:
            out.write(encode_rows(chunk, kind, header=False))
            count, chunk = count + len(chunk), []
    out.write(encode_rows(chunk, kind, header=False))
    return count + len(chunk)


# ---------------------------------------------------------------- progress and catch-up


def sink_job_name(run: RunDir) -> str:
    """The job a run's rows are filed under: its `name:`, else its job file's stem."""
    return run.plan.name or Path(run.plan.job_path).stem


@dataclass(frozen=True)
class FedRun:
    """One run as the sink is fed from it: the job its rows are filed under, its id and its directory
    (the journal, and `results-sink.json`, how much of it the sink holds). Plain values: the feeder's
    process is handed them as JSON."""

    job: str
    run_id: str
    path: Path

    @classmethod
    def of(cls, run: RunDir) -> FedRun:
        return cls(sink_job_name(run), run.run_id, run.path)

    @property
    def journal(self) -> Path:
        return self.path / JOURNAL


def fed_offset(run: RunDir | FedRun, target: SinkTarget) -> int:
    """How much of the run's journal the sink holds (0: none, or another sink's progress)."""
    try:
        progress = read_json(run.path / PROGRESS_FILE)
    except Exception:
        return 0
    if not isinstance(progress, dict) or progress.get("sink") != target.identity:
        return 0
    offset = progress.get("offset")
    return offset if type(offset) is int and offset >= 0 else 0


def save_progress(
    run: RunDir | FedRun, target: SinkTarget, offset: int, storage: Storage | None = None
) -> None:
    """Record that the sink holds the run's journal up to byte `offset`."""
    write_json_atomic(run.path / PROGRESS_FILE, {"sink": target.identity, "offset": offset}, storage)


def upsert_groups(
    writer: SinkWriter, run: FedRun, start: int, end: int | None = None
) -> Iterator[tuple[int, int]]:
    """Upsert the whole groups of the run's journal from byte `start` (to `end`, a group's end),
    at most about `_CHUNK_ROWS` rows at once; after each upsert, (its rows, the offset it reached)."""
    chunk: list[Row] = []
    for entries, t, reached in journal_groups(run.journal, start, end):
        at = iso_time(t)
        chunk.extend(row_of(run.job, run.run_id, entry, at) for entry in entries)
        if len(chunk) >= _CHUNK_ROWS:
            writer.upsert(chunk)
            yield len(chunk), reached
            chunk = []
    if chunk:
        writer.upsert(chunk)
        yield len(chunk), reached


def catch_up(writer: SinkWriter, target: SinkTarget, run: RunDir) -> int:
    """Upsert what the run's journal holds past the sink's progress; the rows written."""
    written = 0
    for rows, reached in upsert_groups(writer, FedRun.of(run), fed_offset(run, target)):
        written += rows
        save_progress(run, target, reached, run.storage)
    return written


def lagging_runs(runs_dir: Path, job: str, target: SinkTarget, own: RunDir | None = None) -> list[RunDir]:
    """The job's runs whose journals hold more than the sink, oldest first: no process holds them but
    `own` (the run about to relay, whose lock the caller holds)."""
    lagging = []
    for run in runs_in(runs_dir):
        if sink_job_name(run) != job:
            continue
        mine = own is not None and run.run_id == own.run_id
        if (mine or not is_locked(run.path)) and fed_offset(run, target) < _size(run.journal_path):
            lagging.append(run)
    return lagging


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


# ---------------------------------------------------------------- another job's results, read back


def finished_runs_of(runs_dir: Path, job: str) -> list[RunDir]:
    """The runs of the job named `job` (its `name:`) that completed, with or without failures, oldest
    first: what a chained job or a lookup reads. A run of it still alive is RUN_LOCKED (exit 6: its
    results are not final); none completed is NOT_FOUND (exit 5)."""
    runs = [run for run in runs_in(runs_dir) if run.plan.name == job]
    live = [run for run in runs if is_locked(run.path)]
    if live:
        raise RunLocked(
            f"job {job} is running (run {live[0].run_id}, {live[0].path}): its results are not final yet",
            context={"job": job, "run_id": live[0].run_id, "run_dir": str(live[0].path)},
            suggestion=f"wait for job {job} to end, then run this one again",
        )
    done = [run for run in runs if run.state in _FINISHED]
    if not done:
        raise NotFound(
            f"job {job} has no finished run in {runs_dir}",
            context={"job": job, "runs_dir": str(runs_dir)},
            suggestion=f"run the job whose name: is {job} first, with the same runs directory",
        )
    return done


def latest_outcomes(runs: Sequence[RunDir], path: Path) -> Iterator[Row]:
    """Each key's newest outcome in the runs' journals (as the sink would hold it): the rows of the
    oldest run first, each run's in row order.

    Gathered in a new SQLite file at `path` (a spool file, removed after), not in a dictionary: a
    parent of a million rows held as one added 1.4 GB of peak RSS to the lookup or the chained job that
    read it."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.executescript(_LATEST_SQL)
        for index, run in enumerate(runs):
            job = sink_job_name(run)
            for entries, t, _ in journal_groups(run.journal_path, 0):
                at = iso_time(t)
                rows = [row_of(job, run.run_id, entry, at) for entry in entries]
                db.execute("BEGIN")
                db.executemany(_LATEST_UPSERT, [(r[1], index, r[2], at, orjson.dumps(r)) for r in rows])
                db.execute("COMMIT")
        for (row,) in db.execute("SELECT row FROM latest ORDER BY run, row_number"):
            yield tuple(orjson.loads(row))
    finally:
        db.close()
        path.unlink(missing_ok=True)


_LATEST_SQL = """
PRAGMA journal_mode = OFF;
PRAGMA synchronous = OFF;
PRAGMA cache_size = -16000;
PRAGMA temp_store = FILE;
CREATE TABLE latest (key TEXT PRIMARY KEY, run INTEGER, row_number INTEGER, at TEXT, row BLOB) WITHOUT ROWID;
"""
# The newer outcome replaces the older; of two as old, the later read (as writing them in turn would).
_LATEST_UPSERT = (
    "INSERT INTO latest VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET run = excluded.run, "
    "row_number = excluded.row_number, at = excluded.at, row = excluded.row WHERE excluded.at >= latest.at"
)
