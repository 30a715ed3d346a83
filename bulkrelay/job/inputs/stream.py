"""Streaming readers for the input file (CSV, JSON Lines, optionally gzipped) and its fingerprint.

One pass does everything: the raw bytes are hashed as they are read (compressed bytes for .gz), records
are yielded one at a time, and bad records are reported through a callback and skipped, so memory stays
flat however large the file is. Row numbers count records from 1 and stay stable: a bad record still
consumes its row number.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import hashlib
import io
import itertools
import json
import os
import select
import shutil
import stat
import time
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import orjson

from bulkrelay.errors import InputChanged, InputInvalid, NotFound, Problem, StorageFailed, UsageError
from bulkrelay.job.records import Record
from bulkrelay.private import make_private_dir, open_private

if TYPE_CHECKING:
    from _csv import Reader as _CsvReader

InputFormat = Literal["csv", "jsonl"]
ProblemSink = Callable[[Problem], None]

STDIN_NAME = "<stdin>"  # what messages call records read from standard input (never the spool's path)

_DECLARED_FORMATS: dict[str, InputFormat] = {"csv": "csv", "jsonl": "jsonl", "ndjson": "jsonl"}
_EXTENSIONS: dict[str, InputFormat] = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
_CHUNK = 1 << 20
# How long a copy of stdin waits for input before the interpreter looks for a signal again.
_SIGNAL_CHECK_SECONDS = 0.2
_READ_BUFFER = 1 << 16
# A truncated or damaged .gz shows up as one of these while decompressing, wherever that happens.
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
_JSON_TYPE_NAMES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
# How many records a verified reader hands out between two checks that its file is unchanged (a
# check is one fstat; each region read is checked too, before its bytes can reach a record).
_CHECK_EVERY = 64
# orjson reads an integer beyond its 64-bit range as a float (a 30-digit id would go out as 1.2e+29):
# a line with a run of 19 digits is read again, its integers checked (the fewest digits out of range
# is 19, -9999999999999999999). The run is found by mapping every digit to "0", then a substring
# search, over a block of lines at once (a regular expression took five times as long).
_DIGITS_AS_ZEROS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_INTEGER_RANGE = (-(1 << 63), (1 << 64) - 1)
_COMPILED_WIDTH = 1000  # a CSV header wider than this makes its rows' dicts with dict(zip(...))
# The relay checks the raw input a region of this many bytes at a time against preflight's digest of
# it, before any byte of the region reaches a record: 32 bytes of digest a MiB, so memory stays flat.
REGION_SIZE = 1 << 20
_RESTORE = "restore the input as preflight read it, or start a new run"


def detect_format(path_name: str, declared: str | None) -> tuple[InputFormat, bool]:
    """The format and gzip flag of an input: a declared format wins, else the file extension decides."""
    suffixes = [s.lower() for s in Path(path_name).suffixes]
    gzipped = bool(suffixes) and suffixes[-1] == ".gz"
    if declared is not None:
        fmt = _DECLARED_FORMATS.get(declared.lower())
        if fmt is None:
            raise UsageError(
                f"unknown input format {declared!r} for {path_name}",
                context={"file": path_name, "format": declared},
                suggestion="use one of: csv, jsonl, ndjson",
            )
        return fmt, gzipped
    data_suffix = suffixes[-2] if gzipped and len(suffixes) >= 2 else (suffixes[-1] if suffixes else "")
    fmt = _EXTENSIONS.get(data_suffix) if not gzipped or len(suffixes) >= 2 else None
    if fmt is None:
        raise UsageError(
            f"cannot tell the format of {path_name} from its name",
            context={"file": path_name},
            suggestion="name it .csv, .jsonl or .ndjson (optionally .gz), or set input.format",
        )
    return fmt, gzipped


@dataclass(frozen=True)
class InputSpec:
    """Where an input is and how to read it. `name` is what problems call the file (STDIN_NAME)."""

    path: Path
    format: InputFormat
    gzip: bool
    delimiter: str = ","
    name: str | None = None

    def __post_init__(self) -> None:
        if len(self.delimiter) != 1 or self.delimiter in '\r\n"':
            raise UsageError(
                f"the CSV delimiter must be one character other than a quote or newline, "
                f"got {self.delimiter!r}",
                context={"delimiter": self.delimiter},
            )

    @classmethod
    def detect(cls, path: Path, declared: str | None = None, delimiter: str = ",") -> InputSpec:
        """A spec whose format and gzip flag come from `detect_format`."""
        fmt, gzipped = detect_format(str(path), declared)
        return cls(path=path, format=fmt, gzip=gzipped, delimiter=delimiter)

    @property
    def display_name(self) -> str:
        return self.name if self.name is not None else str(self.path)


@dataclass(frozen=True)
class InputFingerprint:
    """What identifies an input: format, gzip flag, sha256 and size of the raw bytes, record count."""

    format: str
    gzip: bool
    sha256: str
    size: int
    record_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "gzip": self.gzip,
            "sha256": self.sha256,
            "size": self.size,
            "record_count": self.record_count,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputFingerprint:
        """Rebuild from `to_dict()` output; raises ValueError naming the first missing or mistyped key."""
        expected: dict[str, type] = {
            "format": str,
            "gzip": bool,
            "sha256": str,
            "size": int,
            "record_count": int,
        }
        for key, kind in expected.items():
            value = data.get(key)
            # bool is an int subclass: refuse it where a count is expected.
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"input fingerprint: {key!r} must be {kind.__name__}, got {value!r}")
        return cls(
            format=data["format"],
            gzip=data["gzip"],
            sha256=data["sha256"],
            size=data["size"],
            record_count=data["record_count"],
        )


@dataclass(frozen=True)
class InputIdentity:
    """Which file a reader read, and in which state: device and inode, size, modification time."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, fd: int) -> InputIdentity:
        return cls._of_stat(os.fstat(fd))

    @classmethod
    def of_path(cls, path: Path) -> InputIdentity:
        return cls._of_stat(os.stat(path))

    @classmethod
    def _of_stat(cls, st: os.stat_result) -> InputIdentity:
        return cls(device=st.st_dev, inode=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns)

    def differences(self, now: InputIdentity) -> dict[str, dict[str, int]]:
        """`{field: {"recorded": ..., "now": ...}}` for each field that differs, as resume names them."""
        return changed_values(asdict(self), asdict(now))


@dataclass(frozen=True)
class RegionDigests:
    """The SHA-256 of each REGION_SIZE-byte region of an input's raw bytes (the compressed bytes of a
    .gz), in file order; the last region may be shorter. SHA-256 because it is the cheapest sound hash
    here: the CPU computes it (SHA-NI), about twice as fast as blake2b on 1 MiB blocks."""

    digests: bytes

    def of(self, index: int) -> bytes | None:
        """The digest of region `index` (None: the file preflight read had no such region)."""
        return _nth_digest(self.digests, index)


_REGION_DIGEST_SIZE = hashlib.sha256().digest_size


def _nth_digest(digests: bytes | bytearray, index: int) -> bytes | None:
    return bytes(digests[index * _REGION_DIGEST_SIZE : (index + 1) * _REGION_DIGEST_SIZE]) or None


class _RegionHasher:
    """Digests the raw bytes a region at a time as they pass, however the reads fall across regions."""

    def __init__(self) -> None:
        self._digests = bytearray()
        self._current = hashlib.sha256()
        self._filled = 0  # bytes of the current region hashed so far

    def update(self, data: memoryview) -> None:
        while data:
            taken = data[: REGION_SIZE - self._filled]
            self._current.update(taken)
            self._filled += len(taken)
            data = data[len(taken) :]
            if self._filled == REGION_SIZE:
                self.end_region()

    def end_region(self) -> None:
        """Close the current region, even short (the file's last); nothing to do between two regions."""
        if self._filled:
            self._digests += self._current.digest()
            self._current, self._filled = hashlib.sha256(), 0

    def of(self, index: int) -> bytes | None:
        """The digest of region `index` once it is closed (None: not yet, or never read)."""
        return _nth_digest(self._digests, index)

    def digests(self) -> RegionDigests:
        self.end_region()
        return RegionDigests(bytes(self._digests))


@dataclass(frozen=True)
class ExpectedInput:
    """What preflight read, which the relay must read again byte for byte."""

    fingerprint: InputFingerprint
    identity: InputIdentity
    regions: RegionDigests


def changed_values(was: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`{name: {"recorded": ..., "now": ...}}` for each of `was`'s values that `now` does not share."""
    return {name: {"recorded": value, "now": now[name]} for name, value in was.items() if value != now[name]}


def input_changed(file: str, when: str, changed: Mapping[str, Any]) -> InputChanged:
    what = ", ".join(f"{name} {v['recorded']!r} -> {v['now']!r}" for name, v in changed.items())
    return InputChanged(
        f"{file} changed {when}: {what}",
        context={"file": file, "changed": dict(changed)},
        suggestion=_RESTORE,
    )


def _region_changed(
    file: str, first: int, last: int, recorded: bytes | None, now: bytes | None
) -> InputChanged:
    """The raw bytes `first`..`last` (inclusive) are not the ones preflight read: nothing of them was
    handed on."""

    def shown(digest: bytes | None) -> str:
        return "none" if digest is None else digest.hex()

    return InputChanged(
        f"{file} changed during the run: bytes {first}-{last} are not the bytes preflight read",
        context={
            "file": file,
            "bytes": {"first": first, "last": last},
            "changed": {"sha256": {"recorded": shown(recorded), "now": shown(now)}},
        },
        suggestion=_RESTORE,
    )


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Spool:
    """A copy of standard input; `complete` is False when it was stopped before the input's end."""

    path: Path
    complete: bool


def spool_stdin_into(
    folder: Path, stream: BinaryIO, suffix: str = "", *, stop: Callable[[], bool] = _never
) -> Spool:
    """`spool_stdin` into a fresh private file in `folder` (made 0700 if missing); `suffix` keeps the
    extension. Once `stop()` is true the copy ends where it is, fsynced, and is not complete (a budget
    that runs out while stdin stays open). The caller removes the copy when its command ends, unless a
    run or job took it."""
    make_private_dir(folder)
    dest = folder / f"stdin-{os.getpid()}-{time.time_ns()}{suffix}"
    return Spool(dest, _spool(dest, stream, stop))


def spool_stdin(dest: Path, stream: BinaryIO) -> Path:
    """Copy standard input to a new 0600 file `dest` and fsync it, so the input can be read twice
    (preflight, then send). A failed copy is removed."""
    _spool(dest, stream, _never)
    return dest


def append_stdin(dest: Path, stream: BinaryIO, stop: Callable[[], bool]) -> bool:
    """Copy the rest of `stream` to the end of the spool `dest` and fsync it (a background job reading
    what its call had no time for). False when `stop()` came before the end."""
    try:
        with open(dest, "ab", opener=open_private) as out:
            return _copy_durably(stream, out, stop)
    except OSError as exc:
        raise _spool_failed(dest, exc) from exc


def _spool(dest: Path, stream: BinaryIO, stop: Callable[[], bool]) -> bool:
    try:
        out = open(dest, "xb", opener=open_private)  # noqa: SIM115 (closed below, removed on failure)
    except OSError as exc:
        raise _spool_failed(dest, exc) from exc
    except BaseException:  # a signal just after the file was made: the name is new, so the file is ours
        dest.unlink(missing_ok=True)
        raise
    try:
        with out:
            return _copy_durably(stream, out, stop)
    except BaseException as exc:
        dest.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _spool_failed(dest, exc) from exc
        raise


def _copy_durably(stream: BinaryIO, out: BinaryIO, stop: Callable[[], bool]) -> bool:
    """`_copy_to_end`, then `out` flushed and fsynced: the copy on disk holds all that was read."""
    complete = _copy_to_end(stream, out, stop)
    out.flush()
    os.fsync(out.fileno())
    return complete


def _copy_to_end(stream: BinaryIO, out: BinaryIO, stop: Callable[[], bool]) -> bool:
    """Copy `stream` to its end (True), or until `stop()` (False), noticing a signal (SIGINT, SIGTERM)
    however it lands.

    A blocking read of a pipe held open sleeps through a signal that came after the interpreter last
    looked for one and before the read began: the handler would run only once more input came. So a
    descriptor is waited on with select() and a timeout, and read only when it has something (one read:
    `read1`); between two waits the interpreter runs any handler due, and `stop` is asked."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError):  # in memory (io.BytesIO raises io.UnsupportedOperation): never waits
        shutil.copyfileobj(stream, out, _CHUNK)
        return True
    read_once: Callable[[int], bytes | None] = getattr(stream, "read1", stream.read)
    while not stop() and _wait_until_readable(fd, stop):
        chunk = read_once(_CHUNK)
        if chunk == b"":
            return True
        if chunk is not None:  # None: a non-blocking descriptor had nothing after all
            out.write(chunk)
            out.flush()  # the copy on disk holds what was read (a chunk is a whole pipe read: no cost)
    return False


def _wait_until_readable(fd: int, stop: Callable[[], bool] = _never) -> bool:
    """Until `fd` has input or its end (True) or `stop()` (False), back in the interpreter every
    _SIGNAL_CHECK_SECONDS so that a signal handler due runs even if the signal came just before the
    wait began."""
    while not select.select([fd], [], [], _SIGNAL_CHECK_SECONDS)[0]:
        if stop():
            return False
    return True


def _spool_failed(dest: Path, exc: OSError) -> StorageFailed:
    return StorageFailed(
        f"cannot keep a copy of {STDIN_NAME} to read it: {exc.strerror or exc}", context={"file": str(dest)}
    )


class _HashingReader(io.RawIOBase):
    """A raw reader that hashes and counts the bytes it passes on, whole and a region at a time: the
    fingerprint and the region digests need no second pass."""

    def __init__(self, raw: io.FileIO, *, whole: bool = True) -> None:
        super().__init__()
        self._raw = raw
        self._whole = hashlib.sha256() if whole else None  # None: the subclass knows the digest
        self.regions = _RegionHasher()
        self.size = 0
        # A FIFO (`--input <(...)`) may wait for its writer: a blocking read there sleeps through a
        # signal that came just before it (see _copy_to_end). A regular file never waits.
        self._may_wait = not stat.S_ISREG(os.fstat(raw.fileno()).st_mode)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._may_wait:
            _wait_until_readable(self._raw.fileno())
        count = self._raw.readinto(buffer)
        if count:
            read = memoryview(buffer)[:count]
            if self._whole is not None:
                self._whole.update(read)
            self.regions.update(read)
            self.size += count
        return count or 0

    def sha256(self) -> str:
        """The SHA-256 of the bytes read so far, in hex."""
        assert self._whole is not None
        return self._whole.hexdigest()

    def drain(self) -> None:
        """Read (and hash) whatever the decoder left unread, so the digest covers the whole file."""
        buffer = bytearray(_CHUNK)
        while self.readinto(buffer):
            pass

    def identity(self) -> InputIdentity:
        return InputIdentity.of(self._raw.fileno())

    def close(self) -> None:
        self._raw.close()
        super().close()


class _GuardedReader(_HashingReader):
    """A hashing reader over exactly the bytes preflight read: never past their size, only while the
    file is the one preflight read, unchanged (checked at every region), and a whole region at a time:
    no byte of a region is passed on before the region's digest is the one preflight recorded. So a
    byte that differs from what preflight read never reaches a record, even when the file's size and
    modification time do not show the change."""

    def __init__(self, raw: io.FileIO, expected: ExpectedInput, file: str) -> None:
        super().__init__(raw, whole=False)
        self._expected = expected
        self._file = file
        self._buffer = bytearray(REGION_SIZE)
        self._region = memoryview(self._buffer)[:0]  # the checked bytes of the current region
        self._handed = 0  # how many of them have been passed on
        self.check()

    def readinto(self, buffer: Any) -> int:
        if self._handed == len(self._region):
            self._load_region()
        count = min(len(buffer), len(self._region) - self._handed)
        memoryview(buffer)[:count] = self._region[self._handed : self._handed + count]
        self._handed += count
        return count

    def _load_region(self) -> None:
        """Read the next region whole (never past preflight's size) and check it before any of it is
        passed on: the file's identity, then the region's digest."""
        start, index = self.size, self.size // REGION_SIZE
        wanted = min(REGION_SIZE, self._expected.identity.size - start)
        region = memoryview(self._buffer)[: max(wanted, 0)]
        got = 0
        while got < wanted and (count := super().readinto(region[got:])):
            got += count
        self.check()
        if wanted > 0:
            self.regions.end_region()  # a short region (the last, or a truncated file) ends here
            recorded, now = self._expected.regions.of(index), self.regions.of(index)
            if recorded != now:
                raise _region_changed(self._file, start, start + wanted - 1, recorded, now)
        self._region, self._handed = region[:got], 0

    def sha256(self) -> str:
        """Every byte passed on was checked region by region against preflight's, so once as many
        bytes as preflight read have passed, their SHA-256 is the one preflight computed: it is not
        computed a second time (a whole-file hash here cost as much again as the region digests)."""
        if self.size != self._expected.fingerprint.size:
            return f"(not computed: {self.size} of {self._expected.fingerprint.size} bytes read)"
        return self._expected.fingerprint.sha256

    def check(self) -> None:
        now = self.identity()
        if now != self._expected.identity:
            raise input_changed(self._file, "during the run", self._expected.identity.differences(now))


def _open_raw(spec: InputSpec) -> io.FileIO:
    try:
        return io.FileIO(spec.path, "r")
    except FileNotFoundError as exc:
        raise NotFound(
            f"input file not found: {spec.display_name}", context={"file": spec.display_name}
        ) from exc
    except OSError as exc:
        problem = Problem(f"cannot open the input: {exc.strerror or exc}", file=spec.display_name)
        raise InputInvalid([problem]) from exc


def _without_bom(lines: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary stream, with a UTF-8 byte order mark removed from the first one."""
    first = lines.readline()
    if first.startswith(codecs.BOM_UTF8):
        first = first[len(codecs.BOM_UTF8) :]
    head: Iterable[bytes] = (first,) if first else ()
    return itertools.chain(head, lines)


def _line_blocks(stream: BinaryIO) -> Iterator[list[bytes]]:
    """The lines of a binary stream (a UTF-8 byte order mark removed from the first) in lists of whole
    lines of about _READ_BUFFER bytes, so that a check can look at many lines in one call."""
    block = list(itertools.islice(_without_bom(stream), 1))
    while block := block + stream.readlines(_READ_BUFFER):
        yield block
        block = []


def _csv_error(exc: csv.Error) -> str:
    """The csv module's complaint in the user's terms: its advice about Python's newline mode means
    a carriage return outside quotes, which a file with CR-only line ends has on every line."""
    if "new-line character seen in unquoted field" in str(exc):
        return (
            "a carriage return (\\r) outside quotes: lines that end in CR alone (an old Mac format) "
            "must end in LF or CRLF, and a CR inside a value needs the value quoted"
        )
    return str(exc)


class _OutOfRange(ValueError):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class RecordStream:
    """The records of one input, read once. After a full iteration `fingerprint()` describes the file."""

    def __init__(
        self, spec: InputSpec, raw: io.FileIO, on_problem: ProblemSink, expected: ExpectedInput | None = None
    ) -> None:
        self._spec = spec
        self._file = spec.display_name
        self._report = on_problem
        self._expected = expected
        self._opened = InputIdentity.of(raw.fileno())
        self._guard = None if expected is None else _GuardedReader(raw, expected, self._file)
        self._hashing = _HashingReader(raw) if self._guard is None else self._guard
        self._gzip: gzip.GzipFile | None = None
        source: BinaryIO = io.BufferedReader(self._hashing, _READ_BUFFER)
        if spec.gzip:
            self._gzip = gzip.GzipFile(fileobj=source, mode="rb")
            source = io.BufferedReader(self._gzip, _READ_BUFFER)
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
        rows = self._csv_records() if self._spec.format == "csv" else self._jsonl_records()
        if self._guard is not None and self._expected is not None:
            rows = self._verified(rows, self._guard.check, self._expected.fingerprint.record_count)
        count = 0
        try:
            count = yield from rows
        except _GZIP_ERRORS as exc:  # damage found while reading the header or first line
            self._report_damage(exc)
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

    def _report_damage(self, exc: Exception) -> None:
        self._report(Problem(f"cannot decompress the gzip data: {exc}", file=self._file))

    def _no_records(self) -> None:
        self._report(Problem("input has no records", file=self._file))

    def _jsonl_records(self) -> Generator[Record, None, int]:
        """One JSON object per line; every line is a row, so row number and line number agree."""
        loads, as_zeros, long_run = orjson.loads, _DIGITS_AS_ZEROS, _LONG_RUN
        new_record = tuple.__new__  # Record(...) would go through a Python-level __new__
        line = 0
        try:
            for block in _line_blocks(self._binary):
                # The long-run search once a block: per line it cost two thirds as much as orjson.loads.
                suspect = long_run in b"".join(block).translate(as_zeros)
                first = line + 1
                for line, raw in enumerate(block, first):
                    try:
                        value = loads(raw)
                    except orjson.JSONDecodeError as exc:
                        self._report(self._json_problem(raw, exc, line))
                        continue
                    if type(value) is not dict:
                        self._report(self._not_an_object(value, line))
                        continue
                    if suspect and (problem := self._integer_out_of_range(raw, line)):
                        self._report(problem)
                        continue
                    yield new_record(Record, (line, line, value))
        except _GZIP_ERRORS as exc:
            self._report_damage(exc)
            return line
        if line == 0:
            self._no_records()
        return line

    def _integer_out_of_range(self, raw: bytes, line: int) -> Problem | None:
        """The problem of a line holding an integer that orjson would have read as a float."""
        if _LONG_RUN not in raw.translate(_DIGITS_AS_ZEROS):
            return None
        low, high = _INTEGER_RANGE

        def checked(text: str) -> int:
            number = int(text)
            if not low <= number <= high:
                raise _OutOfRange(text)
            return number

        try:
            json.loads(raw, parse_int=checked)
        except _OutOfRange as exc:
            shown = exc.text if len(exc.text) <= 40 else f"{exc.text[:37]}..."
            message = f"the integer {shown} is outside the 64-bit range (send it as a string)"
            return Problem(message, file=self._file, line=line, row=line)
        except ValueError:  # stricter than orjson somewhere: orjson's reading stands
            return None
        return None

    def _not_an_object(self, value: object, line: int) -> Problem:
        kind = "null" if value is None else _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
        return Problem(f"expected a JSON object, got {kind}", file=self._file, line=line, row=line)

    def _json_problem(self, raw: bytes, exc: orjson.JSONDecodeError, line: int) -> Problem:
        if not raw.strip():
            return Problem("blank line", file=self._file, line=line, row=line)
        return Problem(f"invalid JSON: {exc.msg} at column {exc.colno}", file=self._file, line=line, row=line)

    def _csv_records(self) -> Generator[Record, None, int]:
        """CSV with a header row. `reader.line_num` counts physical lines, which gives each record's start."""
        reader = csv.reader(
            map(bytes.decode, _without_bom(self._binary)), delimiter=self._spec.delimiter, strict=True
        )
        headers = self._csv_header(reader)
        if headers is None:
            return 0
        width = len(headers)
        fields_of = _row_to_fields(headers)
        new_record = tuple.__new__  # Record(...) would go through a Python-level __new__
        row_number = 0
        skipped = 0  # lines that failed to decode: the csv reader never saw them, so line_num misses them
        end = reader.line_num
        while True:
            try:
                for row in reader:
                    start = end + 1
                    end = reader.line_num + skipped
                    if not row:  # a blank line, skipped like csv.DictReader does
                        continue
                    row_number += 1
                    if len(row) != width:
                        self._report(self._ragged(row, width, start, row_number))
                        continue
                    yield new_record(Record, (row_number, start, fields_of(row)))
                break
            except UnicodeDecodeError as exc:
                skipped += 1
                row_number += 1
                end = reader.line_num + skipped
                self._report(self._undecodable(exc, end, row_number))
            except csv.Error as exc:
                row_number += 1
                start, end = end + 1, reader.line_num + skipped
                self._report(
                    Problem(f"malformed CSV: {_csv_error(exc)}", file=self._file, line=start, row=row_number)
                )
            except _GZIP_ERRORS as exc:
                self._report_damage(exc)
                return row_number
        if row_number == 0:
            self._no_records()
        return row_number

    def _csv_header(self, reader: _CsvReader) -> list[str] | None:
        """The header row (the first non-blank line), or None after reporting why the file cannot be read."""
        try:
            headers = next((row for row in reader if row), None)
        except UnicodeDecodeError as exc:
            self._report(self._undecodable(exc, reader.line_num + 1, None))
            return None
        except csv.Error as exc:
            self._report(
                Problem(f"malformed CSV header: {_csv_error(exc)}", file=self._file, line=reader.line_num)
            )
            return None
        if headers is None:
            self._no_records()
            return None
        line = reader.line_num
        seen: set[str] = set()
        for column, name in enumerate(headers, 1):
            if not name.strip():
                self._report(Problem(f"header column {column} has no name", file=self._file, line=line))
                return None
            if name in seen:
                self._report(Problem("duplicate header", file=self._file, line=line, field=name))
                return None
            seen.add(name)
        return headers

    def _ragged(self, row: list[str], width: int, line: int, row_number: int) -> Problem:
        return Problem(
            f"expected {width} fields (as in the header), got {len(row)}",
            file=self._file,
            line=line,
            row=row_number,
        )

    def _undecodable(self, exc: UnicodeDecodeError, line: int, row: int | None) -> Problem:
        return Problem(
            f"invalid UTF-8: {exc.reason} at byte {exc.start + 1} of the line",
            file=self._file,
            line=line,
            row=row,
        )


def _row_to_fields(headers: list[str]) -> Callable[[list[str]], dict[str, str]]:
    """What makes a CSV row (as wide as the header) its fields: one dict display, `{_0: r[0], ...}`,
    about twice as fast as `dict(zip(headers, row))`. The header's names are bound in the function's
    namespace, never written into its code."""
    if len(headers) > _COMPILED_WIDTH:
        return lambda row: dict(zip(headers, row, strict=True))
    namespace: dict[str, Any] = {f"_{column}": name for column, name in enumerate(headers)}
    display = ", ".join(f"_{column}: r[{column}]" for column in range(len(headers)))
    exec(compile(f"def fields(r):\n    return {{{display}}}\n", "<bulkrelay csv row>", "exec"), namespace)
    fields: Callable[[list[str]], dict[str, str]] = namespace["fields"]
    return fields


@contextmanager
def open_records(
    spec: InputSpec, on_problem: ProblemSink, expected: ExpectedInput | None = None
) -> Iterator[RecordStream]:
    """Open an input for one streaming pass. Raises NotFound if the file is missing; closes it on exit.

    With `expected` (what preflight read), the stream reads exactly those bytes or raises
    `InputChanged`: at the open, at every region (before any of its bytes reaches a record), every few
    records, and at the end."""
    raw = _open_raw(spec)
    try:
        stream = RecordStream(spec, raw, on_problem, expected)
    except BaseException:
        raw.close()
        raise
    try:
        yield stream
    finally:
        stream.close()


class InputBytes:
    """The (decompressed) bytes of a preflighted input, read again in chunks by a caller that parses
    only some of its lines (job/positions.py). Checked as the relay's record stream is: the same file,
    unchanged, never past preflight's size, each region against preflight's digest before any of its
    bytes is handed on; `finish` drains the rest and compares the SHA-256 and size with preflight's."""

    def __init__(self, spec: InputSpec, raw: io.FileIO, expected: ExpectedInput) -> None:
        self._file = spec.display_name
        self._expected = expected.fingerprint
        self._guard = _GuardedReader(raw, expected, self._file)
        self._gzip = gzip.GzipFile(fileobj=self._guard, mode="rb") if spec.gzip else None

    def read(self, size: int) -> bytes:
        """Up to `size` bytes; b"" at the end."""
        try:
            return self._gzip.read(size) if self._gzip is not None else self._guard.read(size) or b""
        except _GZIP_ERRORS as exc:  # preflight decompressed these bytes whole: they changed
            changed = {"gzip": {"recorded": "readable", "now": str(exc)}}
            raise input_changed(self._file, "during the run", changed) from exc

    def check(self) -> None:
        """`InputChanged` if the file is not the one preflight read, unchanged (bytes already read and
        buffered would not show it)."""
        self._guard.check()

    def finish(self) -> None:
        """`InputChanged` unless every byte of the file was the bytes preflight read."""
        self._guard.drain()
        now = {"sha256": self._guard.sha256(), "size": self._guard.size}
        changed = changed_values({"sha256": self._expected.sha256, "size": self._expected.size}, now)
        if changed:
            raise input_changed(self._file, "during the run", changed)

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()
        self._guard.close()


@contextmanager
def open_input_bytes(spec: InputSpec, expected: ExpectedInput) -> Iterator[InputBytes]:
    """Open a preflighted input to read its bytes again (`InputBytes`); closes it on exit."""
    raw = _open_raw(spec)
    try:
        reader = InputBytes(spec, raw, expected)
    except BaseException:
        raw.close()
        raise
    try:
        yield reader
    finally:
        reader.close()
