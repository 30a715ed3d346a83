"""The line scan of a delta run: a second process that tells preflight which input lines are, byte for
byte, lines whose request the sync state holds as delivered, so preflight need not digest and look up
their rows (docs/delta.md, "How a delta run chooses its rows").

A row's request is a function of its record's bytes and of what is the same for every row: the job,
the CSV header, the format, the BulkRelay version. The scan hashes each physical line with a salt of
all of those (`line_salt`, and the header line, which the scan reads itself) and looks the digest up
under the line's key in the state's `delivered.line` column, which holds a line's digest only where
the request delivered for the key is the one that line was found to render (`SyncState.keep_lines`,
`apply_run`). A line is *known* only on that positive evidence: its digest found under its key.
Lines the scan cannot tell apart from parts of a multi-line record (a CSV line with a quote
character) are never known, nor lines it cannot read a key from, nor lines longer than the readers'
limit (`MAX_LINE_BYTES`), which it reads past without holding them.

The scan reads the file on its own, on the other core: preflight's main thread is what a delta run's
time is made of, and hashing and looking up a million lines there cost it half a `validate` again.
The verdicts are only as good as the bytes the scan read, so the scan also computes the SHA-256 and
size of every byte, and `LineScan.finish` gives them to be compared with preflight's own: any
difference and preflight's choice is thrown away (the input changed while it was read).

Run as `python -m bulkrelay.sync.linescan` with its parameters as one JSON argument; it writes frames
to stdout: `V` + first line, count, then a mark byte a line (1: known) and 16 digest bytes a line
(zeros where the line has none); then one `E` + size, lines, SHA-256. Imports only the standard
library and orjson, so the process starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO

import orjson

from bulkrelay.private import no_core_dumps

if TYPE_CHECKING:  # not imported when run: the scan starts on the standard library and orjson
    from bulkrelay.job.inputs import InputSpec

LINE_DIGEST_SIZE = 16
NO_DIGEST = bytes(LINE_DIGEST_SIZE)  # a line with no digest: never known, never learned
FRAME_LINES = 4096
_BLOCK = 1 << 20
_PIPE_BYTES = 1 << 20
_COMMAND = (sys.executable, "-m", "bulkrelay.sync.linescan")  # and the parameters, as one JSON argument
_VERDICTS = struct.Struct("<cqI")  # b"V", first line, count
_END = struct.Struct("<cqq32s")  # b"E", size, lines, SHA-256 of the raw bytes
_BOM = b"\xef\xbb\xbf"
_QUOTE = b'"'
# What stands for a line longer than the limit: no line holds a newline, and the quote makes it no CSV
# line the scan reads a key from (nor a header it reads names from), as the brace-less text is no JSON.
_TOO_LONG = b'\n"(a line longer than the limit)'


def line_digest(salt: bytes, body: bytes) -> bytes:  # the one `_Rows.read` inlines
    """The digest of one line (its bytes without the newline) under `salt`."""
    return hashlib.blake2b(salt + body).digest()[:LINE_DIGEST_SIZE]


def header_salt(base: bytes, header: bytes) -> bytes:
    """A CSV's salt: the job's, and its header line (the names the fields are read under)."""
    return hashlib.blake2b(base + b"\0header\0" + header).digest()[:LINE_DIGEST_SIZE]


# ---------------------------------------------------------------------------------------------------
# The scanning process


class _Hashing(io.RawIOBase):
    """A raw file that hashes and counts every byte read through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        if count:
            self.sha256.update(memoryview(buffer)[:count])
            self.size += count
        return count or 0


def _blocks(stream: IO[bytes], limit: int, size: int = _BLOCK) -> Iterator[list[bytes]]:
    """The physical lines, without their newlines, `size` bytes at a time (split in C: a Python
    step per line cost the scan a third of its time); the byte order mark taken off the first.

    A line longer than `limit` with its newline (the readers' `MAX_LINE_BYTES`, counted as they count
    it) is read past and `_TOO_LONG` stands in its place: it is never held, so a gzip bomb of one line
    costs the scan no more than the limit. Its line stays unknown, and preflight refuses it by name."""
    tail: list[bytes] = []  # the start of a line not ended yet (kept in parts: a line may be long)
    held = 0  # its length; -1 once it is longer than the limit, and the rest is read past
    first = True
    while block := stream.read(size):
        end = block.find(b"\n")
        if end < 0:
            held = _hold(tail, held, block, limit)
            continue
        if held >= 0 and held + end + 1 <= limit:
            tail.append(block[:end])
            head = b"".join(tail)
        else:
            head = _TOO_LONG
        lines = block[end + 1 :].split(b"\n")
        tail.clear()
        held = _hold(tail, 0, lines.pop(), limit)
        lines.insert(0, head)
        if len(block) > limit:  # only a limit below the read size lets a line inside one read be too long
            lines = [_TOO_LONG if len(line) >= limit else line for line in lines]
        if first:
            first = False
            lines[0] = lines[0].removeprefix(_BOM)
        yield lines
    if held < 0:
        yield [_TOO_LONG]
    elif last := b"".join(tail):  # a last line without a newline is a line
        yield [last.removeprefix(_BOM) if first else last]


def _hold(tail: list[bytes], held: int, part: bytes, limit: int) -> int:
    """Add `part` to the unfinished line in `tail` (`held` bytes, -1 when too long); its new length."""
    if held < 0:
        return held
    held += len(part)
    if held > limit:
        tail.clear()
        return -1
    tail.append(part)
    return held


class _Lookup:
    """Which lines of a frame the state knows: one SQLite step a frame, by key (the primary key: keys
    come in about the file's order, so the B-tree pages stay in the cache; an index of the line
    digests themselves cost twice as much, every look-up a page read)."""

    _KNOWN = (
        "SELECT group_concat(frame.key) FROM json_each(?) AS frame WHERE EXISTS (SELECT 1 FROM delivered "
        "WHERE delivered.key = frame.value AND delivered.line = substr(?, frame.key * 16 + 1, 16))"
    )

    def __init__(self, state: str) -> None:
        self._db = sqlite3.connect(f"{Path(state).as_uri()}?mode=ro", uri=True)

    def known(self, keys: list[str | None], digests: bytes) -> list[int]:
        (found,) = self._db.execute(self._KNOWN, (orjson.dumps(keys), digests)).fetchone()
        return [] if found is None else [int(at) for at in found.split(",")]


class _Rows:
    """What the scan needs of a line: its digest, and the key of the record it holds (None, and no
    digest, when the line alone does not make a record the scan can read: a CSV line holding a
    quote character may be part of a record of several lines). A wrong key only makes a line
    unknown: the state holds a line's digest under the key of the record it was read from."""

    def __init__(self, salt: bytes, key_of: Callable[[bytes], str | None]) -> None:
        self._salt = salt
        self._key_of = key_of

    def read(self, lines: list[bytes]) -> tuple[list[str | None], list[bytes]]:
        salt, key_of, blake2b, size = self._salt, self._key_of, hashlib.blake2b, LINE_DIGEST_SIZE
        keys = [key_of(line) for line in lines]
        digests = [
            NO_DIGEST if key is None else blake2b(salt + line).digest()[:size]
            for key, line in zip(keys, lines, strict=True)
        ]
        return keys, digests


def _csv_key_of(header: bytes, delimiter: bytes, key_field: str) -> Callable[[bytes], str | None] | None:
    """How to read the key from a CSV line without quotes (its fields are the text between
    delimiters); None when the header itself is not such a line or lacks the key."""
    if _QUOTE in header:
        return None
    try:
        names = header.removesuffix(b"\r").decode().split(delimiter.decode())
    except UnicodeDecodeError:
        return None
    if key_field not in names:
        return None
    column, width = len(names) - 1 - names[::-1].index(key_field), len(names)  # the last: as a dict keeps

    def key_of(line: bytes) -> str | None:
        if _QUOTE in line:
            return None
        fields = line.removesuffix(b"\r").split(delimiter)
        if len(fields) != width:
            return None
        try:
            key = fields[column].decode()
        except UnicodeDecodeError:
            return None
        return None if "\0" in key else key

    return key_of


def _jsonl_key_of(key_field: str) -> Callable[[bytes], str | None]:
    loads, dumps = orjson.loads, orjson.dumps

    def key_of(line: bytes) -> str | None:
        try:
            value = loads(line)
        except orjson.JSONDecodeError:
            return None
        key = value.get(key_field) if type(value) is dict else None
        if key is None:
            return None
        text = key if type(key) is str else dumps(key).decode()  # as `key_text` spells it
        return None if "\0" in text else text

    return key_of


def _scan(params: dict[str, Any], out: BinaryIO) -> None:
    base = bytes.fromhex(params["salt"])
    is_csv = params["format"] == "csv"
    frame = _Frame(out, _Lookup(params["state"]))
    with open(params["path"], "rb") as raw:
        hashing = _Hashing(raw)
        buffered = io.BufferedReader(hashing, _BLOCK)
        stream: IO[bytes] = gzip.GzipFile(fileobj=buffered) if params["gzip"] else buffered  # type: ignore[assignment]
        rows = None if is_csv else _Rows(base, _jsonl_key_of(params["key"]))
        header_pending = is_csv
        for block in _blocks(stream, params["limit"]):
            lines = block
            if header_pending:  # a CSV's header: its first line that is not blank
                at = next((n for n, line in enumerate(block) if line not in (b"", b"\r")), None)
                before = len(block) if at is None else at + 1  # the blank lines, and the header
                frame.add([None] * before, [NO_DIGEST] * before)
                if at is None:
                    continue  # blank lines only, so far
                header_pending, header, lines = False, block[at], block[before:]
                key_of = _csv_key_of(header, params["delimiter"].encode(), params["key"])
                rows = None if key_of is None else _Rows(header_salt(base, header), key_of)
            if rows is None:
                frame.add([None] * len(lines), [NO_DIGEST] * len(lines))
            else:
                frame.add(*rows.read(lines))
        frame.flush()
        stream.read()  # a gzip member's trailer: every raw byte is hashed, as preflight's are
        out.write(_END.pack(b"E", hashing.size, frame.lines, hashing.sha256.digest()))


class _Frame:
    """Lines gathered into frames of `FRAME_LINES`, each written with its marks."""

    def __init__(self, out: BinaryIO, lookup: _Lookup) -> None:
        self._out = out
        self._lookup = lookup
        self._keys: list[str | None] = []
        self._digests: list[bytes] = []
        self.lines = 0  # lines written

    def add(self, keys: list[str | None], digests: list[bytes]) -> None:
        self._keys.extend(keys)
        self._digests.extend(digests)
        while len(self._digests) >= FRAME_LINES:
            self._write(self._keys[:FRAME_LINES], self._digests[:FRAME_LINES])
            del self._keys[:FRAME_LINES], self._digests[:FRAME_LINES]

    def flush(self) -> None:
        if self._digests:
            self._write(self._keys, self._digests)
            self._keys, self._digests = [], []

    def _write(self, keys: list[str | None], digests: list[bytes]) -> None:
        count = len(digests)
        joined = b"".join(digests)
        marks = bytearray(count)
        for at in self._lookup.known(keys, joined):
            if digests[at] != NO_DIGEST:
                marks[at] = 1
        self._out.write(_VERDICTS.pack(b"V", self.lines + 1, count))
        self._out.write(marks)
        self._out.write(joined)
        self._out.flush()  # whole frames: preflight must not wait for the next one to get this one
        self.lines += count


def main() -> int:
    no_core_dumps()  # it reads the input's rows
    params = json.loads(sys.argv[1])
    with os.fdopen(sys.stdout.fileno(), "wb", buffering=1 << 16, closefd=False) as out:
        _scan(params, out)
    return 0


# ---------------------------------------------------------------------------------------------------
# Preflight's side


def _widen(pipe: int) -> None:
    """Let the scan run up to a megabyte (about 15 frames) ahead of preflight, where the system
    allows (Linux); a pipe's 64 KiB default holds less than one frame."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or over its limit: waits more often
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


class LineScanFailed(Exception):
    """The scan ended without its verdicts for every line, or said something that is not a frame."""


class LineScan:
    """The scan of one input, running; preflight reads its verdicts line by line, in order.

    `start`..`end` is the window of lines read so far; `marks[line - start]` is 1 for a known line
    and `digests` holds the lines' digests. Once the scan has failed, windows of unknown lines are
    made up, so preflight carries on the slow way; `finish` then raises."""

    def __init__(self, spec: InputSpec, key_field: str, *, salt: bytes, state: Path) -> None:
        from bulkrelay.job.inputs.lines import MAX_LINE_BYTES  # here: the scan itself never imports it

        params = {
            "path": str(spec.path),
            "format": spec.format,
            "gzip": spec.gzip,
            "delimiter": spec.delimiter,
            "key": key_field,
            "salt": salt.hex(),
            "state": str(state),
            "limit": MAX_LINE_BYTES,  # the readers' line limit: a longer line is never held
        }
        self._proc = subprocess.Popen(
            [*_COMMAND, json.dumps(params)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        self._out = self._proc.stdout
        _widen(self._out.fileno())
        self.start = self.end = 1
        self.marks = b""
        self.digests = b""
        self.marked = 0  # known lines in the frames read: rows preflight may have taken as unchanged
        self._failure: str | None = None
        self._ended: tuple[int, int, bytes] | None = None

    def advance(self, line: int) -> None:
        """Read verdicts until the window holds `line` (lines before it are dropped)."""
        while line >= self.end:
            if self._failure is None and self._ended is None:
                self._read_frame()
            else:
                self._unknown_from(line)

    def _unknown_from(self, line: int) -> None:
        self.start, self.end = line, line + FRAME_LINES
        self.marks, self.digests = bytes(FRAME_LINES), bytes(FRAME_LINES * LINE_DIGEST_SIZE)

    def _read_frame(self) -> None:
        kind = self._out.read(1)
        if kind == b"V":
            rest = self._exactly(_VERDICTS.size - 1)
            if rest is None:
                return
            _, first, count = _VERDICTS.unpack(kind + rest)
            marks, digests = self._exactly(count), self._exactly(count * LINE_DIGEST_SIZE)
            if marks is None or digests is None or first != self.end:
                self._fail(f"a frame for lines {first}.. out of order or cut short")
                return
            self.start, self.end, self.marks, self.digests = first, first + count, marks, digests
            self.marked += marks.count(1)
        elif kind == b"E":
            rest = self._exactly(_END.size - 1)
            if rest is not None:
                _, size, lines, sha256 = _END.unpack(kind + rest)
                self._ended = (size, lines, sha256)
        else:
            self._fail("it ended before its verdicts" if not kind else f"an unknown frame {kind!r}")

    def _exactly(self, count: int) -> bytes | None:
        data = self._out.read(count)
        if len(data) != count:
            self._fail("a frame cut short")
            return None
        return data

    def _fail(self, why: str) -> None:
        if self._failure is None:
            self._failure = why

    def finish(self) -> tuple[int, int, str]:
        """(size, lines, SHA-256 hex) of every byte the scan read, once it has ended;
        `LineScanFailed` when it did not end well."""
        while self._failure is None and self._ended is None:
            self._read_frame()
        _, stderr = self._proc.communicate()
        status = self._proc.returncode
        if self._failure is None and status != 0:
            self._failure = f"exit status {status}"
        if self._failure is not None or self._ended is None:
            detail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise LineScanFailed(f"the line scan failed: {self._failure}; {detail[0]}".rstrip("; "))
        size, lines, sha256 = self._ended
        return size, lines, sha256.hex()

    def close(self) -> None:
        """Stop the scan if it still runs (preflight ended early)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate()


if __name__ == "__main__":
    sys.exit(main())
