"""`results.jsonl`, the source of truth: one line per final row result, committed in groups.

Line format. A line is a compact JSON object whose last key is a checksum of the line's own bytes:

    {"seq":1,"row_number":7,...,"duration_ms":12.5,"crc":"1c291ca3"}\\n

`crc` is the CRC-32 (zlib) of every byte before `,"crc":`, as 8 lowercase hex digits, so the line
ends with exactly 19 fixed-shape bytes. Verifying is a slice, a C-speed crc32 and a compare; the
JSON parser then reads the line as is (no copy) and the `crc` key is dropped.

Durability. One `JournalWriter` appends: a batch (up to `max_rows`, `max_bytes`, or `max_delay` after
its first entry) is written with one write and one fsync, and only then reported as committed.
A crash can therefore damage only the last, uncommitted batch. Recovery (`scan_journal`) treats
damage after the checkpoint's committed frontier as that torn batch and moves it aside; damage at
or before the frontier, or a journal shorter than it, is corruption and refuses the resume. With no
frontier (no checkpoint yet, or a deleted one) only damage that no good line follows is a torn tail.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO, Any

import anyio
import orjson

from bulkrelay.errors import JournalCorrupt
from bulkrelay.private import open_private
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.storage import Storage

MAX_LINE_BYTES = 16 << 20  # a longer "line" is garbage; the reader never buffers more than this
_SUFFIX_LEN = 19  # len(',"crc":"xxxxxxxx"}\n')
_CRC_TAG = b',"crc":"'
_COPY_CHUNK = 1 << 20
_TRUNCATED = "truncated line (no newline at the end)"  # only ever the last line of a file
_FAILURE_GRACE = 0.1  # seconds; see JournalWriter._check_running

_MISSING = object()
_NoneType = type(None)
_INT_OR_NULL: frozenset[type] = frozenset({int, _NoneType})
_STR_OR_NULL: frozenset[type] = frozenset({str, _NoneType})
_NUMBER: frozenset[type] = frozenset({int, float})
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

OnCommit = Callable[[list[dict[str, Any]], int], Awaitable[None] | None]


class _LineError(ValueError):
    """A journal line that fails verification; the message is the reason."""


# ---------------------------------------------------------------- line format


def encode_entry(entry: dict[str, Any]) -> bytes:
    """One journal line for `entry` (which must not hold a `crc` key), newline included."""
    head = orjson.dumps(entry)[:-1]
    return head + b',"crc":"%08x"}\n' % zlib.crc32(head)


def decode_line(line: bytes) -> dict[str, Any]:
    """The entry of a verified line, without its `crc`; ValueError naming the reason otherwise."""
    if line[-_SUFFIX_LEN:] != b',"crc":"%08x"}\n' % zlib.crc32(line[:-_SUFFIX_LEN]):
        raise _LineError(_diagnose(line))
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _LineError("not valid JSON") from None
    if type(entry) is not dict:
        raise _LineError("not a JSON object")
    entry.pop("crc", None)
    if not _has_schema(entry):
        raise _LineError(entry_problem(entry) or "invalid entry")
    return entry


def _has_schema(entry: dict[str, Any]) -> bool:
    """The fast form of `entry_problem(entry) is None` for the replay hot path (same _SCHEMA)."""
    get = entry.get
    return (
        type(get("seq")) is int
        and type(get("row_number")) is int
        and type(get("success")) is bool
        and type(get("classification")) is str
        and type(get("status_code", _MISSING)) in _INT_OR_NULL
        and type(get("attempts")) is int
        and type(get("retryable")) is bool
        and type(get("error", _MISSING)) in _STR_OR_NULL
        and type(get("duration_ms")) in _NUMBER
    )


def entry_problem(entry: dict[str, Any]) -> str | None:
    """Why `entry` is not a valid journal entry, or None when it is."""
    for key, types in _SCHEMA:
        value = entry.get(key, _MISSING)
        if type(value) not in types:
            if value is _MISSING:
                return f"missing key {key!r}"
            allowed = " or ".join(sorted("null" if t is _NoneType else t.__name__ for t in types))
            return f"{key!r} must be {allowed}, got {type(value).__name__}"
    return None


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


def iter_journal(path: Path) -> Iterator[dict[str, Any]]:
    """Stream the verified entries of a journal, stopping quietly at the first line that does not
    verify (a torn tail, or a batch being written right now). Use `scan_journal` to judge damage."""
    with path.open("rb") as stream:
        for line in _read_lines(stream):
            try:
                entry = decode_line(line)
            except ValueError:
                return
            yield entry


# ---------------------------------------------------------------- group-commit writer


class JournalWriter:
    """The one appender of a journal, committing entries in groups.

    `run()` is the committer loop (start it in the engine's task group); `submit()` assigns the next
    seq and queues an entry; `close()` commits what is pending and ends the loop. After each batch's
    write and fsync succeed, `on_commit(entries, end_offset)` is called (and awaited if it returns an
    awaitable); `end_offset` is the journal's size after the batch. A failed write or fsync raises
    `StorageFailed` out of `run()` and that batch is never reported.
    """

    def __init__(
        self,
        path: Path,
        storage: Storage,
        *,
        next_seq: int,
        on_commit: OnCommit,
        max_rows: int = 1000,
        max_bytes: int = 1 << 20,
        max_delay: float = 0.010,
    ) -> None:
        if next_seq < 1 or max_rows < 1 or max_bytes < 1 or max_delay < 0:
            raise ValueError("next_seq, max_rows and max_bytes must be >= 1 and max_delay >= 0")
        self._path = path
        self._storage = storage
        self._next_seq = next_seq
        self._on_commit = on_commit
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._max_delay = max_delay
        self._entries: list[dict[str, Any]] = []
        self._lines: list[bytes] = []
        self._pending_bytes = 0
        self._first_at = 0.0  # when the oldest pending entry arrived
        self._wake = anyio.Event()  # set when the committer has something to look at
        self._space = anyio.Event()  # set when the committer took a batch (backpressure)
        self._stopped = anyio.Event()
        self._started = False
        self._closing = False
        self._failure: Exception | None = None
        self._offset = 0

    async def submit(self, entry: dict[str, Any]) -> None:
        """Queue `entry` under the next seq; waits while too much is pending (backpressure)."""
        while self._backlogged():
            await self._check_running()
            await self._space.wait()
        if self._failure is not None or self._stopped.is_set():  # the common case skips an await
            await self._check_running()
        if self._closing:
            raise RuntimeError("journal writer is closing")
        if "seq" in entry or "crc" in entry:
            raise ValueError("journal entries get their seq and crc from the writer")
        full = {"seq": self._next_seq, **entry}
        if not _has_schema(full):  # a line the writer accepts must never make a resume refuse
            problem = entry_problem(full)
            raise ValueError(f"invalid journal entry for row {entry.get('row_number')!r}: {problem}")
        line = encode_entry(full)
        self._next_seq += 1
        if not self._lines:
            self._first_at = anyio.current_time()
            self._wake.set()
        self._entries.append(full)
        self._lines.append(line)
        self._pending_bytes += len(line)
        if self._batch_full():
            self._wake.set()

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
            fd = await anyio.to_thread.run_sync(self._open)
            while await self._wait_for_batch():
                await self._commit(fd)
        except Exception as exc:  # StorageFailed, or an error raised by on_commit
            self._failure = exc
            raise
        finally:
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
        return fd

    async def _wait_for_batch(self) -> bool:
        """Wait until a batch is due: full, `max_delay` old, or closing. False: closed and drained."""
        while not self._lines:
            if self._closing:
                return False
            await self._wait_wake(None)
        deadline = self._first_at + self._max_delay
        while not self._closing and not self._batch_full():
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

    async def _commit(self, fd: int) -> None:
        entries, data = self._take_batch()
        # Shielded: once the bytes may be on disk, finish the fsync and report the commit, so a
        # cancellation cannot separate what is durable from what the engine counts.
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._write_and_sync, fd, data)
            self._offset += len(data)
            result = self._on_commit(entries, self._offset)
            if result is not None:
                await result

    def _take_batch(self) -> tuple[list[dict[str, Any]], bytes]:
        count = min(len(self._lines), self._max_rows)
        if self._pending_bytes > self._max_bytes:
            size = 0
            for index in range(count):
                size += len(self._lines[index])
                if size > self._max_bytes and index > 0:
                    count = index
                    break
        entries, data = self._entries[:count], b"".join(self._lines[:count])
        del self._entries[:count], self._lines[:count]
        self._pending_bytes -= len(data)
        if self._lines:
            self._first_at = anyio.current_time()
        self._space.set()
        self._space = anyio.Event()
        return entries, data

    def _write_and_sync(self, fd: int, data: bytes) -> None:
        self._storage.write(fd, data)
        self._storage.fsync(fd)

    def _batch_full(self) -> bool:
        return len(self._lines) >= self._max_rows or self._pending_bytes >= self._max_bytes

    def _backlogged(self) -> bool:
        return len(self._lines) >= 4 * self._max_rows or self._pending_bytes >= 4 * self._max_bytes

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


@dataclass(slots=True)
class JournalCounts:
    """Counts of the valid entries, enough for a resumed run's counters and summary."""

    lines: int = 0
    ok: int = 0
    attempts: int = 0
    by_outcome: dict[tuple[str, int | None], int] = field(default_factory=dict)  # (classification, status)

    @property
    def failed(self) -> int:
        return self.lines - self.ok

    @property
    def by_classification(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (classification, _), count in self.by_outcome.items():
            out[classification] = out.get(classification, 0) + count
        return out

    @property
    def by_status(self) -> dict[int | None, int]:
        out: dict[int | None, int] = {}
        for (_, status), count in self.by_outcome.items():
            out[status] = out.get(status, 0) + count
        return out


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
    counts: JournalCounts
    torn_tail: TornTail | None

    @property
    def ok(self) -> int:
        return self.counts.ok

    @property
    def failed(self) -> int:
        return self.counts.failed


@dataclass(slots=True)
class _Replay:
    """The state of a replay: everything learned from the good lines so far."""

    done: RowSet
    counts: JournalCounts = field(default_factory=JournalCounts)
    last_seq: int = 0
    offset: int = 0

    def run(self, lines: Iterator[bytes], stop_at: int) -> str | None:
        """Take good lines until `offset` reaches `stop_at` or the lines end. Returns the reason the
        next line is damage (it is not taken), or None. Hot path: state lives in locals."""
        done, counts, size = self.done, self.counts, self.done.size
        by_outcome = counts.by_outcome
        last_seq, offset, ok, attempts = self.last_seq, self.offset, counts.ok, counts.attempts
        if offset >= stop_at:
            return None
        reason = None
        for line in lines:
            try:
                entry = decode_line(line)
            except ValueError as bad:
                reason = str(bad)
                break
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
            attempts += entry["attempts"]
            key = (entry["classification"], entry["status_code"])
            by_outcome[key] = by_outcome.get(key, 0) + 1
            if offset >= stop_at:
                break
        self.last_seq, self.offset = last_seq, offset
        counts.lines, counts.ok, counts.attempts = last_seq, ok, attempts  # seq counts lines from 1
        return reason


def scan_journal(path: Path, *, committed_seq: int, committed_offset: int, row_count: int) -> JournalScan:
    """Validate every line of the journal, streaming, and rebuild the done rows and counts.

    Raises `JournalCorrupt` (context: offset, line, reason) for damage at or before the committed
    frontier or a journal shorter than it; damage after it is reported as `torn_tail`.
    """
    replay = _Replay(RowSet(row_count))
    size = path.stat().st_size if path.exists() else 0
    torn: TornTail | None = None
    if size:
        with open(path, "rb", opener=open_private) as stream:
            lines = _read_lines(stream)
            _replay_committed(path, size, lines, replay, (committed_seq, committed_offset))
            reason = replay.run(lines, stop_at=size + 1)
            if reason is not None:
                if not committed_seq:
                    _refuse_unless_at_end(path, lines, replay, reason)
                torn = TornTail(start=replay.offset, end=size, line=replay.last_seq + 1, reason=reason)
    elif committed_seq or committed_offset:
        raise _shorter_than_checkpoint(path, replay, size, committed_offset)
    return JournalScan(replay.done, replay.last_seq, replay.offset, replay.counts, torn)


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
        raise _corrupt(path, replay.offset, replay.last_seq + 1, reason)
    if replay.offset != committed_offset:
        raise _corrupt(
            path,
            committed_offset,
            replay.last_seq,
            f"the checkpoint offset {committed_offset} is not at the end of a line",
        )
    if replay.last_seq != committed_seq:
        raise _corrupt(
            path,
            committed_offset,
            replay.last_seq,
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
            decode_line(line)
        except ValueError:
            continue
        raise _corrupt(
            path,
            replay.offset,
            replay.last_seq + 1,
            f"{reason}, and good lines follow it: without a checkpoint only the end of the journal "
            "may be torn",
        )


def _corrupt(path: Path, offset: int, line: int, reason: str) -> JournalCorrupt:
    return JournalCorrupt(
        f"{path.name} is corrupt at line {line} (byte offset {offset}): {reason}",
        context={"file": str(path), "offset": offset, "line": line, "reason": reason},
        suggestion="committed results were damaged; the run cannot be resumed safely",
    )


def _shorter_than_checkpoint(path: Path, replay: _Replay, size: int, committed_offset: int) -> JournalCorrupt:
    """Every line up to the end of the file is good (the last may be cut): the file itself is short."""
    reason = f"the journal has {size} bytes but the checkpoint has committed {committed_offset}"
    return _corrupt(path, size, replay.last_seq + 1, reason)


def recover_torn_tail(path: Path, scan: JournalScan, storage: Storage) -> Path | None:
    """Move the torn tail aside (`results.jsonl.torn-<UTC stamp>`, fsynced) and truncate the journal
    to its last good line. Returns the aside file, or None when there was no torn tail."""
    if scan.torn_tail is None:
        return None
    aside = _aside_path(path)
    fd = storage.open_new(aside)
    try:
        with open(path, "rb", opener=open_private) as stream:
            stream.seek(scan.valid_end)
            for chunk in iter(partial(stream.read, _COPY_CHUNK), b""):
                storage.write(fd, chunk)
        storage.fsync(fd)
    finally:
        storage.close(fd)
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
