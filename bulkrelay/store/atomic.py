"""Atomic replace of small files: a reader sees the old content or the new, never a mix.

The recipe: write a temp file in the same directory (a rename never crosses file systems), fsync
it, rename it over the target, then fsync the directory so the rename itself survives a crash.
A failure at any step leaves the previous file intact and removes the temp file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.errors import BulkRelayError, JournalCorrupt, NotFound, StorageFailed
from bulkrelay.private import open_private
from bulkrelay.store.storage import Storage


def write_atomic(path: Path, data: bytes, storage: Storage | None = None) -> None:
    """Replace `path` with `data`, durably."""
    storage = storage or Storage()
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = storage.open_new(temp)
    try:
        try:
            storage.write(fd, data)
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
