"""`request.bulk_job` with `kind: named_import` in-process against the embedded target's HubSpot-like
imports API (demo/importtarget.py): one request submits, errors matched to rows by key, and a journal's
import found again by its name in the target's list, never imported twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.demo.target import RunningTarget, start_target
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.journal.jobrecords import encode_job_record, job_ledgers
from tests.relay.batchrun import BatchRun
from tests.relay.bulkrun import run_bulk_job, write_bulk_job
from tests.waiting import HANG_BUDGET

pytestmark = pytest.mark.anyio

NAMES = ["ann", "bob", "bogus-cy", "dan", "eve", "fay", "bogus-gus", "hal", "ivy", "jo", "kim"]


def write_import_job(tmp_path: Path, running: RunningTarget, names: list[str], **bulk: Any) -> Path:
    return write_bulk_job(
        tmp_path, running.url, names, kind="named_import", base_url=running.url, object="0-1", **bulk
    )


async def _run(tmp_path: Path, plan: dict[str, Any], names: list[str], **bulk: Any) -> BatchRun:
    tmp_path.mkdir()
    target = await start_target({"imports": plan})
    try:
        return await run_bulk_job(write_import_job(tmp_path, target, names, **bulk), target)
    finally:
        await target.stop()


async def test_each_rows_outcome_is_journaled_by_key_with_its_error(tmp_path: Path) -> None:
    target = await start_target({"imports": {"page_size": 2}})
    try:
        result = await run_bulk_job(write_import_job(tmp_path, target, NAMES), target)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == list(range(1, 12)) and len(result.entries) == 11
    for number, name in enumerate(NAMES, start=1):
        entry = rows[number]
        assert entry.key == f"k{number}-{name}"
        if "bogus" in name:
            assert (entry.success, entry.classification) == (False, "item_rejected")
            assert entry.error == f"INVALID_PROPERTY_VALUE: bad value in k{number}-{name}"
        else:
            assert entry.success and entry.captured is not None and entry.captured["import_id"], entry
    assert stats["imports"]["submitted"] == 3 and stats["import_rows_in_two_imports"] == 0
    ledgers = job_ledgers(result.run.journal_path)
    assert [ledger.rows for ledger in ledgers.values()] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
    submits = [r for r in result.requests if r["method"] == "POST"]
    assert len(submits) == 3
    for submit, ledger in zip(submits, ledgers.values(), strict=True):
        assert (
            submit["path"] == "/crm/v3/imports" and submit["headers"]["Authorization"] == "Bearer tok-secret"
        )
        assert f'"name":"{ledger.remote}"' in submit["body"]  # the name journaled before the submit
        assert (
            "External_Id__c,Email\n" in submit["body"]
            and '"columnType":"HUBSPOT_ALTERNATE_ID"' in submit["body"]
        )


async def test_a_failed_import_fails_its_rows_and_a_hostile_error_list_loses_none(tmp_path: Path) -> None:
    failed = await _run(tmp_path / "failed", {"fail_import_every": 2}, ["a", "b", "c", "d", "e"])
    rows = failed.by_row()
    assert [rows[n].success for n in (1, 2, 3, 4, 5)] == [True, True, True, True, False]
    assert "bulk job bulkrelay-2-" in (rows[5].error or "") and "the import ended FAILED" in (
        rows[5].error or ""
    )
    hostile = await _run(tmp_path / "hostile", {"hostile_errors": "unknown_key"}, ["a", "b"])
    assert sorted(hostile.by_row()) == [1, 2]
    assert all("names key 'never-sent', which job bulkrelay-1-" in (e.error or "") for e in hostile.entries)


@pytest.mark.parametrize("submitted", [True, False])
async def test_after_a_crash_the_identical_rerun_attaches_by_name_and_never_imports_twice(
    tmp_path: Path, submitted: bool
) -> None:
    """The journal names an import (its `created` record only: killed right after the submit, or right
    before it). Submitted: found in the list and attached to. Not: its rows go in a new import."""
    names = ["ann", "bob", "bogus-cy"]
    poll = {"first_seconds": 0.01, "max_seconds": 0.02, "max_wait": "200ms"}
    target = await start_target({"imports": {"stuck": True}})
    try:
        job = write_import_job(tmp_path, target, names, poll=poll)
        first = await run_bulk_job(job, target)
        assert first.outcome.stop_reason is StopReason.TIMEOUT and first.entries == []
        journal = first.run.journal_path
        created = journal.read_bytes().splitlines(keepends=True)[0]  # the kill: nothing after `created`
        if not submitted:  # killed before the submit: the target never heard of this name
            fields = orjson.loads(created)
            unsent = {"remote": "bulkrelay-1-unsent", "rows": fields["rows"], "keys": fields["keys"]}
            created = encode_job_record(1, "created", **unsent)
        journal.write_bytes(created)
        busy = {"match": {"method": "GET", "path_contains": "/crm/v3/imports"}, "times": 4, "status": 503}
        target.state.set_plan({"imports": {}, "rules": [busy]})  # the list asked again as a poll is
        # The second call may wait as long as a hang's bound: 200 ms was short of a loaded machine's
        # four 503s and polls, and that call then stopped at max_wait (a flaky failure).
        write_import_job(tmp_path, target, names, poll={**poll, "max_wait": HANG_BUDGET})
        again = await run_bulk_job(job, target, run=first.run)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert again.outcome.stop_reason is None
    assert [e.success for e in sorted(again.entries, key=lambda e: e.row_number)] == [True, True, False]
    assert stats["imports"]["submitted"] == (
        1 if submitted else 2
    )  # the first run's, and a new one if unsent
    assert stats["import_rows_in_two_imports"] == (0 if submitted else 3)
    ledgers = job_ledgers(again.run.journal_path)
    assert ledgers[1].events[-1] == ("results" if submitted else "aborted")


async def test_the_example_runs_against_the_demo_target(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "bulk-jobs" / "hubspot.yaml"
    target = await start_target({})
    try:
        result = await run_bulk_job(example, target, runs=tmp_path / "runs")
    finally:
        await target.stop()
    failed = {entry.key: entry.error for entry in result.entries if not entry.success}
    assert len(result.entries) == 12 and failed == {
        "C-0006-bogus-fay": "INVALID_PROPERTY_VALUE: bad value in C-0006-bogus-fay"
    }
