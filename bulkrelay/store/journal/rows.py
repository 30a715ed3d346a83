"""`results.jsonl`, the source of truth: one line per final row result, committed in groups.

Line format. A line is a compact JSON object whose last key is a checksum of the line's own bytes:

    {"seq":1,"row_number":7,...,"duration_ms":12.5,"crc":"1c291ca3"}\\n

`crc` is the CRC-32 (zlib) of every byte before `,"crc":`, as 8 lowercase hex digits, so the line
ends with exactly 19 fixed-shape bytes. Verifying is a slice, a C-speed crc32 and a compare; the
JSON parser then reads the line as is (no copy) and the `crc` key is dropped. Between `seq` and
`crc` a line is a `JournalEntry`, every field spelled out (null when absent); `encode_line` and
`decode_line` are the only code that writes or parses a line, and `read_journal` the only reader
the rest of BulkRelay uses (summary, export, failures, retry-failed, sync state).

Durability. One `JournalWriter` appends: a batch (up to `max_rows`, `max_bytes`, or `max_delay` after
its first entry) is encoded, written with one write that ends in the group's commit marker
(`CommitMarker`: its last seq, rows, commit time and CRC-32), fsynced in a worker thread, and only
then reported as committed. A crash can therefore damage only the last, uncommitted batch, the one
without a marker. Recovery (`scan_journal`) moves that group aside whole; damage that a marker
follows, or at or before the checkpoint's frontier, or a journal shorter than it, is corruption and
refuses the resume. A journal without markers (an older version's) keeps the older rule: damage after
the frontier is the torn batch; with no frontier, only damage that no good line follows.

Fast resume. The writer keeps a SHA-256 of every byte it committed and the set of rows they hold
(`CommittedPrefix`), which the checkpoint records with its frontier. A resume hashes the journal up
to the frontier (one C-speed pass) and, when the digest matches, takes those rows as they are and
decodes only the lines after it; when it does not, every line is checked, so the refusal names the
damaged line, and a journal whose lines all check out but whose bytes changed is refused as well.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime
from functools import partial
from io import BufferedReader
from pathlib import Path
from typing import IO, Any

import anyio
import orjson

from bulkrelay.errors import JournalCorrupt, StorageFailed
from bulkrelay.private import open_private
from bulkrelay.store.journal.jobrecords import is_job_record
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.storage import Storage

MAX_LINE_BYTES = 16 << 20  # a longer "line" is garbage; the reader never buffers more than this
_SUFFIX_LEN = 19  # len(',"crc":"xxxxxxxx"}\n')
_CRC_TAG = b',"crc":"'
_COPY_CHUNK = 1 << 20
_TRUNCATED = "truncated line (no newline at the end)"  # only ever the last line of a file
_FAILURE_GRACE = 0.1  # seconds; see JournalWriter._check_running

_MISSING = object()

GROUP_ROWS = 1000  # a writer's group (one write and fsync) holds at most this many rows, or one longer unit
BACKLOG_GROUPS = 4  # queued entries past this many groups make `submit` wait (backpressure)
# The rows a writer may hold answered but not committed: its backlog, whose first group may be being
# written. A process killed past its last commit lost at most these, and its rows in flight.
MOST_UNCOMMITTED_ROWS = BACKLOG_GROUPS * GROUP_ROWS
_NoneType = type(None)
_INT_OR_NULL: frozenset[type] = frozenset({int, _NoneType})
_STR_OR_NULL: frozenset[type] = frozenset({str, _NoneType})
_NUMBER: frozenset[type] = frozenset({int, float})
_NUMBER_OR_NULL: frozenset[type] = frozenset({int, float, _NoneType})
_DICT_OR_NULL: frozenset[type] = frozenset({dict, _NoneType})
# The keys every line must carry, and the types each may hold (bool is not an int here).
_SCHEMA: tuple[tuple[str, frozenset[type]], ...] = (
    ("seq", frozenset({int})),
    ("row_number", frozenset({int})),
    ("success", frozenset({bool})),
    ("classification", frozenset({str})),
    ("status_code", _INT_OR_NULL),
    ("attempts", frozenset({int})),
    ("retryable", frozenset({bool})),
    ("error", _STR_OR_NULL),
    ("duration_ms", _NUMBER),
)
# The keys a line may carry besides those; None: any JSON value (an `input.key` value is any scalar).
_OPTIONAL: dict[str, frozenset[type] | None] = {
    "latency_ms": _NUMBER_OR_NULL,
    "key": None,
    "idempotency_key": _STR_OR_NULL,
    "captured": _DICT_OR_NULL,
    "response_body": _STR_OR_NULL,
    "digest": _STR_OR_NULL,
    "batch": _DICT_OR_NULL,
}


@dataclass(frozen=True, kw_only=True, init=False)
class JournalEntry:
    """The final result of one row, as a journal line records it (the line adds `seq` and `crc`).

    The type is the schema: the writer encodes it as it is (orjson serialises a dataclass natively,
    in field order), and `decode_line` checks a line's keys and types before building one.

    Frozen, so an entry cannot change between the sender and the writer's thread. Not slotted, and
    with its own `__init__`, for speed: one is built per row, and the generated frozen `__init__`
    (one `object.__setattr__` a field) costs twice this one (which sets the instance dict at once),
    and orjson serialises a dataclass with a `__dict__` much faster than a slotted one.
    `tests/store/test_journal.py` checks the two spellings of the fields agree.
    """

    row_number: int
    success: bool
    classification: str
    status_code: int | None
    attempts: int
    retryable: bool
    error: str | None
    duration_ms: float  # the row: waits and retries too
    latency_ms: float | None = None  # the final attempt's round trip (absent from early journals)
    key: Any = None  # the row's `input.key` value, when the job has one
    idempotency_key: str | None = None
    captured: dict[str, Any] | None = None
    response_body: str | None = None  # the start of a failure's body, redacted
    digest: str | None = None  # a delta job's request digest (hex)
    # A batch job's request that gave this result: {seq: its first line's seq, index: this row's place
    # in it (from 0), size: its items}. All lines of one request are committed in one group.
    batch: dict[str, int] | None = None

    def __init__(
        self,
        *,
        row_number: int,
        success: bool,
        classification: str,
        status_code: int | None,
        attempts: int,
        retryable: bool,
        error: str | None,
        duration_ms: float,
        latency_ms: float | None = None,
        key: Any = None,
        idempotency_key: str | None = None,
        captured: dict[str, Any] | None = None,
        response_body: str | None = None,
        digest: str | None = None,
        batch: dict[str, int] | None = None,
    ) -> None:
        _set_attribute(
            self,
            "__dict__",
            {
                "row_number": row_number,
                "success": success,
                "classification": classification,
                "status_code": status_code,
                "attempts": attempts,
                "retryable": retryable,
                "error": error,
                "duration_ms": duration_ms,
                "latency_ms": latency_ms,
                "key": key,
                "idempotency_key": idempotency_key,
                "captured": captured,
                "response_body": response_body,
                "digest": digest,
                "batch": batch,
            },
        )

    def as_dict(self) -> dict[str, Any]:
        """The entry as a JSON object, without the optional fields it does not have (export, tests)."""
        return {name: value for name, value in vars(self).items() if value is not None or name in _REQUIRED}


_set_attribute = object.__setattr__  # how a frozen dataclass sets its fields in __init__
_new_object = object.__new__


def entry_of(  # noqa: PLR0917 (every field, in field order: the hot paths' constructor)
    row_number: int,
    success: bool,
    classification: str,
    status_code: int | None,
    attempts: int,
    retryable: bool,
    error: str | None,
    duration_ms: float,
    latency_ms: float | None,
    key: Any,
    idempotency_key: str | None,
    captured: dict[str, Any] | None,
    response_body: str | None,
    digest: str | None,
    batch: dict[str, int] | None,
) -> JournalEntry:
    """`JournalEntry(...)` from every field given positionally, in field order: what the senders build
    once a row. A call with fifteen keywords costs about twice this one (1.08 against 0.58 µs)."""
    return entry_with(
        {
            "row_number": row_number,
            "success": success,
            "classification": classification,
            "status_code": status_code,
            "attempts": attempts,
            "retryable": retryable,
            "error": error,
            "duration_ms": duration_ms,
            "latency_ms": latency_ms,
            "key": key,
            "idempotency_key": idempotency_key,
            "captured": captured,
            "response_body": response_body,
            "digest": digest,
            "batch": batch,
        }
    )


OnCommit = Callable[[list[JournalEntry], int], Awaitable[None] | None]


class _LineError(ValueError):
    """A journal line that fails verification; the message is the reason."""


def entry_fields(entry: JournalEntry) -> dict[str, Any]:
    """A copy of `entry`'s fields, every one, in field order: a template for entries that share most of
    their values (a batch's rows answered alike), each made by `entry_with` after setting its own."""
    return dict(vars(entry))


def entry_with(fields: dict[str, Any]) -> JournalEntry:
    """The entry whose fields are `fields`, which must be an `entry_fields` copy (every field, in field
    order, the types the schema says). A dict copy and six stores cost 0.43 µs a row against 1.09 for
    `entry_of`: the rows of one batch request share all but six of their fifteen fields."""
    entry: JournalEntry = _new_object(JournalEntry)
    _set_attribute(entry, "__dict__", fields)
    return entry


# ---------------------------------------------------------------- line format


def encode_line(seq: int, entry: JournalEntry) -> bytes:
    """The journal line of `entry` under `seq`, newline included."""
    head = b'{"seq":%d,' % seq + orjson.dumps(entry)[1:-1]
    return head + b',"crc":"%08x"}\n' % zlib.crc32(head)


def encode_batch(first_seq: int, entries: list[JournalEntry]) -> list[bytes]:
    """The lines of `entries` numbered from `first_seq`: `encode_line` with its lookups hoisted, as
    the writer's thread runs it once per batch."""
    dumps, crc32, lines = orjson.dumps, zlib.crc32, []
    for seq, entry in enumerate(entries, first_seq):
        head = b'{"seq":%d,' % seq + dumps(entry)[1:-1]
        lines.append(head + b',"crc":"%08x"}\n' % crc32(head))
    return lines


@dataclass(frozen=True, slots=True)
class CommitMarker:
    """The line a writer appends to each group it commits, in the same write and fsync:

        {"commit":12,"rows":4,"t":1764630000.123,"sum":"5f1e0c2a","crc":"0badf00d"}\\n

    `commit` is the group's last seq, `rows` its lines, `t` when it was committed (UTC unix seconds)
    and `sum` the CRC-32 of the group's bytes. A group followed by its marker is whole, so damage
    before a marker is corruption; only the last group, whose marker is not on disk, can be torn."""

    seq: int
    rows: int
    t: float
    group_crc: int


_MARKER_HEAD = b'{"commit":'
_MARKER_KEYS = ("commit", "rows", "t", "sum", "crc")


def encode_marker(seq: int, rows: int, t: float, group_crc: int) -> bytes:
    """The commit marker line of a group of `rows` lines ending at `seq`, committed at `t`."""
    head = b'{"commit":%d,"rows":%d,"t":%.3f,"sum":"%08x"' % (seq, rows, t, group_crc)
    return head + b',"crc":"%08x"}\n' % zlib.crc32(head)


def decode_marker(line: bytes) -> CommitMarker | None:
    """The marker a line holds, or None when it is not a whole, well-formed marker line."""
    if line[-_SUFFIX_LEN:] != b',"crc":"%08x"}\n' % zlib.crc32(line[:-_SUFFIX_LEN]):
        return None
    try:
        fields = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(fields) is not dict or tuple(fields) != _MARKER_KEYS:
        return None
    seq, rows, t, group_sum = fields["commit"], fields["rows"], fields["t"], fields["sum"]
    if type(seq) is not int or type(rows) is not int or not 1 <= rows <= seq or type(t) not in _NUMBER:
        return None
    if type(group_sum) is not str or len(group_sum) != 8:
        return None
    try:
        return CommitMarker(seq, rows, float(t), int(group_sum, 16))
    except ValueError:
        return None


def is_commit_marker(line: bytes) -> bool:
    """Whether `line` is a whole commit marker (not a row's line)."""
    return line.startswith(_MARKER_HEAD) and decode_marker(line) is not None


def _holds_no_row(line: bytes) -> bool:
    """A whole line of a kind other than a row's: a commit marker or a bulk-job record (jobrecords.py)."""
    return is_commit_marker(line) or is_job_record(line)


def decode_line(line: bytes) -> tuple[int, JournalEntry]:
    """The seq and entry of a verified line; ValueError naming the reason otherwise."""
    fields = _verified_fields(line)
    return fields.pop("seq"), _entry_of(fields)


def _entry_of(fields: dict[str, Any]) -> JournalEntry:
    """The entry of a verified line's keys, `seq` removed. A line of this version has every field in
    field order: its dict becomes the entry's own, as `JournalEntry.__init__` would build it, without
    a keyword call (readers build one per line). An older line, missing fields, goes the long way."""
    if len(fields) != _FIELD_COUNT:
        return JournalEntry(**fields)
    entry = _new_object(JournalEntry)
    _set_attribute(entry, "__dict__", fields)
    return entry


def _verified_fields(line: bytes) -> dict[str, Any]:
    """The keys of a verified line (checksum, JSON, schema), `crc` dropped; the replay's hot path."""
    if line[-_SUFFIX_LEN:] != b',"crc":"%08x"}\n' % zlib.crc32(line[:-_SUFFIX_LEN]):
        raise _LineError(_diagnose(line))
    try:
        fields = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _LineError("not valid JSON") from None
    if type(fields) is not dict:
        raise _LineError("not a JSON object")
    del fields["crc"]  # present: the checksum test found it at the end of the line
    if not _has_schema(fields):
        raise _LineError(entry_problem(fields) or "invalid entry")
    return fields


def _has_schema(fields: dict[str, Any]) -> bool:
    """The fast form of `entry_problem(fields) is None` for the hot paths (same rules): a line of
    this version holds exactly `_LINE_KEYS`, in that order, and the types of its values are one of
    the `_VALID_SHAPES` (one C-level map and one set lookup). Any other shape (an older line that
    left out null fields, or a hand-made one) is judged by `entry_problem`."""
    if tuple(fields) != _LINE_KEYS:
        return entry_problem(fields) is None
    return tuple(map(type, fields.values())) in _VALID_SHAPES


_REQUIRED = frozenset(name for name, _ in _SCHEMA)
_FIELD_COUNT = len(_SCHEMA) - 1 + len(_OPTIONAL)  # JournalEntry's fields: the line's keys but seq
_LINE_KEYS = ("seq", *(field.name for field in dataclass_fields(JournalEntry)))  # as the writer writes them
_new_object = object.__new__
_JSON_TYPES: frozenset[type] = frozenset({str, int, float, bool, _NoneType, dict, list})
_TYPES_BY_KEY = {**dict(_SCHEMA), **{key: types or _JSON_TYPES for key, types in _OPTIONAL.items()}}
# Every combination of value types a line of this version may hold, in `_LINE_KEYS` order (a few
# thousand tuples, made once).
_VALID_SHAPES = frozenset(itertools.product(*(_TYPES_BY_KEY[key] for key in _LINE_KEYS)))


def entry_problem(fields: dict[str, Any]) -> str | None:
    """Why the keys of a line do not make a valid journal entry, or None when they do."""
    for key, types in _SCHEMA:
        value = fields.get(key, _MISSING)
        if type(value) not in types:
            if value is _MISSING:
                return f"missing key {key!r}"
            return f"{key!r} must be {_type_names(types)}, got {type(value).__name__}"
    for key, value in fields.items():
        if key in _REQUIRED:
            continue
        if key not in _OPTIONAL:
            return f"unknown key {key!r}"
        allowed = _OPTIONAL[key]
        if allowed is not None and type(value) not in allowed:
            return f"{key!r} must be {_type_names(allowed)}, got {type(value).__name__}"
    return None


def _type_names(types: frozenset[type]) -> str:
    return " or ".join(sorted("null" if t is _NoneType else t.__name__ for t in types))


def _diagnose(line: bytes) -> str:
    """The most telling reason a line failed the checksum test (error path only)."""
    if len(line) > MAX_LINE_BYTES:
        return f"line longer than {MAX_LINE_BYTES} bytes"
    if not line.endswith(b"\n"):
        return _TRUNCATED
    if not line.strip():
        return "blank line"
    if b"\0" in line:
        return "NUL bytes"
    if line[-_SUFFIX_LEN:-11] != _CRC_TAG or line[-3:] != b'"}\n':
        return "no checksum at the end of the line"
    return "checksum mismatch"


def _read_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """Lines of a binary stream, each at most MAX_LINE_BYTES + 1 long (a longer one fails to verify)."""
    return iter(partial(stream.readline, MAX_LINE_BYTES + 1), b"")


# ---------------------------------------------------------------- the reader API


def read_journal(path: Path) -> Iterator[JournalEntry]:
    """The committed entries of a journal, in order, streaming. Stops quietly at the first line that
    does not verify: a torn tail, or a batch being written right now, is not committed. A missing
    journal has no entries. (Judging damage is `scan_journal`'s job, for resume.)"""
    if not path.exists():
        return
    with path.open("rb") as stream:
        for line in _read_lines(stream):
            try:
                fields = _verified_fields(line)
            except ValueError:
                if _holds_no_row(line):  # a group's commit marker, a bulk job's record
                    continue
                return
            del fields["seq"]
            yield _entry_of(fields)


def read_journal_from(path: Path, offset: int) -> Iterator[tuple[int, int, JournalEntry]]:
    """(offset of the line, offset after it, entry) for each committed line from byte `offset`, for
    readers that come back to a line (export) or resume where they left off (sync state)."""
    if not path.exists():
        return
    with path.open("rb") as stream:
        stream.seek(offset)
        for line in _read_lines(stream):
            try:
                _, entry = decode_line(line)
            except ValueError:
                if not _holds_no_row(line):
                    return
            else:
                yield offset, offset + len(line), entry
            offset += len(line)


def read_commits(path: Path) -> Iterator[CommitMarker]:
    """The commit markers of a journal, in order: when each group was committed (`t`, UTC unix
    seconds) and how many rows it held, for throughput over time. A journal written before markers
    has none; lines that are not markers are skipped unread."""
    if not path.exists():
        return
    with path.open("rb") as stream:
        for line in _read_lines(stream):
            if line.startswith(_MARKER_HEAD) and (marker := decode_marker(line)) is not None:
                yield marker


def read_entry_at(stream: IO[bytes], offset: int) -> JournalEntry:
    """The entry of the line at `offset` of an open journal (one `read_journal_from` found there)."""
    stream.seek(offset)
    return decode_line(stream.readline(MAX_LINE_BYTES + 1))[1]


# ---------------------------------------------------------------- group-commit writer


@dataclass(frozen=True, slots=True)
class CommittedPrefix:
    """The journal's first `offset` bytes (lines 1..`seq`) as a checkpoint records them: their SHA-256
    and the rows they hold. A resume that finds the same digest there knows those lines are the very
    lines a writer wrote (and a writer writes only whole, valid entries), so it decodes only the
    lines after them; any change to those bytes makes it check every line and refuse."""

    seq: int
    offset: int
    ok: int  # lines 1..seq with a successful result
    sha256: str
    done_rows: bytes  # RowSet.to_bytes() of the rows in lines 1..seq


@dataclass(slots=True)
class JournalState:
    """What a writer knows of the journal before its first append, so it can keep `CommittedPrefix`."""

    offset: int
    hasher: Any  # a hashlib sha256 object fed bytes [0, offset)
    done: RowSet  # the rows in those bytes (the writer's own copy: it adds to it)
    ok: int = 0  # how many of them succeeded

    @classmethod
    def empty(cls, row_count: int) -> JournalState:
        return cls(0, hashlib.sha256(), RowSet(row_count))


class JournalWriter:
    """The one appender of a journal, committing entries in groups.

    `run()` is the committer loop (start it in the engine's task group); `submit()` queues an entry
    under the next seq; `close()` commits what is pending and ends the loop. A batch is encoded,
    checksummed, written and fsynced in a worker thread, off the event loop. After its write and
    fsync succeed, `on_commit(entries, end_offset)` is called (and awaited if it returns an
    awaitable); `end_offset` is the journal's size after the batch. A failed write or fsync raises
    `StorageFailed` out of `run()` and that batch is never reported.

    Given a `state` matching the file it opens, the writer keeps the digest and done rows of what it
    has committed (`prefix()`), for the checkpoint; without one, `prefix()` is None.
    """

    def __init__(
        self,
        path: Path,
        storage: Storage,
        *,
        next_seq: int,
        on_commit: OnCommit,
        max_rows: int = GROUP_ROWS,
        max_bytes: int = 1 << 20,
        max_delay: float = 0.010,
        state: JournalState | None = None,
    ) -> None:
        if next_seq < 1 or max_rows < 1 or max_bytes < 1 or max_delay < 0:
            raise ValueError("next_seq, max_rows and max_bytes must be >= 1 and max_delay >= 0")
        self._path = path
        self._storage = storage
        self._committed_seq = next_seq - 1
        self._on_commit = on_commit
        self._max_rows = max_rows
        self._backlog = BACKLOG_GROUPS * max_rows  # entries queued at most before `submit` waits
        self._max_bytes = max_bytes
        self._max_delay = max_delay
        self._pending: list[JournalEntry] = []  # numbered from _committed_seq + 1; the first may be in flight
        # The sizes of the units pending, in order, once a group was submitted (`submit_group`): a batch
        # is cut only between them. None while every unit is one entry (no bookkeeping per row).
        self._groups: deque[int] | None = None
        self._first_at = 0.0  # when the oldest pending entry arrived
        self._wake = anyio.Event()  # set when the committer has something to look at
        self._space = anyio.Event()  # set when a batch was committed (backpressure)
        self._stopped = anyio.Event()
        self._ended = False  # `_stopped` as a plain flag: submit() reads it once a row
        self._started = False
        self._closing = False
        self._failure: Exception | None = None
        self._offset = 0
        self._state = state
        self._sha256 = ""
        self._fd: int | None = None
        self._io = anyio.Lock()  # one write at a time: a group's, or a record's (commit_record)
        # The groups' writes go to a thread of the writer's own through asyncio: a hand-off costs the
        # event loop about 20 µs of CPU there against 35-55 through anyio.to_thread (issue 44).
        self._writer_thread: ThreadPoolExecutor | None = None

    def offer(self, entry: JournalEntry) -> bool:
        """Queue `entry` as `submit` does when that needs no wait (the common case: no backpressure, no
        failure, nothing grouped): no coroutine to make. False: nothing queued; await `submit`."""
        pending = self._pending
        if len(pending) >= self._backlog or self._failure is not None or self._ended:
            return False
        if self._closing or self._groups is not None:
            return False
        if not pending:
            self._first_at = anyio.current_time()
            self._wake.set()
        pending.append(entry)
        if len(pending) == self._max_rows:
            self._wake.set()
        return True

    async def submit(self, entry: JournalEntry) -> None:
        """Queue `entry` under the next seq; waits while too much is pending (backpressure)."""
        while len(self._pending) >= self._backlog:
            await self._check_running()
            await self._space.wait()
        if self._failure is not None or self._ended:  # the common case skips an await
            await self._check_running()
        if self._closing:
            raise RuntimeError("journal writer is closing")
        if not self._pending:
            self._first_at = anyio.current_time()
            self._wake.set()
        self._pending.append(entry)
        if self._groups is not None:
            self._groups.append(1)
        if len(self._pending) == self._max_rows:
            self._wake.set()

    async def submit_group(self, build: Callable[[int], list[JournalEntry]]) -> None:
        """Queue the entries `build(first_seq)` returns, given the seq their first line will have, as one
        group: they are committed in the same write and fsync, never some without the others (the rows
        of one batch request)."""
        while len(self._pending) >= self._backlog:
            await self._check_running()
            await self._space.wait()
        if self._failure is not None or self._stopped.is_set():
            await self._check_running()
        if self._closing:
            raise RuntimeError("journal writer is closing")
        entries = build(self._committed_seq + len(self._pending) + 1)
        if not entries:
            return
        if self._groups is None:
            self._groups = deque([1] * len(self._pending))
        if not self._pending:
            self._first_at = anyio.current_time()
            self._wake.set()
        self._pending.extend(entries)
        self._groups.append(len(entries))
        if len(self._pending) >= self._max_rows:
            self._wake.set()

    def prefix(self) -> CommittedPrefix | None:
        """The digest and done rows of everything committed so far, or None when not kept."""
        if self._state is None:
            return None
        done = self._state.done.to_bytes()
        return CommittedPrefix(self._committed_seq, self._offset, self._state.ok, self._sha256, done)

    async def close(self) -> None:
        """Commit everything pending, then wait for `run()` to end; re-raises the failure that ended it.
        `run()` must be running or scheduled (started in a task group) for this to return."""
        self._closing = True
        self._wake.set()
        await self._stopped.wait()
        await self._check_running(closing=True)

    async def run(self) -> None:
        if self._started:
            raise RuntimeError("journal writer is already running")
        self._started = True
        fd: int | None = None
        try:
            fd = self._fd = await anyio.to_thread.run_sync(self._open)
            while await self._wait_for_batch():
                await self._commit(fd)
        except Exception as exc:  # StorageFailed, or an error raised by on_commit
            self._failure = exc
            raise
        finally:
            if self._writer_thread is not None:
                self._writer_thread.shutdown(wait=False)  # idle: no commit runs past the loop above
            self._ended = True
            self._stopped.set()
            self._space.set()  # wake blocked submitters so they see the stop
            if fd is not None:
                self._storage.close(fd)

    def _open(self) -> int:
        fd = self._storage.open_append(self._path)
        # Once per writer, not per batch: makes the file's directory entry durable. Done even when
        # the file already existed, as a killed predecessor may have died before its own dir fsync.
        self._storage.fsync_dir(self._path.parent)
        self._offset = os.fstat(fd).st_size
        if self._state is not None:
            if self._state.offset != self._offset:
                self._state = None  # not the bytes the state describes: keep no prefix
            else:
                self._sha256 = self._state.hasher.hexdigest()
        return fd

    async def _wait_for_batch(self) -> bool:
        """Wait until a batch is due: full, `max_delay` old, or closing. False: closed and drained."""
        while not self._pending:
            if self._closing:
                return False
            await self._wait_wake(None)
        deadline = self._first_at + self._max_delay
        while not self._closing and len(self._pending) < self._max_rows:
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                break
            await self._wait_wake(remaining)
        return True

    async def _wait_wake(self, timeout: float | None) -> None:
        with anyio.move_on_after(timeout):
            await self._wake.wait()
        if self._wake.is_set():
            self._wake = anyio.Event()

    def _group_ends(self) -> list[int] | None:
        """Where the next batch may end (counts of entries from the front, at least one group, at most
        `max_rows` unless the first group alone is longer); None: anywhere."""
        if self._groups is None:
            return None
        ends: list[int] = []
        total = 0
        for size in self._groups:
            if ends and total + size > self._max_rows:
                break
            total += size
            ends.append(total)
        return ends

    async def _commit(self, fd: int) -> None:
        import asyncio  # loaded by the running loop; at the top it cost `status` (no journal written) 20 ms

        ends = self._group_ends()
        batch = self._pending[: self._max_rows if ends is None else ends[-1]]
        # Shielded: once the bytes may be on disk, finish the fsync and report the commit, so a
        # cancellation cannot separate what is durable from what the engine counts.
        with anyio.CancelScope(shield=True):
            async with self._io:
                if self._writer_thread is None:
                    self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="bulkrelay-journal")
                write = partial(self._write_batch, fd, batch, ends)
                count, size, sha256 = await asyncio.get_running_loop().run_in_executor(
                    self._writer_thread, write
                )
            del self._pending[:count], batch[count:]
            if self._groups is not None and ends is not None:
                for _ in range(ends.index(count) + 1):
                    self._groups.popleft()
            self._committed_seq += count
            self._offset += size
            self._sha256 = sha256
            self._track(batch)
            if self._pending:
                self._first_at = anyio.current_time()
            self._space.set()
            self._space = anyio.Event()
            result = self._on_commit(batch, self._offset)
            if result is not None:
                await result

    def _write_batch(
        self, fd: int, batch: list[JournalEntry], ends: list[int] | None = None
    ) -> tuple[int, int, str]:
        """In the writer's thread: encode the batch's lines (as many as fit in `max_bytes`, at least
        one; with group `ends`, up to the last end that fits, at least the first group), write them with
        one write, fsync, and fold them into the digest.
        Returns (lines, bytes, the digest of the journal up to them)."""
        lines = encode_batch(self._committed_seq + 1, batch)
        size, count = 0, 0
        for line in lines:
            if count and size + len(line) > self._max_bytes:
                break
            size += len(line)
            count += 1
        if ends is not None:  # whole requests only: never half of a batch's rows
            count = max([end for end in ends if end <= count] or ends[:1])
        group = b"".join(lines[:count])
        # The group's commit marker goes in the same write: on disk, a group with its marker is whole.
        data = group + encode_marker(self._committed_seq + count, count, time.time(), zlib.crc32(group))
        size = len(data)
        self._storage.write(fd, data)
        self._storage.fsync(fd)
        if self._state is None:
            return count, size, ""
        self._state.hasher.update(data)
        return count, size, self._state.hasher.hexdigest()

    def _track(self, batch: list[JournalEntry]) -> None:
        """Add the committed rows to the prefix's done rows (on the event loop, so `prefix()` never
        sees rows of a batch that is not committed yet)."""
        if self._state is None:
            return
        try:
            each_once = self._state.done.add_all([entry.row_number for entry in batch]) is None
        except ValueError:  # a row outside the input's
            each_once = False
        if not each_once:
            self._state = None  # a resume must then check every line, and will say what is wrong
            return
        self._state.ok += [entry.success for entry in batch].count(True)

    async def commit_record(self, line: bytes) -> None:
        """Append `line`, a line with no row (a bulk job's record), after every entry queued before the
        call, in a write and fsync of its own between groups; returns once it is durable."""
        target = self._committed_seq + len(self._pending)
        while self._committed_seq < target or self._fd is None:
            await self._check_running()
            with anyio.move_on_after(_FAILURE_GRACE):
                await self._space.wait()
        fd = self._fd
        with anyio.CancelScope(shield=True):
            async with self._io:
                await self._check_running()
                sha256 = await anyio.to_thread.run_sync(self._write_record, fd, line)
                # offset and digest change together, on the loop: `prefix()` never pairs one with the other
                self._offset += len(line)
                self._sha256 = sha256

    def _write_record(self, fd: int, line: bytes) -> str:
        self._storage.write(fd, line)
        self._storage.fsync(fd)
        if self._state is None:
            return ""
        self._state.hasher.update(line)
        return str(self._state.hasher.hexdigest())

    async def _check_running(self, *, closing: bool = False) -> None:
        """Raise if `run()` has ended (on failure: the exception that ended it, normally StorageFailed)."""
        if self._failure is not None:
            # run() is raising this failure already. When the caller shares its task group, the
            # cancellation that follows arrives within the grace period, so the group reports the
            # failure once; a caller elsewhere gets it raised here.
            with anyio.move_on_after(_FAILURE_GRACE):
                await anyio.sleep_forever()
            raise self._failure
        if self._stopped.is_set() and not closing:
            raise RuntimeError("journal writer has stopped")


# ---------------------------------------------------------------- replay and recovery


@dataclass(frozen=True, slots=True)
class TornTail:
    """Damage after the committed frontier: bytes [start, end) of the journal, from line `line` on."""

    start: int
    end: int
    line: int
    reason: str


@dataclass(frozen=True, slots=True)
class JournalScan:
    done: RowSet  # rows with a committed final result
    last_seq: int  # also the number of good lines: seq counts them from 1
    valid_end: int  # byte offset just past the last good line
    ok: int  # good lines with a successful result
    torn_tail: TornTail | None
    hasher: Any  # sha256 of bytes [0, valid_end)

    @property
    def failed(self) -> int:
        return self.last_seq - self.ok

    def writer_state(self) -> JournalState:
        """What a writer appending after `valid_end` starts from (its own copies)."""
        done = RowSet.from_bytes(self.done.size, self.done.to_bytes())
        return JournalState(self.valid_end, self.hasher.copy(), done, self.ok)


@dataclass(slots=True)
class _Replay:
    """The state of a replay: everything learned from the good lines so far.

    Since the last commit marker taken (`marker_end`; `marked` once there was one) it also keeps the
    CRC-32 and the number of the lines of the group being read, which its marker must match."""

    done: RowSet
    ok: int = 0
    last_seq: int = 0
    offset: int = 0
    group_crc: int = 0
    group_lines: int = 0
    marked: bool = False
    marker_end: int = 0  # just past the last marker taken (0: none)
    marker_seq: int = 0  # the last seq it committed
    marker_ok: int = 0  # the successful lines up to it
    markers: int | None = 0  # markers taken, so lines = seq + markers; None: not counted (fast resume)

    def run(self, lines: Iterator[bytes], stop_at: int) -> str | None:
        """Take good lines until `offset` reaches `stop_at` or the lines end. Returns the reason the
        next line is damage (it is not taken), or None. Hot path: state lives in locals; a commit
        marker (one a group) is met in the exception path, so an entry line pays one CRC for it."""
        done, size, verified, crc32 = self.done, self.done.size, _verified_fields, zlib.crc32
        last_seq, offset, ok = self.last_seq, self.offset, self.ok
        group_crc, group_lines = self.group_crc, self.group_lines
        if offset >= stop_at:
            return None
        reason = None
        for line in lines:
            try:
                entry = verified(line)
            except ValueError as bad:
                marker = decode_marker(line) if line.startswith(_MARKER_HEAD) else None
                if marker is None and not is_job_record(line):
                    reason = str(bad)
                    break
                self.last_seq, self.offset, self.ok = last_seq, offset, ok
                self.group_crc, self.group_lines = group_crc, group_lines
                reason = self.take_marker(marker, len(line)) if marker else self.take_record(len(line))
                if reason is not None:
                    break
                offset, group_crc, group_lines = self.offset, 0, 0
                if offset >= stop_at:
                    break
                continue
            seq, row = entry["seq"], entry["row_number"]
            if seq != last_seq + 1:
                reason = f"seq {seq} does not follow seq {last_seq}"
                break
            if not 0 < row <= size:
                reason = f"row_number {row} is outside the input's rows 1..{size}"
                break
            if not done.add(row):
                reason = f"duplicate row_number {row}"
                break
            last_seq, offset = seq, offset + len(line)
            ok += entry["success"]
            group_crc, group_lines = crc32(line, group_crc), group_lines + 1
            if offset >= stop_at:
                break
        self.last_seq, self.offset, self.ok = last_seq, offset, ok
        self.group_crc, self.group_lines = group_crc, group_lines
        return reason

    def take_marker(self, marker: CommitMarker, length: int) -> str | None:
        """Take the marker of the group just read (None), or say why it does not vouch for it."""
        problem = _marker_problem(marker, self.last_seq, self.group_lines, self.group_crc, self.marked)
        if problem is not None:
            return problem
        self.offset += length
        self.mark(self.offset)
        if self.markers is not None:
            self.markers += 1
        return None

    def take_record(self, length: int) -> str | None:
        """Take a bulk job's record: the writer puts one between groups, so it closes the one before."""
        if self.group_lines:
            return f"a bulk-job record after {self.group_lines} lines without their commit marker"
        self.offset += length
        self.mark(self.offset)
        if self.markers is not None:
            self.markers += 1
        return None

    def mark(self, offset: int) -> None:
        """A commit marker ends at `offset`, where the replay stands: every line before it is committed."""
        self.marked, self.marker_end, self.marker_seq, self.marker_ok = True, offset, self.last_seq, self.ok
        self.group_crc = self.group_lines = 0

    def line(self, path: Path, offset: int) -> int:
        """The number (from 1) of the line at `offset`, the replay's own or the next one."""
        if self.markers is not None and offset == self.offset:
            return self.last_seq + self.markers + 1
        return _lines_before(path, offset) + 1

    def back_to_marker(self, path: Path) -> None:
        """Give back the lines read since the last marker: their group was never committed."""
        with open(path, "rb", opener=open_private) as stream:
            stream.seek(self.marker_end)
            remaining = self.offset - self.marker_end
            for line in _read_lines(stream):
                if remaining <= 0:
                    break
                remaining -= len(line)
                self.done.discard(_verified_fields(line)["row_number"])
        self.last_seq, self.ok, self.offset = self.marker_seq, self.marker_ok, self.marker_end
        self.group_crc = self.group_lines = 0


def _marker_problem(marker: CommitMarker, last_seq: int, lines: int, crc: int, marked: bool) -> str | None:
    """Why a commit marker does not vouch for the lines since the previous one, or None.

    After an earlier marker its group is exactly those lines. Before any (a journal begun by a
    version without markers, continued by this one) they may start with lines of the older version,
    and the group's checksum is checked only when it covers all of them."""
    if marker.seq != last_seq:
        return f"commit marker for seq {marker.seq} after seq {last_seq}"
    if marker.rows > lines or (marked and marker.rows != lines):
        return f"commit marker for {marker.rows} lines after a group of {lines}"
    if marker.rows == lines and marker.group_crc != crc:
        return f"commit marker checksum {marker.group_crc:08x} does not match its {lines} lines ({crc:08x})"
    return None


def _lines_before(path: Path, offset: int) -> int:
    """How many newlines the journal has before `offset` (an error path: one streaming pass)."""
    count = 0
    with open(path, "rb", opener=open_private) as stream:
        remaining = offset
        while remaining > 0:
            chunk = stream.read(min(remaining, _COPY_CHUNK))
            if not chunk:
                break
            count += chunk.count(b"\n")
            remaining -= len(chunk)
    return count


def scan_journal(
    path: Path,
    *,
    committed_seq: int,
    committed_offset: int,
    row_count: int,
    prefix: CommittedPrefix | None = None,
) -> JournalScan:
    """Validate the journal, streaming, and rebuild the done rows and counts.

    With the checkpoint's `prefix` (digest and done rows of the committed lines) the committed bytes
    are checked by one hash pass and only the lines after them are decoded; when the digest differs,
    every line is checked, so the refusal names the damaged line. Raises `JournalCorrupt` (context:
    offset, line, reason) for damage at or before the committed frontier or a journal shorter than
    it; damage after it is reported as `torn_tail`.
    """
    frontier = (committed_seq, committed_offset)
    if prefix is not None and (not committed_offset or (prefix.seq, prefix.offset) != frontier):
        prefix = None  # recorded for another frontier: it says nothing about this one
    replay = _Replay(RowSet(row_count))
    hasher = hashlib.sha256()
    size = path.stat().st_size if path.exists() else 0
    torn: TornTail | None = None
    if size:
        with open(path, "rb", opener=open_private) as stream:
            hashed = _verified_prefix(stream, size, replay, hasher, prefix)
            if not hashed:
                hasher = hashlib.sha256()
                stream.seek(0)
                _replay_committed(path, size, _read_lines(stream), replay, frontier)
                if prefix is not None:
                    raise _prefix_mismatch(path, committed_offset)
            elif _ends_with_marker(stream, hashed):  # the lines before the frontier are a marked journal's
                replay.mark(hashed)
            lines = _read_lines(stream)
            reason = replay.run(lines, stop_at=size + 1)
            torn = _torn_tail(path, lines, replay, reason, (committed_seq, committed_offset))
            _hash_range(stream, hasher, hashed, replay.offset)
    elif committed_seq or committed_offset:
        raise _shorter_than_checkpoint(path, replay, size, committed_offset)
    return JournalScan(replay.done, replay.last_seq, replay.offset, replay.ok, torn, hasher)


def _torn_tail(
    path: Path, lines: Iterator[bytes], replay: _Replay, reason: str | None, frontier: tuple[int, int]
) -> TornTail | None:
    """What follows the replay's last good line (`reason`: why the next one is damage; None: none is).

    In a journal with commit markers only the last group, which has no marker yet, can be torn: it
    goes whole, its good lines too (never reported committed, so their rows are simply sent again).
    Damage with a marker after it is in a complete group: corruption. A journal without markers (an
    older version's) keeps the older rule: damage after the frontier is torn; with no frontier, only
    damage that no good line follows."""
    committed_seq, committed_offset = frontier
    if replay.marked:
        if reason is None and replay.offset == replay.marker_end:
            return None
        if reason is not None and _marker_follows(lines):
            raise _corrupt(
                path,
                replay.offset,
                replay.line(path, replay.offset),
                f"{reason}, and a commit marker follows it: only the last group, which has none, may be torn",
            )
        if replay.marker_end < committed_offset:
            where = f"the checkpoint's frontier {committed_offset} is past the last commit marker"
            raise _corrupt(path, replay.marker_end, replay.line(path, replay.marker_end), where)
        end = path.stat().st_size
        replay.back_to_marker(path)
        why = reason or "the last group has no commit marker (a crash before its write ended)"
        return TornTail(start=replay.offset, end=end, line=replay.line(path, replay.offset), reason=why)
    if reason is None:
        return None
    if not committed_seq:
        _refuse_unless_at_end(path, lines, replay, reason)
    end = path.stat().st_size
    return TornTail(start=replay.offset, end=end, line=replay.line(path, replay.offset), reason=reason)


def _marker_follows(lines: Iterator[bytes]) -> bool:
    return any(is_commit_marker(line) for line in lines)


def _ends_with_marker(stream: BufferedReader, offset: int) -> bool:
    """Whether the line that ends at `offset` is a commit marker; the stream is left at `offset`."""
    start = max(0, offset - 512)  # a marker line is under 100 bytes
    stream.seek(start)
    before = stream.read(offset - start)
    stream.seek(offset)
    if not before.endswith(b"\n"):
        return False
    return decode_marker(before[before.rfind(b"\n", 0, len(before) - 1) + 1 :]) is not None


def _verified_prefix(
    stream: BufferedReader,
    size: int,
    replay: _Replay,
    hasher: Any,
    prefix: CommittedPrefix | None,
) -> int:
    """Take the committed lines at once when their bytes hash to the checkpoint's digest (and its done
    rows fit): `replay` and `hasher` then stand at the frontier, whose offset is returned, and the
    stream just past it. 0: check them line by line."""
    if prefix is None or size < prefix.offset:
        return 0
    if not _hash_range(stream, hasher, 0, prefix.offset) or hasher.hexdigest() != prefix.sha256:
        return 0
    try:
        done = RowSet.from_bytes(replay.done.size, prefix.done_rows)
    except ValueError:
        return 0
    if len(done) != prefix.seq or not 0 <= prefix.ok <= prefix.seq:
        return 0
    replay.done, replay.ok, replay.last_seq, replay.offset = done, prefix.ok, prefix.seq, prefix.offset
    replay.markers = None  # how many lines those bytes hold is counted only if an error must say
    return prefix.offset


def _hash_range(stream: BufferedReader, hasher: Any, start: int, end: int) -> bool:
    """Feed bytes [start, end) of `stream` to `hasher`, leaving the stream at `end`; False: it ended first."""
    stream.seek(start)
    buffer = memoryview(bytearray(_COPY_CHUNK))
    remaining = end - start
    while remaining > 0:
        read = stream.readinto(buffer[: min(remaining, _COPY_CHUNK)])
        if not read:
            return False
        hasher.update(buffer[:read])
        remaining -= read
    return True


def _prefix_mismatch(path: Path, committed_offset: int) -> JournalCorrupt:
    """Every committed line checks out on its own, yet their bytes are not the ones the checkpoint
    recorded (lines rewritten with valid checksums, or a damaged checkpoint): refuse all the same."""
    reason = (
        f"the committed bytes 0..{committed_offset} do not match the digest and rows the checkpoint "
        "recorded for them"
    )
    return JournalCorrupt(
        f"{path.name} does not match {path.parent.name}/checkpoint.json: {reason}",
        context={"file": str(path), "offset": 0, "line": 1, "reason": reason},
        suggestion=f"committed results were changed: restore {path} from a backup",
    )


def _replay_committed(
    path: Path, size: int, lines: Iterator[bytes], replay: _Replay, frontier: tuple[int, int]
) -> None:
    """Replay up to the committed frontier, where any damage (or the end of the file) is corruption.

    A journal shorter than the frontier is named by the first line where its sequence breaks (a
    deleted line in the middle shows there as a seq gap); only when every line up to the end of the
    file is good, or the last one is cut short, is the refusal about the file's length."""
    committed_seq, committed_offset = frontier
    reason = replay.run(lines, stop_at=committed_offset)
    if size < committed_offset and reason in (None, _TRUNCATED):
        raise _shorter_than_checkpoint(path, replay, size, committed_offset)
    if reason is None and replay.offset < committed_offset:
        reason = "the journal ends early"
    if reason is not None:
        raise _corrupt(path, replay.offset, replay.line(path, replay.offset), reason)
    if replay.offset != committed_offset:
        raise _corrupt(
            path,
            committed_offset,
            replay.line(path, replay.offset) - 1,
            f"the checkpoint offset {committed_offset} is not at the end of a line",
        )
    if replay.last_seq != committed_seq:
        raise _corrupt(
            path,
            committed_offset,
            replay.line(path, replay.offset) - 1,
            f"the checkpoint says seq {committed_seq} ends at offset {committed_offset}, "
            f"the journal has seq {replay.last_seq} there",
        )


def _refuse_unless_at_end(path: Path, lines: Iterator[bytes], replay: _Replay, reason: str) -> None:
    """With no committed frontier (no checkpoint, or one from before the first commit), nothing marks
    where the last batch began. What a crash leaves is known, though: the end of its one write is
    missing or unreadable, so no good line can follow the damage. One that does means the damage is
    in committed rows (a flipped byte, say), and replaying past it would resend them."""
    for line in lines:
        try:
            _verified_fields(line)
        except ValueError:
            if not _holds_no_row(line):
                continue
        raise _corrupt(
            path,
            replay.offset,
            replay.line(path, replay.offset),
            f"{reason}, and good lines follow it: without a checkpoint only the end of the journal "
            "may be torn",
        )


def _corrupt(path: Path, offset: int, line: int, reason: str) -> JournalCorrupt:
    return JournalCorrupt(
        f"{path.name} is corrupt at line {line} (byte offset {offset}): {reason}",
        context={"file": str(path), "offset": offset, "line": line, "reason": reason},
        suggestion=f"committed results were damaged: restore {path} from a backup",
    )


def _shorter_than_checkpoint(path: Path, replay: _Replay, size: int, committed_offset: int) -> JournalCorrupt:
    """Every line up to the end of the file is good (the last may be cut): the file itself is short."""
    reason = f"the journal has {size} bytes but the checkpoint has committed {committed_offset}"
    return _corrupt(path, size, replay.line(path, size), reason)


def recover_torn_tail(path: Path, scan: JournalScan, storage: Storage) -> Path | None:
    """Move the torn tail aside (`results.jsonl.torn-<UTC stamp>`, fsynced) and truncate the journal
    to its last good line. Returns the aside file, or None when there was no torn tail."""
    if scan.torn_tail is None:
        return None
    aside = _aside_path(path)
    fd = storage.open_new(aside)
    try:
        try:
            with open(path, "rb", opener=open_private) as stream:
                stream.seek(scan.valid_end)
                for chunk in iter(partial(stream.read, _COPY_CHUNK), b""):
                    storage.write(fd, chunk)
            storage.fsync(fd)
        finally:
            storage.close(fd)
    except StorageFailed:
        # A full disk stops the copy midway: the journal is untouched, and the next resume copies the
        # tail again. A half copy left beside it would pass for the torn tail without being it.
        with suppress(OSError):
            aside.unlink()
        raise
    storage.fsync_dir(path.parent)  # the copy is durable before any byte of the journal goes
    fd = storage.open_append(path)
    try:
        storage.truncate(fd, scan.valid_end)
        storage.fsync(fd)
    finally:
        storage.close(fd)
    return aside


def _aside_path(path: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.torn-{stamp}")
    suffix = 1
    while aside.exists():
        suffix += 1
        aside = path.with_name(f"{path.name}.torn-{stamp}-{suffix}")
    return aside
