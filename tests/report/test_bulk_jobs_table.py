"""The report of a bulk run has a jobs table: each job's id, state, rows and durations, from the
journal's job records; a run without bulk jobs says it has none."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

import pytest

from bulkrelay.demo.target import start_target
from bulkrelay.ops.report import build_report
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.batchrun import run_batch_job, write_batch_job
from tests.relay.bulkrun import run_bulk_job, write_bulk_job

pytestmark = pytest.mark.anyio

ROW = re.compile(r'<tr class="bulk-job">(.*?)</tr>', re.S)


def _cells(row: str) -> list[str]:
    return [unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]


async def test_the_report_tables_each_bulk_job_with_its_id_state_rows_and_durations(tmp_path: Path) -> None:
    target = await start_target({"bulk": {"fail_job_every": 2}})
    try:
        names = ["ann", "bob", "cy", "dan", "eve", "fay"]
        result = await run_bulk_job(write_bulk_job(tmp_path, target.url, names), target)
    finally:
        await target.stop()
    html = build_report(result.run)[0]
    rows = [_cells(row) for row in ROW.findall(html)]
    ledgers = list(job_ledgers(result.run.journal_path).values())
    assert [row[:2] for row in rows] == [[str(ledger.job), ledger.remote] for ledger in ledgers]
    assert [row[3] for row in rows] == ["4", "2"]
    assert rows[0][2] == "JobComplete (results journaled)"
    assert rows[1][2].startswith("Failed: InvalidBatch") and rows[1][2].endswith(" (results journaled)")
    assert all(re.fullmatch(r"\d+\.\d s", cell) for row in rows for cell in row[4:]), rows
    assert 'id="bulk-jobs">2<' in html


async def test_a_run_without_bulk_jobs_says_so(tmp_path: Path) -> None:
    target = await start_target({})
    try:
        job = write_batch_job(tmp_path, target.url, "hubspot", ["a", "b"], max_items=2)
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    html = build_report(result.run)[0]
    assert 'id="no-bulk-jobs"' in html and not ROW.search(html)
