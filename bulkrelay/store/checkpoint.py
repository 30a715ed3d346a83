"""`checkpoint.json`: counters and the committed journal frontier, replaced atomically.

The checkpoint never lists row numbers: the journal is the source of truth and a resume rebuilds
the done rows from it. The checkpoint says how far the journal was known to be committed (`seq`,
`offset`), which is what lets recovery tell a torn last batch from damage to committed rows.
It only ever lags the journal: the engine writes it after the batch it describes was fsynced.
A run that completed or was cancelled has none (`remove_checkpoint`): its summary has the counts.

`prefix` (when the writer kept it) is the SHA-256 of the journal's first `offset` bytes and the rows
they hold (a bitset, zlib-compressed: its Adler-32 catches damage, and a mostly-done run packs small),
so a resume can verify the committed lines with one hash pass instead of decoding each of them.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bulkrelay.errors import JournalCorrupt, NotFound
from bulkrelay.store.atomic import read_json, write_json_atomic
from bulkrelay.store.journal import CommittedPrefix
from bulkrelay.store.storage import Storage

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1

_COUNTERS = ("seq", "offset", "rows_done", "ok", "failed")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """`seq` is the last committed journal line, `offset` the byte just past it."""

    seq: int
    offset: int
    rows_done: int
    ok: int
    failed: int
    updated_at: str
    version: int = CHECKPOINT_VERSION
    # While a process relays: its pace (rows/s this call, the limiter's current rate and pause), so
    # `status` can show a live run's rate from another process. Informational; never verified.
    live: dict[str, Any] | None = None
    prefix: CommittedPrefix | None = None  # of lines 1..seq, bytes [0, offset)


def write_checkpoint(run_dir: Path, cp: Checkpoint, storage: Storage | None = None) -> None:
    data = asdict(cp)
    if data["live"] is None:
        del data["live"]
    del data["prefix"]
    if cp.prefix is not None:
        packed = base64.b64encode(zlib.compress(cp.prefix.done_rows, 1)).decode()
        data["journal_prefix"] = {"sha256": cp.prefix.sha256, "done_rows": packed}
    write_json_atomic(run_dir / CHECKPOINT_FILE, data, storage)


def remove_checkpoint(run_dir: Path, storage: Storage | None = None) -> None:
    """A run that completed or was cancelled keeps no checkpoint (REQ-C-035): there is nothing left to
    continue, and the identical invocation starts fresh. Its journal and summary stay."""
    storage = storage or Storage()
    path = run_dir / CHECKPOINT_FILE
    if path.exists():
        storage.remove(path)
        storage.fsync_dir(run_dir)


def read_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run's checkpoint, or None when there is none yet."""
    path = run_dir / CHECKPOINT_FILE
    try:
        raw = read_json(path)
    except NotFound:
        return None
    return _parse(path, raw)


def _parse(path: Path, raw: Any) -> Checkpoint:
    if not isinstance(raw, dict):
        raise _malformed(path, "not a JSON object")
    if raw.get("version") != CHECKPOINT_VERSION:
        raise _malformed(path, f"unsupported version {raw.get('version')!r}")
    for key in _COUNTERS:
        value = raw.get(key)
        if type(value) is not int or value < 0:
            raise _malformed(path, f"{key!r} must be a non-negative integer, got {value!r}")
    if not isinstance(raw.get("updated_at"), str):
        raise _malformed(path, "'updated_at' must be a string")
    if raw["ok"] + raw["failed"] != raw["rows_done"]:
        raise _malformed(path, "ok + failed does not equal rows_done")
    live = raw.get("live") if isinstance(raw.get("live"), dict) else None
    counters = {key: raw[key] for key in (*_COUNTERS, "updated_at", "version")}
    return Checkpoint(**counters, live=live, prefix=_parse_prefix(path, raw))


def _parse_prefix(path: Path, raw: dict[str, Any]) -> CommittedPrefix | None:
    found = raw.get("journal_prefix")
    if found is None:
        return None  # written before prefixes were kept, or by a writer that kept none
    sha256, packed = (found.get("sha256"), found.get("done_rows")) if isinstance(found, dict) else (0, 0)
    if not isinstance(sha256, str) or not isinstance(packed, str):
        raise _malformed(path, "'journal_prefix' must hold the strings 'sha256' and 'done_rows'")
    try:
        done_rows = zlib.decompress(base64.b64decode(packed, validate=True))
    except (binascii.Error, zlib.error) as exc:
        raise _malformed(path, f"'journal_prefix.done_rows' cannot be read: {exc}") from None
    return CommittedPrefix(raw["seq"], raw["offset"], raw["ok"], sha256, done_rows)


def _malformed(path: Path, reason: str) -> JournalCorrupt:
    return JournalCorrupt(
        f"{CHECKPOINT_FILE} is malformed: {reason}",
        context={"file": str(path), "reason": reason},
        suggestion="the run state is damaged; start a new run",
    )
