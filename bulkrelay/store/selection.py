"""The rows a `retry-failed` run is limited to, kept in its run directory as a bitset."""

from __future__ import annotations

from pathlib import Path

from bulkrelay.private import open_private
from bulkrelay.store.atomic import write_atomic
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.storage import Storage

SELECTION = "selection.bits"


def save_selection(run_dir: Path, rows: RowSet, storage: Storage) -> None:
    write_atomic(run_dir / SELECTION, rows.to_bytes(), storage)


def load_selection(run_dir: Path, size: int) -> RowSet | None:
    try:
        with open(run_dir / SELECTION, "rb", opener=open_private) as stream:
            return RowSet.from_bytes(size, stream.read())
    except FileNotFoundError:
        return None
