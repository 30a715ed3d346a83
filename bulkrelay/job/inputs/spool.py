"""The stdin spool: standard input copied to a private, fsynced file, so it can be read twice (preflight,
then send) and outlive the call that read it (a background job).

A spool folder also holds a query's or a Parquet file's snapshot while it is taken, and the lookup maps a
run starting freezes (a directory). Each file there is
named for the process that makes it (`<kind>-<pid>-<ns>`), which holds a shared lock on the folder's
`.owner-<pid>` for as long as it lives: once nobody holds it, that process is gone (kill -9, out of
memory) and its files are abandoned (`abandoned_spools`), which the next snapshot, the end of a run
and `prune` remove."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import select
import shutil
import stat
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from bulkrelay.errors import StorageFailed
from bulkrelay.job.inputs.raw import never, wait_until_readable
from bulkrelay.job.inputs.spec import STDIN_NAME
from bulkrelay.private import make_private_dir, open_private

_CHUNK = 1 << 20
_SPOOL_NAME = re.compile(r"^[a-z]+-(\d+)-\d+")  # <kind>-<pid>-<ns>[suffix]
_OWNER = ".owner-{pid}"
_owned: dict[Path, int] = {}  # spool folder -> this process's owner lock there, held to its end


@dataclass(frozen=True)
class Spool:
    """A copy of standard input; `complete` is False when it was stopped before the input's end."""

    path: Path
    complete: bool


def spool_stdin_into(
    folder: Path, stream: BinaryIO, suffix: str = "", *, stop: Callable[[], bool] = never
) -> Spool:
    """`spool_stdin` into a fresh private file in `folder` (made 0700 if missing); `suffix` keeps the
    extension. Once `stop()` is true the copy ends where it is, fsynced, and is not complete (a budget
    that runs out while stdin stays open); but an input that has already reached its end (a file, a
    pipe whose writer has closed it) is copied whole even then, so that no worker is handed the
    caller's stdin for bytes that had all arrived (a budget spent by start-up alone). The caller removes
    the copy when its command ends, unless a run or job took it."""
    dest = spool_file(folder, "stdin", suffix)
    return Spool(dest, _spool(dest, stream, stop, finish_ended=True))


def spool_file(folder: Path, kind: str, suffix: str) -> Path:
    """A new name for this process's `kind` file in the spool `folder` (made 0700 if missing), the
    process's owner lock there taken first: no file of a live process is ever taken as abandoned."""
    make_private_dir(folder)
    _hold_owner(folder)
    return folder / f"{kind}-{os.getpid()}-{time.time_ns()}{suffix}"


def _hold_owner(folder: Path) -> None:
    """A shared lock on `.owner-<pid>`, kept open until the process ends (the OS then drops it). A
    sweeper that removed the file meanwhile leaves us a lock on nothing: take a fresh one then."""
    key = folder.resolve()
    if key in _owned:
        return
    path = folder / _OWNER.format(pid=os.getpid())
    while True:
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                if not _owned:
                    atexit.register(_let_go)
                _owned[key] = fd
                return
        except FileNotFoundError:
            pass
        os.close(fd)


def let_go_of_spool(folder: Path) -> None:
    """Once none of this process's files is left in `folder` (each removed, or taken by its run), its
    owner file there goes too: a command leaves nothing in the spool."""
    key = folder.resolve()
    if key not in _owned:
        return
    with contextlib.suppress(OSError):  # a folder gone has nothing of ours left
        if any(_pid_of(path) == os.getpid() for path in folder.iterdir()):
            return
    _release(key, _owned.pop(key))


def _let_go() -> None:
    """At a normal end, the owner files go with the process (a spool it left is then found by its pid)."""
    while _owned:
        _release(*_owned.popitem())


def _release(folder: Path, fd: int) -> None:
    owner = folder / _OWNER.format(pid=os.getpid())
    with contextlib.suppress(OSError):
        if os.stat(owner).st_ino == os.fstat(fd).st_ino:
            owner.unlink()
    os.close(fd)


def _pid_of(path: Path) -> int | None:
    named = _SPOOL_NAME.match(path.name)
    return None if named is None else int(named[1])


def abandoned_spools(folder: Path, *, remove: bool) -> list[tuple[Path, int]]:
    """The files of `folder` whose process has ended without removing them (a kill mid-snapshot), with
    their sizes; removed when `remove`. A file of a process that holds its owner lock stays. A name
    without an owner file (an earlier version's) is abandoned once no process has its pid."""
    by_pid: dict[int, list[Path]] = {}
    for entry in folder.iterdir() if folder.is_dir() else ():
        if (pid := _pid_of(entry)) is not None and (entry.is_file() or entry.is_dir()):
            by_pid.setdefault(pid, []).append(entry)
    found: list[tuple[Path, int]] = []
    for pid, files in sorted(by_pid.items()):
        found += _abandoned_of(folder / _OWNER.format(pid=pid), pid, files, remove)
    return found


def _abandoned_of(owner: Path, pid: int, files: list[Path], remove: bool) -> list[tuple[Path, int]]:
    try:
        fd = open_private(owner, os.O_RDWR)
    except FileNotFoundError:
        return [] if _pid_alive(pid) else _sized(files, remove)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []  # its process lives
        found = _sized(files, remove)
        if remove:
            owner.unlink(missing_ok=True)
        return found
    finally:
        os.close(fd)


def _sized(files: list[Path], remove: bool) -> list[tuple[Path, int]]:
    found = []
    for path in files:
        try:
            if path.is_dir():  # a directory of frozen lookup maps (ops/lookups.py)
                found.append((path, sum(f.stat().st_size for f in path.iterdir())))
                if remove:
                    shutil.rmtree(path)
                continue
            found.append((path, path.stat().st_size))
            if remove:
                path.unlink()
        except FileNotFoundError:
            continue
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def spool_stdin(dest: Path, stream: BinaryIO) -> Path:
    """Copy standard input to a new 0600 file `dest` and fsync it, so the input can be read twice
    (preflight, then send). A failed copy is removed."""
    _spool(dest, stream, never)
    return dest


def append_stdin(dest: Path, stream: BinaryIO, stop: Callable[[], bool]) -> bool:
    """Copy the rest of `stream` to the end of the spool `dest` and fsync it (a background job reading
    what its call had no time for). False when `stop()` came before the end."""
    try:
        with open(dest, "ab", opener=open_private) as out:
            return _copy_durably(stream, out, stop)
    except OSError as exc:
        raise _spool_failed(dest, exc) from exc


def _spool(dest: Path, stream: BinaryIO, stop: Callable[[], bool], *, finish_ended: bool = False) -> bool:
    try:
        out = open(dest, "xb", opener=open_private)  # noqa: SIM115 (closed below, removed on failure)
    except OSError as exc:
        raise _spool_failed(dest, exc) from exc
    except BaseException:  # a signal just after the file was made: the name is new, so the file is ours
        dest.unlink(missing_ok=True)
        raise
    try:
        with out:
            return _copy_durably(stream, out, stop, finish_ended=finish_ended)
    except BaseException as exc:
        dest.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _spool_failed(dest, exc) from exc
        raise


def _copy_durably(
    stream: BinaryIO, out: BinaryIO, stop: Callable[[], bool], *, finish_ended: bool = False
) -> bool:
    """`_copy_to_end`, then `out` flushed and fsynced: the copy on disk holds all that was read.
    `finish_ended`: stopped, still copy the rest of an input that has already ended (`_rest_if_ended`)."""
    complete = _copy_to_end(stream, out, stop)
    if not complete and finish_ended:
        complete = _rest_if_ended(stream, out)
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
    while not stop() and wait_until_readable(fd, stop):
        chunk = read_once(_CHUNK)
        if chunk == b"":
            return True
        if chunk is not None:  # None: a non-blocking descriptor had nothing after all
            out.write(chunk)
            out.flush()  # the copy on disk holds what was read (a chunk is a whole pipe read: no cost)
    return False


def _rest_if_ended(stream: BinaryIO, out: BinaryIO) -> bool:
    """The rest of `stream` when its end has already come, without waiting (True); False, having copied
    only what was there, when its writer still holds it open. A regular file has ended by nature; a pipe
    or socket has when, past the bytes it holds now, a read finds the end at once."""
    fd = stream.fileno()
    read_once: Callable[[int], bytes | None] = getattr(stream, "read1", stream.read)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        while chunk := read_once(_CHUNK):
            out.write(chunk)
        return True
    queued = _bytes_queued(fd)
    while queued > 0:
        chunk = read_once(min(queued, _CHUNK))
        if not chunk:
            return chunk == b""
        out.write(chunk)
        queued -= len(chunk)
    if not select.select([fd], [], [], 0)[0] or _bytes_queued(fd):
        return False  # nothing yet, or more came: the writer is still at it
    last = read_once(1)
    if last:
        out.write(last)  # arrived after the look: not the end after all
    return last == b""


def _bytes_queued(fd: int) -> int:
    """The bytes waiting in a pipe, socket or terminal (FIONREAD); 0 where the question has no answer."""
    try:
        answer = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int.from_bytes(answer, sys.byteorder, signed=True)


def _spool_failed(dest: Path, exc: OSError) -> StorageFailed:
    return StorageFailed(
        f"cannot keep a copy of {STDIN_NAME} to read it: {exc.strerror or exc}", context={"file": str(dest)}
    )
