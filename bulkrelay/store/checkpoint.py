"""`checkpoint.json`: counters and the committed journal frontier, replaced atomically.

The checkpoint never lists row numbers: the journal is the source of truth and a resume rebuilds
the done rows from it. The checkpoint says how far the journal was known to be committed (`seq`,
`offset`), which is what lets recovery tell a torn last batch from damage to committed rows.
It only ever lags the journal: the engine writes it after the batch it describes was fsynced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bulkrelay.errors import JournalCorrupt, NotFound
from bulkrelay.store.atomic import read_json, write_json_atomic
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


def write_checkpoint(run_dir: Path, cp: Checkpoint, storage: Storage | None = None) -> None:
    data = asdict(cp)
    if data["live"] is None:
        del data["live"]
    write_json_atomic(run_dir / CHECKPOINT_FILE, data, storage)


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
    return Checkpoint(**{key: raw[key] for key in (*_COUNTERS, "updated_at", "version")}, live=live)


def _malformed(path: Path, reason: str) -> JournalCorrupt:
    return JournalCorrupt(
        f"{CHECKPOINT_FILE} is malformed: {reason}",
        context={"file": str(path), "reason": reason},
        suggestion="the run state is damaged; start a new run",
    )
