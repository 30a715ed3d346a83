"""`JournalWriter.submit_group`: the rows of one batch request are written and fsynced together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.journal import JournalEntry, JournalWriter, read_journal
from tests.runplans import delivered_entry

pytestmark = pytest.mark.anyio


def _group(first_row: int, size: int) -> list[JournalEntry]:
    return [delivered_entry(row) for row in range(first_row, first_row + size)]


@pytest.mark.parametrize(("max_rows", "max_bytes"), [(3, 1 << 20), (1000, 200)])
async def test_a_group_is_never_split_across_writes(tmp_path: Path, max_rows: int, max_bytes: int) -> None:
    spy = FaultyStorage()
    path = tmp_path / "results.jsonl"
    firsts: list[int] = []

    def stamped(entries: list[JournalEntry]) -> Callable[[int], list[JournalEntry]]:
        def build(first_seq: int) -> list[JournalEntry]:
            firsts.append(first_seq)
            return [
                replace(e, batch={"seq": first_seq, "index": n, "size": len(entries)})
                for n, e in enumerate(entries)
            ]

        return build

    writer = JournalWriter(
        path,
        spy,
        next_seq=1,
        on_commit=lambda e, o: None,
        max_rows=max_rows,
        max_bytes=max_bytes,
        max_delay=0.5,
    )
    sizes = [2, 4, 1, 5, 3]
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        row = 1
        for size in sizes:
            await writer.submit_group(stamped(_group(row, size)))
            row += size
        await writer.submit(delivered_entry(row))
        await writer.close()
    entries = list(read_journal(path))
    assert [e.row_number for e in entries] == list(range(1, sum(sizes) + 2))
    assert firsts == [1, 3, 7, 8, 13]
    # Every write holds whole groups: it begins and ends where a group (or the lone entry) does.
    bounds = {1, 3, 7, 8, 13, 16, 17}
    offset = 0
    for data in spy.writes:
        lines = data.count(b"\n") - data.count(b'{"commit":')  # each write ends with its commit marker
        rows = [e.row_number for e in entries[offset : offset + lines]]
        offset += len(rows)
        assert rows[0] in bounds and rows[-1] + 1 in bounds, rows
    assert offset == len(entries)
    # The groups longer than max_rows, or than max_bytes, were each written whole, alone if need be.
    assert any(len(data.splitlines()) - 1 >= 5 for data in spy.writes)
