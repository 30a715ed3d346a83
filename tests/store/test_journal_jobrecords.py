"""Bulk-job records in the journal: written in order between groups, fsynced, skipped by every row reader,
taken by the replay, and a torn one treated as any torn tail."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from bulkrelay.errors import JournalCorrupt, StorageFailed
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.journal import (
    JournalState,
    JournalWriter,
    read_journal,
    read_journal_from,
    recover_torn_tail,
    scan_journal,
)
from bulkrelay.store.journal.jobrecords import (
    decode_job_record,
    encode_job_record,
    is_job_record,
    job_ledgers,
    row_ranges,
    rows_of,
)
from bulkrelay.store.storage import Storage
from tests.runplans import delivered_entry

pytestmark = pytest.mark.anyio


async def _write(path: Path, storage: Storage) -> None:
    """Rows 1-2, job 1 created over rows 3-5, rows 3-4, job 1's results, then row 6 alone."""
    writer = JournalWriter(
        path, storage, next_seq=1, on_commit=lambda e, o: None, state=JournalState.empty(6)
    )
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        await writer.submit_group(lambda seq: [delivered_entry(1), delivered_entry(2)])
        await writer.commit_record(
            encode_job_record(1, "created", remote="J1", rows=[[3, 5]], keys=["a", "b", "c"])
        )
        await writer.submit_group(lambda seq: [delivered_entry(3), delivered_entry(4)])
        await writer.commit_record(encode_job_record(1, "results"))
        await writer.submit(delivered_entry(6))
        await writer.close()


async def test_records_come_in_order_between_groups_each_fsynced(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    spy = FaultyStorage()
    await _write(path, spy)
    lines = path.read_bytes().splitlines(keepends=True)
    kinds = [
        "job" if is_job_record(line) else "marker" if line.startswith(b'{"commit"') else "row"
        for line in lines
    ]
    assert kinds == ["row", "row", "marker", "job", "row", "row", "marker", "job", "row", "marker"]
    assert [e.row_number for e in read_journal(path)] == [1, 2, 3, 4, 6]
    assert [e.row_number for _, _, e in read_journal_from(path, 0)] == [1, 2, 3, 4, 6]
    assert spy.calls.count("fsync") >= 5  # three groups and two records, each its own fsync


async def test_the_replay_takes_records_and_the_ledger_folds_them(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    await _write(path, Storage())
    scan = scan_journal(path, committed_seq=0, committed_offset=0, row_count=6)
    assert (scan.last_seq, scan.torn_tail, len(scan.done)) == (5, None, 5)
    assert 5 not in scan.done
    ledger = job_ledgers(path)[1]
    assert (ledger.remote, ledger.rows, ledger.keys, ledger.events) == (
        "J1",
        [3, 4, 5],
        ["a", "b", "c"],
        ["created", "results"],
    )
    assert ledger.ended


async def test_a_torn_record_at_the_end_goes_aside_and_names_no_job(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    await _write(path, Storage())
    whole = path.read_bytes()
    record = encode_job_record(2, "created", remote="J2", rows=[[5, 5]], keys=["c"])
    for cut in (1, len(record) // 2, len(record) - 1):
        path.write_bytes(whole + record[:cut])
        scan = scan_journal(path, committed_seq=0, committed_offset=0, row_count=6)
        assert scan.torn_tail is not None and scan.valid_end == len(whole)
        assert 2 not in job_ledgers(path)
        recover_torn_tail(path, scan, Storage())
        assert path.read_bytes() == whole


def test_a_record_inside_a_group_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    anyio.run(_write, path, Storage())
    lines = path.read_bytes().splitlines(keepends=True)
    # the record moved between a group's rows and its marker: no writer does that
    moved = [*lines[:3], lines[4], lines[3], *lines[5:]]
    path.write_bytes(b"".join(moved))
    with pytest.raises(JournalCorrupt, match="bulk-job record after 1 lines without their commit marker"):
        scan_journal(path, committed_seq=0, committed_offset=0, row_count=6)


def test_a_record_line_is_checked_and_ranges_round_trip() -> None:
    line = encode_job_record(4, "state", state="Failed", error="bad")
    assert decode_job_record(line) is not None
    assert decode_job_record(line.replace(b"bad", b"bod")) is None
    assert rows_of(row_ranges([1, 2, 3, 7, 9, 10])) == [1, 2, 3, 7, 9, 10]
    assert row_ranges([1, 2, 3, 7]) == [[1, 3], [7, 7]]
    with pytest.raises(ValueError, match="unknown"):
        encode_job_record(1, "exploded")


async def test_a_record_whose_fsync_fails_raises_to_its_writer(tmp_path: Path) -> None:
    """The job's data is uploaded only once its record is durable: a failed fsync says so at once."""
    path = tmp_path / "results.jsonl"
    writer = JournalWriter(path, FaultyStorage(fail_fsync_at=2), next_seq=1, on_commit=lambda e, o: None)
    record = encode_job_record(1, "created", remote="J1", rows=[[2, 2]], keys=["b"])
    async with anyio.create_task_group() as group:
        group.start_soon(writer.run)
        await writer.submit(delivered_entry(1))  # the first fsync: its group's
        with pytest.raises(StorageFailed, match="fsync failed"):
            await writer.commit_record(record)
        group.cancel_scope.cancel()
