"""The raw bytes of an input file: hashed whole and a region at a time as they pass (the fingerprint needs
no second pass), read again by the relay only as the bytes preflight read (`GuardedReader`), and handed
to a caller that parses some lines itself (`InputBytes`)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import select
import stat
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bulkrelay.errors import InputChanged, InputInvalid, NotFound, Problem
from bulkrelay.job.inputs.spec import (
    REGION_SIZE,
    RESTORE,
    ExpectedInput,
    InputIdentity,
    InputSpec,
    RegionDigests,
    changed_values,
    input_changed,
    nth_digest,
)

_CHUNK = 1 << 20
# How long a wait for input lasts before the interpreter looks for a signal again.
_SIGNAL_CHECK_SECONDS = 0.2
# A truncated or damaged .gz shows up as one of these while decompressing, wherever that happens.
GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def damaged(file: str, exc: Exception) -> Problem:
    """The problem of gzip data that cannot be decompressed (reading stops there)."""
    return Problem(f"cannot decompress the gzip data: {exc}", file=file)


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
        return nth_digest(self._digests, index)

    def digests(self) -> RegionDigests:
        self.end_region()
        return RegionDigests(bytes(self._digests))


def region_changed(
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
        suggestion=RESTORE,
    )


def never() -> bool:
    return False


def wait_until_readable(fd: int, stop: Callable[[], bool] = never) -> bool:
    """Until `fd` has input or its end (True) or `stop()` (False), back in the interpreter every
    _SIGNAL_CHECK_SECONDS so that a signal handler due runs even if the signal came just before the
    wait began."""
    while not select.select([fd], [], [], _SIGNAL_CHECK_SECONDS)[0]:
        if stop():
            return False
    return True


class HashingReader(io.RawIOBase):
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
            wait_until_readable(self._raw.fileno())
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


class GuardedReader(HashingReader):
    """A hashing reader over exactly the bytes preflight read: never past their size, only while the
    file is the one preflight read, unchanged (checked at every region), and a whole region at a time:
    no byte of a region is passed on before the region's digest is the one preflight recorded. So a
    byte that differs from what preflight read never reaches a record, even when the file's size and
    modification time do not show the change."""

    def __init__(self, raw: io.FileIO, expected: ExpectedInput, file: str) -> None:
        super().__init__(raw, whole=False)
        self._expected = expected
        known = expected.identity
        self._known_stat = (known.device, known.inode, known.size, known.mtime_ns)
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
                raise region_changed(self._file, start, start + wanted - 1, recorded, now)
        self._region, self._handed = region[:got], 0

    def sha256(self) -> str:
        """Every byte passed on was checked region by region against preflight's, so once as many
        bytes as preflight read have passed, their SHA-256 is the one preflight computed: it is not
        computed a second time (a whole-file hash here cost as much again as the region digests)."""
        if self.size != self._expected.fingerprint.size:
            return f"(not computed: {self.size} of {self._expected.fingerprint.size} bytes read)"
        return self._expected.fingerprint.sha256

    def check(self) -> None:
        st = os.fstat(self._raw.fileno())  # compared as a tuple: no InputIdentity made unless it differs
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self._known_stat:
            now = self.identity()
            raise input_changed(self._file, "during the run", self._expected.identity.differences(now))


def open_raw(spec: InputSpec) -> io.FileIO:
    try:
        return io.FileIO(spec.path, "r")
    except FileNotFoundError as exc:
        raise NotFound(
            f"input file not found: {spec.display_name}", context={"file": spec.display_name}
        ) from exc
    except OSError as exc:
        problem = Problem(f"cannot open the input: {exc.strerror or exc}", file=spec.display_name)
        raise InputInvalid([problem]) from exc


class InputBytes:
    """The (decompressed) bytes of a preflighted input, read again in chunks by a caller that parses
    only some of its lines (job/positions.py). Checked as the relay's record stream is: the same file,
    unchanged, never past preflight's size, each region against preflight's digest before any of its
    bytes is handed on; `finish` drains the rest and compares the SHA-256 and size with preflight's."""

    def __init__(self, spec: InputSpec, raw: io.FileIO, expected: ExpectedInput) -> None:
        self._file = spec.display_name
        self._expected = expected.fingerprint
        self._guard = GuardedReader(raw, expected, self._file)
        self._gzip = gzip.GzipFile(fileobj=self._guard, mode="rb") if spec.gzip else None

    def read(self, size: int) -> bytes:
        """Up to `size` bytes; b"" at the end."""
        try:
            return self._gzip.read(size) if self._gzip is not None else self._guard.read(size) or b""
        except GZIP_ERRORS as exc:  # preflight decompressed these bytes whole: they changed
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
    raw = open_raw(spec)
    try:
        reader = InputBytes(spec, raw, expected)
    except BaseException:
        raw.close()
        raise
    try:
        yield reader
    finally:
        reader.close()
