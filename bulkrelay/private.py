"""Private files: everything BulkRelay keeps holds customers' data, so it is never world-readable.

Every file is opened (`open_private`) without following a symbolic link and created 0600, and every
directory BulkRelay makes (`make_private_dir`) is created 0700. Both pass the mode to the kernel, which
applies the umask, so a stricter umask still wins; nothing is chmod-ed afterwards, and a directory the
user made keeps its mode. Shared by the run directory (store), the stdin spool (job) and background
jobs, so it sits beside `errors`, below them all.

A process is kept private too (`no_core_dumps`): one that crashed would otherwise leave a core file
holding the client secret, the live token and rows in flight. And a helper process of a run (a worker,
the sink's feeder) dies with the run's (`die_with_parent`): none goes on alone with the run's secrets.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
import stat
import sys
from pathlib import Path

from bulkrelay.errors import RunDirUnsafe

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def open_private(path: str | Path, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
    """`os.open` that refuses a symbolic link at `path` (RunDirUnsafe) and creates files 0600 (or
    `mode`, for the one file meant for another user to read: the metrics file; the umask still applies).

    Also an `opener` for the built-in `open()`. Any other OSError is the caller's to report."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise link_refused(Path(path)) from None
        raise


def make_private_dir(path: Path) -> None:
    """`mkdir -p` whose every new directory is 0700; directories that exist already are left as they are."""
    if not path.parent.is_dir():
        make_private_dir(path.parent)
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise


def refuse_links(directory: Path) -> None:
    """Raise RunDirUnsafe, naming the file, when any entry of `directory` is a symbolic link.

    Checked before a run directory is used at all, so nothing is read or written through a link;
    `open_private` still refuses a link made afterwards."""
    try:
        with os.scandir(directory) as entries:
            links = sorted(entry.name for entry in entries if entry.is_symlink())
    except (FileNotFoundError, NotADirectoryError):
        return  # the caller reports a missing run directory in its own words
    if links:
        raise link_refused(directory / links[0])


def link_refused(path: Path) -> RunDirUnsafe:
    return RunDirUnsafe(
        f"{path.name} in {path.parent} is a symbolic link; BulkRelay never reads or writes run files "
        "through a link",
        context={"file": str(path), "directory": str(path.parent)},
        suggestion=f"replace the link {path} with the file itself, or start a new run",
    )


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_DUMPABLE = 4
_PR_SET_NAME = 15


def _prctl(option: int, value: int | bytes) -> None:
    """Linux's prctl(option, value); elsewhere, or where refused, nothing."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def no_core_dumps() -> None:
    """This process (and what it starts) writes no core file, and on Linux is not dumpable: no core
    whatever the system's core pattern (a pipe to systemd-coredump ignores the limit), and no other
    process of the same user can attach to it or read its memory or environment (/proc/PID/environ).
    Called once at the start of every BulkRelay process (the CLI, whose program also runs background
    workers and shards, and the line scan). Elsewhere, or where refused, it changes what it can."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _prctl(_PR_SET_DUMPABLE, 0)


def die_with_parent(parent: int) -> bool:
    """Have this process killed (SIGKILL) when its parent ends (Linux; elsewhere the caller ends at the
    end of its pipe to the parent). False when the parent `parent` has ended already."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent


def name_this_process(name: bytes) -> None:
    """This process's name in ps and top (/proc/PID/comm, at most 15 bytes; Linux only)."""
    _prctl(_PR_SET_NAME, name)


class UnreadableFile(Exception):
    """A file that `read_small_file` refused; `reason` says why, for the caller's own error (which names
    the job file's key, or the flag); `missing` when there is no such file."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.missing = missing


def read_small_file(path: Path, limit: int) -> bytes:
    """The bytes of a small file: a key, a certificate, an earlier metrics file. Only a regular file
    (symbolic links followed) of at most `limit` bytes is read: a device (/dev/zero, /dev/urandom) would
    be read without end, and opening a named pipe would wait forever for a writer."""
    try:
        # O_NONBLOCK: opening a pipe returns at once (it is then refused); a regular file reads as ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError)
        raise UnreadableFile(exc.strerror or type(exc).__name__, missing=missing) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnreadableFile("it is not a regular file (a device, a pipe or a directory)")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(limit + 1)
        except OSError as exc:
            raise UnreadableFile(exc.strerror or type(exc).__name__) from None
    if len(data) > limit:
        raise UnreadableFile(f"it is larger than {limit >> 20} MiB")
    return data
