"""The sync state of a delta job: for each key, the digest of the request last delivered for it.

One SQLite database (WAL) per job in `<runs-dir>/sync-state/`. It is a cache of the journals: it
is written only from verified journal lines of successful rows (`apply_run`), so a crash can never
mark a row delivered that has no committed success, and `rebuild` recreates it from the journals
alone. Each run's journal is applied from the offset reached last time, so applying is incremental
and applying twice changes nothing.

A key's entry is replaced only by a delivery from a run that started no earlier (`at`, the run's
creation time in microseconds), so catching up an older run's journal never undoes a newer delivery.
"""

from __future__ import annotations

import calendar
import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import orjson

from bulkrelay.errors import NotFound, RunLocked, SyncStateBusy, SyncStateCorrupt, SyncStateMismatch
from bulkrelay.job.digest import key_text
from bulkrelay.job.fingerprint import canonical_sha256
from bulkrelay.store.journal import JournalEntry, read_journal_from
from bulkrelay.store.manifest import RunPlan
from bulkrelay.store.rundir import RunDir, is_locked
from bulkrelay.store.runs import runs_in
from bulkrelay.store.storage import Storage

STATE_DIR = "sync-state"
LOOKUP_BATCH = 999  # keys compared per query (`changed_among`)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, run_id TEXT UNIQUE NOT NULL, at INTEGER NOT NULL, applied_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS delivered (
    key TEXT PRIMARY KEY, digest BLOB NOT NULL, run INTEGER NOT NULL, at INTEGER NOT NULL, line BLOB
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending_lines (
    key TEXT PRIMARY KEY, digest BLOB NOT NULL, line BLOB NOT NULL
) WITHOUT ROWID;
"""
# `delivered.line`: the digest of an input line that renders this key's delivered request, so the line
# scan (sync/linescan.py) can tell the line unchanged by its bytes alone. `pending_lines`: what the last
# delta preflight found of each row it looked at (key, request digest, line digest; `keep_lines`): true
# of those bytes whatever was delivered, and copied to `delivered.line` wherever the delivered request
# is that one: at once for the unchanged rows, on delivery for the changed ones. A cache, not a record
# of deliveries: a delivery of another request forgets the line, and `rebuild` starts without any.
_UPSERT = (
    "INSERT INTO delivered (key, digest, run, at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT(key) DO UPDATE SET digest = excluded.digest, run = excluded.run, at = excluded.at, "
    "line = CASE WHEN delivered.digest = excluded.digest THEN delivered.line END "
    "WHERE excluded.at >= delivered.at"
)
_LEARNED = (
    "CREATE TEMP TABLE IF NOT EXISTS learned (key TEXT PRIMARY KEY, digest BLOB, line BLOB) WITHOUT ROWID"
)
# Driven by the pending rows, each found by its key (a join may start from every delivered one).
_PENDING_ROW = "(SELECT p.{} FROM pending_lines AS p WHERE p.key = delivered.key)"
_APPLY_PENDING = (
    f"UPDATE delivered SET line = {_PENDING_ROW.format('line')} "
    f"WHERE key IN (SELECT key FROM pending_lines) AND digest = {_PENDING_ROW.format('digest')}"
)
_DELETE = "DELETE FROM delivered WHERE key = ? AND at <= ?"

# A batch is compared inside SQLite in one step that answers one row: the positions (`json_each`'s
# array index) of the keys with no stored digest or another one than their 16 bytes in the blob.
# Python's sqlite3 takes the GIL back after every step, so a query answering a row per key (`IN`)
# costs about 0.7 µs a key; this one about 0.3.
_CHANGED = (
    "SELECT group_concat(batch.key) FROM json_each(?) AS batch WHERE NOT EXISTS (SELECT 1 FROM delivered "
    "WHERE delivered.key = batch.value AND delivered.digest = substr(?, batch.key * 16 + 1, 16))"
)
_DIGEST_SIZE = 16
_NO_LINE = bytes(_DIGEST_SIZE)
# A mirror night's keys (`remember_seen`), and the gone keys that are one of them in another form.
_SEEN = "CREATE TEMP TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY) WITHOUT ROWID;"
_TWINS = "CREATE TEMP TABLE IF NOT EXISTS twins (gone TEXT PRIMARY KEY, seen TEXT NOT NULL) WITHOUT ROWID;"


# How long a write waits for another process holding the state (a run of the same job, a shard, an
# `sqlite3` shell) before it gives up with SYNC_STATE_BUSY: SQLite's own busy wait, made explicit.
BUSY_WAIT_S = 5.0
_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_DAMAGE_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


@contextlib.contextmanager
def named_errors(path: Path) -> Iterator[None]:
    """SQLite's errors as BulkRelay's: a state another process holds past `BUSY_WAIT_S` is
    SYNC_STATE_BUSY (exit 6), a file that is no database or a damaged one SYNC_STATE_CORRUPT (exit 4),
    instead of an unexpected error with a traceback. Any other error stays what it is."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        code = exc.sqlite_errorcode & 0xFF  # the primary code: SQLITE_BUSY_SNAPSHOT is a busy too
        if code in _BUSY_CODES:
            raise SyncStateBusy(
                f"the sync state {path} is held by another process (waited {BUSY_WAIT_S:g} s): {exc}",
                context={"state": str(path)},
                suggestion="try again once the other run of this job (or whatever holds the file) ends",
            ) from None
        if code in _DAMAGE_CODES or "malformed" in str(exc):
            raise SyncStateCorrupt(
                f"the sync state {path} is damaged: {exc}",
                context={"state": str(path)},
                suggestion="bulkrelay sync-state rebuild JOB (it remakes the state from the journals)",
            ) from None
        raise


_S = TypeVar("_S", bound="SyncState")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _guarded(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """The method with SQLite's errors named (`named_errors`)."""

    @functools.wraps(method)
    def guarded(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with named_errors(self.path):
            return method(self, *args, **kwargs)

    return guarded


def _guarded_rows(
    method: Callable[Concatenate[_S, _P], Iterator[_R]],
) -> Callable[Concatenate[_S, _P], Iterator[_R]]:
    """A generator method with SQLite's errors named while it is read, not only when it is made."""

    @functools.wraps(method)
    def guarded(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> Iterator[_R]:
        with named_errors(self.path):
            yield from method(self, *args, **kwargs)

    return guarded


def job_identity(name: str | None, job_path: str | Path) -> str:
    """What makes two runs the same job across nights: its `name`, else its job file's path.

    Not the semantic fingerprint: changing concurrency must not resend everything, and a change
    that alters requests (a new URL) already changes every row's digest."""
    return f"name:{name}" if name else f"path:{Path(job_path).resolve()}"


def manifest_identity(plan: RunPlan) -> str:
    return job_identity(plan.name, plan.job_path)


def state_path(runs_dir: Path, identity: str) -> Path:
    return runs_dir / STATE_DIR / f"{canonical_sha256(identity)[:24]}.sqlite"


def run_started(run: RunDir) -> int:
    """When a run was created, in microseconds since the epoch: its manifest's `created_at`
    (microseconds, so two runs made in the same second keep their order)."""
    stamp = datetime.strptime(run.manifest.created_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return (calendar.timegm(stamp.timetuple())) * 1_000_000 + stamp.microsecond


class SyncState:
    """An open sync state. Use as a context manager; every write is its own transaction."""

    def __init__(self, path: Path, identity: str) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)  # created private before SQLite opens it
        self.path = path
        # One thread at a time, but not always the opener's: a delta run looks keys up on its own.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=BUSY_WAIT_S)
        try:
            with named_errors(path):
                self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before anything is written: new files
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
                self._add_line_column()
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('job', ?)", (identity,))
        except BaseException:
            self._db.close()
            raise

    def _add_line_column(self) -> None:
        """States written before line digests existed get the column, empty, and become able to give
        pages back (`keep_lines`): that takes rewriting the file once, which waits for a moment when
        no other process has the state open (until then the pages are reused, not given back)."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(delivered)")}
        if "line" not in columns:
            self._db.execute("ALTER TABLE delivered ADD COLUMN line BLOB")
        if self._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0:
            with contextlib.suppress(sqlite3.OperationalError):
                self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")
                self._db.execute("VACUUM")

    @classmethod
    def for_job(cls, runs_dir: Path, identity: str) -> SyncState:
        return cls(state_path(runs_dir, identity), identity)

    def __enter__(self) -> SyncState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    @_guarded
    def changed_among(self, keys: list[str], digests: bytes) -> list[int]:
        """The positions in `keys` of those whose stored digest is absent or differs from theirs
        (`digests`: the 16-byte digest of each key, in the same order)."""
        assert len(digests) == _DIGEST_SIZE * len(keys)
        listed = orjson.dumps(keys)
        if b"\\u0000" in listed:  # SQLite's JSON text would end a key at a NUL: compare in Python
            return self._changed_in_python(keys, digests)
        (found,) = self._db.execute(_CHANGED, (listed, digests)).fetchone()
        return [] if found is None else [int(index) for index in found.split(",")]

    def _changed_in_python(self, keys: list[str], digests: bytes) -> list[int]:
        marks = ",".join("?" * len(keys))
        query = f"SELECT key, digest FROM delivered WHERE key IN ({marks})"
        stored = dict(self._db.execute(query, keys).fetchall())
        size = _DIGEST_SIZE
        return [n for n, key in enumerate(keys) if stored.get(key) != digests[n * size : (n + 1) * size]]

    @_guarded
    def learn_lines(self, keys: list[str], digests: bytes, lines: bytes) -> None:
        """Note what preflight found of a batch of rows: each key's request digest and the digest of
        the input line it was read from (`lines`, 16 bytes a key; zeros: none, not noted). Kept in a
        temporary table until `keep_lines`, once preflight knows the lines were the bytes it read."""
        self._db.execute(_LEARNED)
        size = _DIGEST_SIZE
        learned = [
            (key, digests[n * size : (n + 1) * size], line)
            for n, key in enumerate(keys)
            if (line := lines[n * size : (n + 1) * size]) != _NO_LINE
        ]
        self._db.executemany("INSERT OR REPLACE INTO temp.learned VALUES (?, ?, ?)", learned)

    @_guarded
    def keep_lines(self) -> bool:
        """Make what `learn_lines` noted the pending lines (the last night's replaced) and give the
        unchanged rows their line now; then hand the pages the last night's took back to the system.

        Lines are a cache: when the state stays busy (shards of the job writing it) past SQLite's
        wait, they are not kept, and False says so; those rows take the full rule again next night."""
        self._db.execute(_LEARNED)
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        try:
            self._db.execute("DELETE FROM pending_lines")
            self._db.execute("INSERT INTO pending_lines SELECT key, digest, line FROM temp.learned")
            self._db.execute(_APPLY_PENDING)
            self._db.execute("DELETE FROM temp.learned")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        with contextlib.suppress(sqlite3.OperationalError):  # busy: the pages go back another night
            self._db.executescript("PRAGMA incremental_vacuum;")  # to its end (`execute` frees one page)
        return True

    @_guarded
    def remember_seen(self, keys: list[str]) -> None:
        """Note keys present in tonight's input (a temporary table: gone when the state is closed)."""
        self._db.execute("CREATE TEMP TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY) WITHOUT ROWID")
        self._db.executemany("INSERT OR IGNORE INTO temp.seen VALUES (?)", [(key,) for key in keys])

    @_guarded_rows
    def missing_keys(self) -> Iterator[str]:
        """Delivered keys not seen tonight (call after `remember_seen` of every key), in key order;
        less those `match_gone` paired with a key seen tonight."""
        self._db.executescript(_SEEN + _TWINS)
        query = (
            "SELECT key FROM delivered WHERE key NOT IN (SELECT key FROM temp.seen) "
            "AND key NOT IN (SELECT gone FROM temp.twins) ORDER BY key"
        )
        for (key,) in self._db.execute(query):
            yield key

    @_guarded
    def match_gone(self, normal: Callable[[str], str]) -> int:
        """Pair each delivered key gone tonight with a key seen tonight whose `normal` form is its own
        (`ABC` gone, `abc` seen, under casefold): kept in `twins`, left out of `missing_keys`; how many
        were paired. The seen keys are normalized only on a night with keys gone, each looked up in an
        index of the gone keys' forms, so the cost is one call a key, and memory stays in SQLite."""
        self._db.executescript(_SEEN + _TWINS)
        self._db.create_function("bulkrelay_normal", 1, normal, deterministic=True)
        self._db.executescript(
            "DROP TABLE IF EXISTS temp.gone; "
            "CREATE TEMP TABLE gone (key TEXT PRIMARY KEY, normal TEXT NOT NULL) WITHOUT ROWID; "
            "INSERT INTO temp.gone SELECT key, bulkrelay_normal(key) FROM delivered "
            "WHERE key NOT IN (SELECT key FROM temp.seen); "
            "CREATE INDEX temp.gone_normal ON gone (normal); DELETE FROM temp.twins;"
        )
        if self._db.execute("SELECT count(*) FROM temp.gone").fetchone()[0] == 0:
            return 0
        self._db.execute(  # CROSS JOIN: seen outside, so each seen key is normalized once
            "INSERT OR IGNORE INTO temp.twins SELECT g.key, s.key FROM temp.seen AS s "
            "CROSS JOIN temp.gone AS g ON g.normal = bulkrelay_normal(s.key)"
        )
        return int(self._db.execute("SELECT count(*) FROM temp.twins").fetchone()[0])

    @_guarded_rows
    def twins(self) -> Iterator[tuple[str, str]]:
        """(gone key, seen key) pairs `match_gone` found, in key order."""
        self._db.executescript(_TWINS)
        yield from self._db.execute("SELECT gone, seen FROM temp.twins ORDER BY gone")

    @_guarded_rows
    def items(self) -> Iterator[tuple[str, bytes, str]]:
        """Every key with its digest and the run that delivered it, in key order."""
        yield from self._db.execute(
            "SELECT d.key, d.digest, r.run_id FROM delivered d JOIN runs r ON r.id = d.run ORDER BY d.key"
        )

    @_guarded
    def count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM delivered").fetchone()[0])

    def delivering_runs(self) -> set[str]:
        """The runs some key's entry names: their journals are what `rebuild` would build it from."""
        query = "SELECT r.run_id FROM runs r WHERE EXISTS (SELECT 1 FROM delivered d WHERE d.run = r.id)"
        return {run_id for (run_id,) in self._db.execute(query)}

    @_guarded
    def needs_deletions_of(self, run: RunDir) -> bool:
        """Whether a mirror deletion run committed a deletion that this state still holds to: a key it
        deleted that no later delivery has put back. A run that deleted nothing (halted by a 401, then
        ended by the next night) holds to nothing, nor does one whose every key came back since."""
        at = run_started(run)
        for _, entry in _verified_from(run.journal_path, 0):
            if entry.success and entry.key is not None:
                row = self._db.execute("SELECT at FROM delivered WHERE key = ?", (key_text(entry.key),))
                delivered = row.fetchone()
                if delivered is None or int(delivered[0]) <= at:
                    return True
        return False

    @_guarded
    def apply_run(self, run: RunDir) -> int:
        """Record the successful deliveries in `run`'s journal not applied yet; how many were new."""
        at = run_started(run)
        row_id, offset = self._run_row(run.run_id, at)
        deletes = run.plan.mirror_deletes  # a mirror run's deletions: keys leave the state
        applied = 0
        self._db.execute("BEGIN IMMEDIATE")
        try:
            reached = offset
            for reached, entry in _verified_from(run.journal_path, offset):  # noqa: B007 - kept after
                if not entry.success or entry.key is None:
                    continue
                if deletes:
                    self._db.execute(_DELETE, (key_text(entry.key), at))
                    applied += 1
                elif entry.digest is not None:
                    delivered = (key_text(entry.key), bytes.fromhex(entry.digest), row_id, at)
                    self._db.execute(_UPSERT, delivered)
                    applied += 1
            if applied and not deletes:
                self._db.execute(_APPLY_PENDING)  # the delivered rows' lines, as preflight found them
            self._db.execute("UPDATE runs SET applied_offset = ? WHERE id = ?", (reached, row_id))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return applied

    def _run_row(self, run_id: str, at: int) -> tuple[int, int]:
        self._db.execute(
            "INSERT OR IGNORE INTO runs (run_id, at, applied_offset) VALUES (?, ?, 0)", (run_id, at)
        )
        row = self._db.execute("SELECT id, applied_offset FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return int(row[0]), int(row[1])


def _verified_from(journal: Path, offset: int) -> Iterator[tuple[int, JournalEntry]]:
    """(offset after the line, entry) for each verified line from `offset`; stops at the first line
    that does not verify: a torn tail is not a delivery. A journal cut shorter than `offset` (its
    torn tail moved aside) is read again from its start: applying a line twice changes nothing."""
    if journal.exists() and offset > journal.stat().st_size:
        offset = 0
    for _, end, entry in read_journal_from(journal, offset):
        yield end, entry


def job_runs(runs_dir: Path, identity: str) -> list[RunDir]:
    """The runs of one job in `runs_dir`, oldest first."""
    return sorted(
        (run for run in runs_in(runs_dir) if manifest_identity(run.plan) == identity),
        key=lambda run: (run_started(run), run.run_id),
    )


def catch_up(state: SyncState, runs: Iterable[RunDir]) -> None:
    """Apply the journals of runs no process holds (a crashed run's committed lines included)."""
    for run in runs:
        if not is_locked(run.path):
            state.apply_run(run)


def rebuilt_items(runs_dir: Path, identity: str) -> Iterator[tuple[str, bytes, str]]:
    """The state the journals imply, built in memory from nothing."""
    with closing(_MemoryState(identity)) as fresh:
        for run in job_runs(runs_dir, identity):
            fresh.apply_run(run)
        yield from fresh.items()


class _MemoryState(SyncState):
    def __init__(self, identity: str) -> None:
        self.path = Path(":memory:")
        self._db = sqlite3.connect(":memory:", isolation_level=None)
        self._db.executescript(_SCHEMA)
        self._db.execute("INSERT INTO meta VALUES ('job', ?)", (identity,))


def _refuse_live(runs: list[RunDir]) -> None:
    for run in runs:
        if is_locked(run.path):
            raise RunLocked(
                f"run {run.run_id} of this job is running ({run.path}); "
                "its results are not all in the journal yet",
                context={"run_dir": str(run.path)},
                suggestion="wait for it to end (or `bulkrelay job wait`), then try again",
            )


@dataclass(frozen=True)
class StateCheck:
    """What `rebuild_state` built or `verify_state` found: the job's state file, from how many runs,
    with how many keys; `matches` only from verify (which raises when they differ)."""

    job: str
    state: str
    runs: int
    keys: int
    matches: bool | None = None


def rebuild_state(runs_dir: Path, identity: str) -> StateCheck:
    """Replace the job's sync state with one built from its journals alone."""
    runs = job_runs(runs_dir, identity)
    _refuse_live(runs)
    final = state_path(runs_dir, identity)
    building = final.with_name(final.name + ".rebuild")
    for stale in _files_of(building):
        stale.unlink(missing_ok=True)
    with SyncState(building, identity) as fresh:
        for run in runs:
            fresh.apply_run(run)
        keys = fresh.count()
    for stale in _files_of(final)[1:]:  # the old database's WAL and shared memory go with it
        stale.unlink(missing_ok=True)
    storage = Storage()
    storage.replace(building, final)
    storage.fsync_dir(final.parent)
    return StateCheck(job=identity, state=str(final), runs=len(runs), keys=keys)


def verify_state(runs_dir: Path, identity: str) -> StateCheck:
    """Compare the job's sync state with what its journals imply; `SyncStateMismatch` naming the
    differences when they disagree."""
    runs = job_runs(runs_dir, identity)
    _refuse_live(runs)
    path = state_path(runs_dir, identity)
    if not path.exists():
        raise NotFound(
            f"no sync state for job {identity} in {runs_dir}",
            context={"state": str(path)},
            suggestion="run the delta job once, or `bulkrelay sync-state rebuild JOB`",
        )
    with SyncState(path, identity) as live:
        differences = _differences(live.items(), rebuilt_items(runs_dir, identity))
        keys = live.count()
    if any(differences[kind] for kind in ("missing", "extra", "different")):
        raise SyncStateMismatch(
            f"the sync state of job {identity} differs from its journals: {differences['missing']} keys "
            f"missing, {differences['extra']} extra, {differences['different']} with another digest or run",
            context={"state": str(path), **differences},
            suggestion="bulkrelay sync-state rebuild JOB",
        )
    return StateCheck(job=identity, state=str(path), runs=len(runs), keys=keys, matches=True)


Item = tuple[str, bytes, str]
_EXAMPLES = 5


def _differences(live: Iterator[Item], rebuilt: Iterator[Item]) -> dict[str, Any]:
    """Walk both key-ordered listings together; count and name (a few) keys that differ."""
    found: dict[str, Any] = {"missing": 0, "extra": 0, "different": 0, "examples": []}

    def note(kind: str, key: str) -> None:
        found[kind] += 1
        if len(found["examples"]) < _EXAMPLES:
            found["examples"].append({"key": key, "problem": kind})

    have, want = next(live, None), next(rebuilt, None)
    while have is not None or want is not None:
        if want is None or (have is not None and have[0] < want[0]):
            assert have is not None
            note("extra", have[0])
            have = next(live, None)
        elif have is None or want[0] < have[0]:
            note("missing", want[0])
            want = next(rebuilt, None)
        else:
            if have != want:
                note("different", have[0])
            have, want = next(live, None), next(rebuilt, None)
    return found


def _files_of(database: Path) -> list[Path]:
    return [database, database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")]
