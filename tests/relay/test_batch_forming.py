"""The fixed rule of relay/batches.py: the same pending rows make the same batches after a crash."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from bulkrelay.job.batch import BatchRenderer
from bulkrelay.job.config import parse_job
from bulkrelay.job.records import Record
from bulkrelay.job.request import RequestRenderer
from bulkrelay.relay.batches import BatchFormer
from bulkrelay.relay.batchsender import Batch, PendingItem
from bulkrelay.relay.stopping import StopControl
from bulkrelay.store.batchretries import BatchRetries
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.storage import Storage

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
    return [list(rows) for rows, _ in await _formed(journaled)]


async def _formed(
    journaled: RowSet | None, retries: Path | None = None
) -> list[tuple[tuple[int, ...], int | None]]:
    """The requests a run over `journaled` forms before any answer comes back: (rows, retry number)."""
    log = None if retries is None else BatchRetries(retries, Storage())
    former = BatchFormer(_batcher(), StopControl(), journaled, log)

    def pending() -> Iterator[Record]:  # as the engine's reader: done rows passed over, told of
        for record in _records():
            if journaled is not None and record.row_number in journaled:
                former.skipped(record)
            else:
                yield record

    former.feed(pending())
    formed = []
    while (batch := await former.next()) is not None:
        formed.append((tuple(pending.row_number for pending in batch.items), batch.retry))
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
                former.skipped(record)

    former.feed(pending())
    batch = await former.next()
    assert batch is not None and [p.row_number for p in batch.items] == [3, 9, 10, 40]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
async def test_a_resumed_run_sends_again_under_the_key_it_sent_before(seed: int, tmp_path: Path) -> None:
    """A live run whose answers leave some items retryable (an Elasticsearch item 429), three requests in
    flight answered in random order, then a crash anywhere, with any prefix of the answers committed.
    Every request the resumed run forms carries the rows of a request sent before, under the key of
    the latest such request (a target that dedups by key replays its answer and applies nothing
    twice), or rows no request carried as they are (under a key never sent). Rows an answer left
    retryable go again in a request of their own, under a key of their own (a replayed 429 for ever,
    else)."""
    rng = random.Random(seed)
    log = tmp_path / "batch-retries.jsonl"
    former = BatchFormer(_batcher(), StopControl(), None, BatchRetries(log, Storage()))
    former.feed(iter(_records()))
    sent: list[tuple[tuple[int, ...], int | None]] = []
    answers: list[set[int]] = []  # the rows each answer made final, as answered
    crashes: list[tuple[int, bytes, int]] = []  # (answers so far, the log, requests sent so far)
    in_flight: list[Batch] = []
    while True:
        while len(in_flight) < 3 and (batch := await _next_due(former)) is not None:
            in_flight.append(batch)
            sent.append((_rows(list(batch.items)), batch.retry))
        crashes.append((len(answers), log.read_bytes() if log.exists() else b"", len(sent)))
        if not in_flight:
            break
        batch = in_flight.pop(rng.randrange(len(in_flight)))
        retry = [pending for pending in batch.items if pending.attempts < 2 and rng.random() < 0.3]
        for pending in retry:
            pending.attempts += 1
        answers.append({p.row_number for p in batch.items} - {p.row_number for p in retry})
        former.done(retry, batch)
    # No two requests under one key (rows and number); the very rows of a request sent again took a
    # number, fewer rows none (keyed by their ids alone, as a crash forms them).
    assert len(set(sent)) == len(sent) and any(number is not None for _, number in sent)
    for answered, logged, sent_count in crashes:
        committed = rng.randint(0, answered)  # the journal may lag behind the answers
        journaled = RowSet(ROWS)
        for finals in answers[:committed]:  # the journal commits whole requests, in the order answered
            for row in finals:
                journaled.add(row)
        resumed_log = tmp_path / f"resumed-{answered}.jsonl"
        resumed_log.write_bytes(logged)
        latest = dict(sent[:sent_count])  # rows -> the retry number of the latest request of them
        for rows, number in await _formed(journaled, resumed_log):
            assert number == latest[rows] if rows in latest else number is None, (answered, rows, number)


async def _next_due(former: BatchFormer) -> Batch | None:
    """The former's next request without waiting: None when only requests in flight remain."""
    with anyio.move_on_after(0.05):
        return await former.next()
    return None


def _rows(items: list[PendingItem]) -> tuple[int, ...]:
    return tuple(sorted(pending.row_number for pending in items))


async def test_a_size_a_413_taught_forms_the_same_batches_after_a_crash(tmp_path: Path) -> None:
    """The body size a 413 taught is durable from the row the next batch starts at: a run resumed after
    a crash, its first batches journaled, forms every later batch as the live run did."""
    log = tmp_path / "batch-retries.jsonl"
    live = BatchFormer(_batcher(), StopControl(), None, BatchRetries(log, Storage()))
    live.feed(iter(_records()))
    formed: list[tuple[int, ...]] = []
    while (batch := await live.next()) is not None:
        formed.append(tuple(pending.row_number for pending in batch.items))
        if len(formed) == 3:
            live.learn(150)  # the 413 of an earlier batch taught it: bodies of 150 bytes pass
        live.done([], batch)
    batcher = _batcher()
    later = formed[3:]  # the fourth batch and on were formed once the size was in force
    assert all(
        batcher.size(len(rows), sum(len(batcher.item(_records()[row - 1]).data) for row in rows)) <= 150
        for rows in later
        if len(rows) > 1
    )
    assert max(len(rows) for rows in later) < max(len(rows) for rows in formed[:3])
    for crash_after in (3, 4, 6):
        journaled = RowSet(ROWS)
        for rows in formed[:crash_after]:
            for row in rows:
                journaled.add(row)
        resumed = [rows for rows, _ in await _formed(journaled, log)]
        assert resumed == formed[crash_after:]
