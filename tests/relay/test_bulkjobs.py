"""`request.bulk_job` (salesforce_bulk2) in-process against the embedded target's ingest API: jobs formed
in input order, results shuffled and matched by key, failed and unprocessed rows, hostile answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.demo.target import start_target
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.bulkrun import run_bulk_job, write_bulk_job

pytestmark = pytest.mark.anyio

NAMES = ["ann", "bob", "bogus-cy", "dan", "later-eve", "fay", "gus", "hal", "ivy"]


async def test_each_row_gets_its_own_outcome_matched_by_key(tmp_path: Path) -> None:
    target = await start_target({"bulk": {"polls_to_complete": 2}})
    try:
        job = write_bulk_job(tmp_path, target.url, NAMES)
        result = await run_bulk_job(job, target)
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == list(range(1, 10)) and len(result.entries) == 9
    for number, name in enumerate(NAMES, start=1):
        entry = rows[number]
        assert entry.key == f"k{number}-{name}"
        if "bogus" in name:
            assert (entry.success, entry.classification) == (False, "item_rejected")
            assert entry.error == f"INVALID_FIELD:bad value in k{number}-{name}"
        else:
            assert entry.success, entry
            assert entry.captured is not None and entry.captured["sf__Id"].startswith("003")
            assert entry.captured["sf__Created"] == "true"
    # the unprocessed row went in a later job, and no row ran in two jobs
    stats = target.state.stats()
    assert stats["bulk_rows_in_two_jobs"] == 0 and stats["bulk_rows_processed"] == 9
    ledgers = job_ledgers(result.run.journal_path)
    assert [ledger.rows for ledger in ledgers.values()] == [[1, 2, 3, 4], [5, 6, 7, 8], [5, 9]]
    assert all(ledger.events[-1] == "results" for ledger in ledgers.values())
    uploads = [r for r in result.requests if r["method"] == "PUT"]
    assert uploads[0]["body"].splitlines()[0] == "External_Id__c,Email"
    assert all(r["headers"]["Authorization"] == "Bearer tok-secret" for r in result.requests)
