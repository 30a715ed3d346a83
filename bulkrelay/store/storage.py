"""The storage seam: every write, fsync and rename of run state goes through a `Storage`.

Failure tests hand the code above it `store/faultystorage.py`'s `FaultyStorage`, which makes the Nth
write or fsync fail, so that code can be proven to stop cleanly. Any `OSError` becomes `StorageFailed`,
naming the file and the OS error; nothing here retries, because after a failed write or fsync the
kernel may already have dropped the data (a retried fsync can report success for pages that were never
written).

Files are opened private (bulkrelay.private): 0600, never through a symbolic link.
"""

from __future__ import annotations

import os
from pathlib import Path

from bulkrelay.errors import StorageFailed
from bulkrelay.private import PRIVATE_FILE_MODE, open_private


class Storage:
    """Thin wrappers over `os` calls on file descriptors, remembering which file each fd is for."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def open_append(self, path: Path) -> int:
        """Open (creating if needed) for appending; every write lands at the end of the file."""
        return self._open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def open_new(self, path: Path, mode: int = PRIVATE_FILE_MODE) -> int:
        """Create a file that must not exist yet (temp files, torn-tail copies), 0600 unless told."""
        return self._open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)

    def write(self, fd: int, data: bytes) -> None:
        """Write all of `data`, looping over short writes."""
        view = memoryview(data)
        try:
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except OSError as exc:
            raise storage_failed("write", self.name_of(fd), exc) from exc

    def fsync(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            raise storage_failed("fsync", self.name_of(fd), exc) from exc

    def truncate(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            raise storage_failed("truncate", self.name_of(fd), exc) from exc

    def close(self, fd: int) -> None:
        name = self._names.pop(fd, f"fd {fd}")
        try:
            os.close(fd)
        except OSError as exc:
            raise storage_failed("close", name, exc) from exc

    def replace(self, source: Path, target: Path) -> None:
        """Rename `source` over `target` (atomic on POSIX); the caller fsyncs the directory."""
        try:
            os.replace(source, target)
        except OSError as exc:
            raise storage_failed("rename", f"{source} -> {target}", exc) from exc

    def remove(self, path: Path) -> None:
        """Remove a file if it is there; the caller fsyncs the directory."""
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise storage_failed("unlink", str(path), exc) from exc

    def fsync_dir(self, path: Path) -> None:
        """Make the directory's entries (creations, renames) durable."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise storage_failed("open directory", str(path), exc) from exc
        try:
            os.fsync(fd)
        except OSError as exc:
            raise storage_failed("fsync directory", str(path), exc) from exc
        finally:
            os.close(fd)

    def name_of(self, fd: int) -> str:
        return self._names.get(fd, f"fd {fd}")

    def _open(self, path: Path, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
        try:
            fd = open_private(path, flags, mode)
        except OSError as exc:
            raise storage_failed("open", str(path), exc) from exc
        self._names[fd] = str(path)
        return fd


def storage_failed(operation: str, name: str, exc: OSError) -> StorageFailed:
    """The error for a failed `operation` on the file `name`: names the file and the OS error."""
    reason = exc.strerror or str(exc)
    return StorageFailed(
        f"{operation} failed on {name}: {reason}",
        context={"file": name, "operation": operation, "errno": exc.errno, "os_error": reason},
    )
