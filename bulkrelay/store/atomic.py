"""Atomic replace of files: a reader sees the old content or the new, never a mix.

The recipe: write a temp file in the same directory (a rename never crosses file systems), fsync
it, rename it over the target, then fsync the directory so the rename itself survives a crash.
A failure at any step leaves the previous file intact and removes the temp file.
`move_file` moves a whole file the same way, by a plain rename when it can; `replacing` gives the temp
file to a writer that streams, for content too large to hold. `file_to_replace` says which file a path
that a user named (`report -o`, `--metrics-file`) stands for, before anything is replaced.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from bulkrelay.errors import BulkRelayError, JournalCorrupt, NotFound, StorageFailed, UsageError
from bulkrelay.private import PRIVATE_FILE_MODE, open_private
from bulkrelay.store.storage import Storage, storage_failed

_COPY_CHUNK = 1 << 20


def write_atomic(
    path: Path, data: bytes, storage: Storage | None = None, *, mode: int = PRIVATE_FILE_MODE
) -> None:
    """Replace `path` with `data`, durably; the new file is created `mode` (0600), less the umask."""
    _replace_with(path, (data,), storage or Storage(), mode)


def move_file(source: Path, target: Path, storage: Storage | None = None) -> None:
    """Move `source` over `target`, durably: `target` ends up the whole file or stays as it was.

    A rename when both are on one file system. A rename cannot cross file systems (EXDEV: a directory
    that is a link or a mount elsewhere), so then the bytes are copied as `write_atomic` writes them
    (a temp file beside `target`, fsynced, renamed) and `source` is removed only once `target` holds
    every byte. A failure is `StorageFailed` naming the file; `source` is still there."""
    storage = storage or Storage()
    try:
        storage.replace(source, target)
    except StorageFailed as failed:
        if failed.context.get("errno") != errno.EXDEV:
            raise
        _replace_with(target, _chunks_of(source), storage)
        with contextlib.suppress(OSError):  # the copy is whole and durable; the owner cleans up the rest
            source.unlink()
        return
    storage.fsync_dir(target.parent)


@contextlib.contextmanager
def replacing(
    path: Path, storage: Storage | None = None, *, mode: int = PRIVATE_FILE_MODE
) -> Iterator[BinaryIO]:
    """A buffered file to stream `path`'s new content into. When the block ends, what was written
    replaces `path` durably (the recipe at the top). If the block raises, `path` stays as it was and
    the temp file is removed. The new file is created `mode` (0600), less the umask."""
    storage = storage or Storage()
    temp = _temp_beside(path)
    fd = storage.open_new(temp, mode)
    try:
        try:
            with io.BufferedWriter(_StorageWriter(storage, fd), _COPY_CHUNK) as out:
                yield out
            storage.fsync(fd)
        except BaseException:
            with contextlib.suppress(StorageFailed):
                storage.close(fd)
            raise
        storage.close(fd)
        storage.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    storage.fsync_dir(path.parent)


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def file_to_replace(path: Path, *, named: str, suggestion: str) -> Path:
    """The file that replacing the user's `path` must replace: `path`, or, through symbolic links, the
    file it points to (replaced in its own directory, so the link stays and names the new content).
    A rename puts a regular file wherever it lands, so a path that is something else (a device, a FIFO,
    a socket, a directory) is refused with `UsageError`, naming it as `named` (`-o`) and offering
    `suggestion`; a path that does not exist yet is the file to create."""
    real = Path(os.path.realpath(path))
    try:
        kind = stat.S_IFMT(os.stat(real).st_mode)
    except FileNotFoundError:
        return real
    except OSError as exc:  # a loop of links, a path through a file, no permission to look
        reason = exc.strerror or str(exc)
        raise UsageError(
            f"{named} {path}: {reason}", context={"path": str(path)}, suggestion=suggestion
        ) from None
    if kind != stat.S_IFREG:
        what = _KINDS.get(kind, "not a regular file")
        raise UsageError(
            f"{named} {path} is {what}, not a regular file: it would be replaced by one",
            context={"path": str(path), "kind": what},
            suggestion=suggestion,
        )
    return real


class _StorageWriter(io.RawIOBase):
    """The raw file under `replacing`'s buffer: each write goes through the storage seam."""

    def __init__(self, storage: Storage, fd: int) -> None:
        self._storage = storage
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._storage.write(self._fd, chunk)
        return len(chunk)


def _temp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def _chunks_of(path: Path) -> Iterator[bytes]:
    try:
        with open(path, "rb", opener=open_private) as stream:
            while chunk := stream.read(_COPY_CHUNK):
                yield chunk
    except OSError as exc:
        raise storage_failed("read", str(path), exc) from exc


def _replace_with(
    path: Path, chunks: Iterable[bytes], storage: Storage, mode: int = PRIVATE_FILE_MODE
) -> None:
    """Replace `path` with the concatenated `chunks`, durably (the recipe at the top)."""
    with replacing(path, storage, mode=mode) as out:
        for chunk in chunks:
            out.write(chunk)


def write_json_atomic(path: Path, obj: Any, storage: Storage | None = None) -> None:
    """Replace `path` with `obj` as indented JSON with sorted keys (stable, diff-friendly)."""
    data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    write_atomic(path, data, storage)


def read_json(path: Path, *, invalid: type[BulkRelayError] = JournalCorrupt) -> Any:
    """Load a JSON state file.

    A missing file raises `NotFound`; an unreadable or malformed one raises `invalid`
    (by default `JournalCorrupt`: damaged run state makes a resume refuse).
    """
    try:
        with open(path, "rb", opener=open_private) as stream:  # a link is refused, never followed
            data = stream.read()
    except FileNotFoundError:
        raise NotFound(f"{path} does not exist", context={"path": str(path)}) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise invalid(f"cannot read {path}: {reason}", context={"path": str(path), "reason": reason}) from exc
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise invalid(
            f"{path} is not valid JSON: {exc}", context={"path": str(path), "reason": str(exc)}
        ) from None
