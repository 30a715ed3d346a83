"""Helpers of the results sink's tests: a run directory, groups appended to its journal as the writer
commits them (with or without their marker), a SQLite sink and the table it holds."""

from __future__ import annotations

import sqlite3
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from bulkrelay.store.journal import JournalEntry, encode_batch, encode_marker
from bulkrelay.store.results import COLUMNS, SinkTarget
from bulkrelay.store.rundir import RunDir
from tests.runplans import delivered_entry, run_plan


def failed_entry(row: int, **changes: Any) -> JournalEntry:
    entry = replace(delivered_entry(row), success=False, classification="http_client_error", status_code=422)
    return replace(entry, error="422 Unprocessable", **changes)


def append_group(
    run: RunDir, entries: list[JournalEntry], first_seq: int, t: float, *, marked: bool = True
) -> int:
    """Append the group's lines (and its marker); the journal's size after them."""
    group = b"".join(encode_batch(first_seq, entries))
    last = first_seq + len(entries) - 1
    marker = encode_marker(last, len(entries), t, zlib.crc32(group)) if marked else b""
    with run.journal_path.open("ab") as out:
        out.write(group + marker)
    return run.journal_path.stat().st_size


def new_run(runs: Path, name: str = "accounts") -> RunDir:
    return RunDir.create(runs, run_plan(name=name))


def sqlite_sink(tmp_path: Path) -> SinkTarget:
    path = tmp_path / "results.db"
    return SinkTarget("sqlite", f"sqlite:///{path}", f"sqlite:///{path}", "bulkrelay_results", path)


def table_of(sink: SinkTarget) -> dict[str, dict[str, object]]:
    """The sink's rows by key (none before the table exists)."""
    assert sink.path is not None
    with sqlite3.connect(sink.path) as db:
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'bulkrelay_results'").fetchone()
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM bulkrelay_results").fetchall() if exists else []
    db.close()
    return {row[1]: dict(zip(COLUMNS, row, strict=True)) for row in rows}
