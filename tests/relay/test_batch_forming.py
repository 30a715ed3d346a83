"""The fixed rule of relay/batches.py: the same pending rows make the same batches after a crash."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from bulkrelay.job.batch import BatchRenderer
from bulkrelay.job.config import parse_job
from bulkrelay.job.records import Record
from bulkrelay.job.request import RequestRenderer
from bulkrelay.relay.batches import BatchFormer
from bulkrelay.relay.stopping import StopControl
from bulkrelay.store.rowset import RowSet

pytestmark = pytest.mark.anyio

ROWS = 120
JOB: dict[str, Any] = {
    "version": 1,
    "input": {"file": "rows.csv", "key": "id"},
    "request": {
        "method": "POST",
        "url": "http://127.0.0.1:9/v1/batch/array",
        "batch": {"max_items": 6, "max_bytes": 400, "item": {"id": {"from": "id"}, "note": {"from": "note"}}},
    },
}


def _records() -> list[Record]:
    rng = random.Random(7)  # notes of varied length: batches close on bytes at varied places
    return [Record(n, n + 1, {"id": str(n), "note": "x" * rng.randint(0, 120)}) for n in range(1, ROWS + 1)]


def _batcher() -> BatchRenderer:
    config = parse_job(yaml.safe_dump(JOB), file="job.yaml")
    batcher = BatchRenderer.of_job(config, RequestRenderer.from_config(config.request, {}), "f" * 64)
    assert batcher is not None
    return batcher


async def _batches(journaled: RowSet | None) -> list[list[int]]:
    former = BatchFormer(_batcher(), StopControl(), journaled)

    def pending() -> Iterator[Record]:  # as the engine's reader: done rows passed over, told of
        for record in _records():
            if journaled is not None and record.row_number in journaled:
                former.skipped(record.row_number)
            else:
                yield record

    former.feed(pending())
    formed = []
    while (batch := await former.next()) is not None:
        formed.append([pending.row_number for pending in batch.items])
        former.done([])
    return formed


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_after_a_crash_the_pending_rows_form_the_very_batches_left_unsent(seed: int) -> None:
    first = await _batches(None)
    assert [row for batch in first for row in batch] == list(range(1, ROWS + 1))
    assert len({len(batch) for batch in first}) > 1  # closed on bytes at varied places, not only on items
    rng = random.Random(seed)
    committed = [batch for batch in first if rng.random() < 0.5]  # whole batches, as the journal commits
    journaled = RowSet(ROWS)
    for batch in committed:
        for row in batch:
            journaled.add(row)
    again = await _batches(journaled)
    assert again == [batch for batch in first if batch not in committed]
    # A second crash over those: the same again.
    for batch in again[::2]:
        for row in batch:
            journaled.add(row)
    assert await _batches(journaled) == again[1::2]


async def test_rows_done_outside_a_selection_are_no_gap() -> None:
    # A retry-failed run: rows outside its selection count as done, but were never journaled here.
    former = BatchFormer(_batcher(), StopControl(), RowSet(ROWS))
    selected = {3, 9, 10, 40}

    def pending() -> Iterator[Record]:
        for record in _records():
            if record.row_number in selected:
                yield record
            else:
                former.skipped(record.row_number)

    former.feed(pending())
    batch = await former.next()
    assert batch is not None and [p.row_number for p in batch.items] == [3, 9, 10, 40]
