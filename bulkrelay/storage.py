"""The storage seam: every write, fsync and rename of run state goes through a `Storage`.

Failure tests subclass `Storage` and make the Nth write or fsync fail, so the code above it can be
proven to stop cleanly. Any `OSError` becomes `StorageFailed`, naming the file and the OS error;
nothing here retries, because after a failed write or fsync the kernel may already have dropped
the data (a retried fsync can report success for pages that were never written).

Run data carries customers' data, so it is private: every file BulkRelay keeps is opened here
(`open_private`) without following a symbolic link and created 0600, and every directory it makes
(`make_private_dir`) is created 0700. Both pass the mode to the kernel, which applies the umask, so a
stricter umask still wins; nothing is chmod-ed afterwards, and a directory the user made keeps its mode.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from bulkrelay.errors import RunDirUnsafe, StorageFailed

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def open_private(path: str | Path, flags: int) -> int:
    """`os.open` that refuses a symbolic link at `path` (RunDirUnsafe) and creates files 0600.

    Also an `opener` for the built-in `open()`. Any other OSError is the caller's to report."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
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


class Storage:
    """Thin wrappers over `os` calls on file descriptors, remembering which file each fd is for."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def open_append(self, path: Path) -> int:
        """Open (creating if needed) for appending; every write lands at the end of the file."""
        return self._open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def open_new(self, path: Path) -> int:
        """Create a file that must not exist yet (temp files, torn-tail copies)."""
        return self._open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)

    def write(self, fd: int, data: bytes) -> None:
        """Write all of `data`, looping over short writes."""
        view = memoryview(data)
        try:
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except OSError as exc:
            raise self._failed("write", self.name_of(fd), exc) from exc

    def fsync(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            raise self._failed("fsync", self.name_of(fd), exc) from exc

    def truncate(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            raise self._failed("truncate", self.name_of(fd), exc) from exc

    def close(self, fd: int) -> None:
        name = self._names.pop(fd, f"fd {fd}")
        try:
            os.close(fd)
        except OSError as exc:
            raise self._failed("close", name, exc) from exc

    def replace(self, source: Path, target: Path) -> None:
        """Rename `source` over `target` (atomic on POSIX); the caller fsyncs the directory."""
        try:
            os.replace(source, target)
        except OSError as exc:
            raise self._failed("rename", f"{source} -> {target}", exc) from exc

    def fsync_dir(self, path: Path) -> None:
        """Make the directory's entries (creations, renames) durable."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise self._failed("open directory", str(path), exc) from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            raise self._failed("fsync directory", str(path), exc) from exc
        finally:
            os.close(fd)

    def name_of(self, fd: int) -> str:
        return self._names.get(fd, f"fd {fd}")

    def _open(self, path: Path, flags: int) -> int:
        try:
            fd = open_private(path, flags)
        except OSError as exc:
            raise self._failed("open", str(path), exc) from exc
        self._names[fd] = str(path)
        return fd

    @staticmethod
    def _failed(operation: str, name: str, exc: OSError) -> StorageFailed:
        reason = exc.strerror or str(exc)
        return StorageFailed(
            f"{operation} failed on {name}: {reason}",
            context={"file": name, "operation": operation, "errno": exc.errno, "os_error": reason},
        )
