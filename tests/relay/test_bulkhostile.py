"""Hostile answers every bulk-job kind meets the same way, in-process against the embedded target: a job id
that is no URL path segment, and answers that cannot be read (docs/bulk-jobs.md, "Hostile answers")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bulkrelay.demo.target import start_target
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.batchrun import BatchRun
from tests.relay.bulkrun import run_bulk_job, write_kind_job

pytestmark = pytest.mark.anyio

NAMES = ["ann", "bob", "cy"]
KINDS = ["salesforce_bulk2", "generic", "named_import"]
# The request that makes each kind's job (its answer names the id), and each kind's poll.
MAKES = {
    "salesforce_bulk2": {"method": "POST", "path_contains": "/jobs/ingest"},
    "generic": {"method": "POST", "path_contains": "/jobs/ingest"},
    "named_import": {"method": "POST", "path_contains": "/crm/v3/imports"},
}
POLLS = {
    "salesforce_bulk2": {"method": "GET", "path_contains": "/jobs/ingest/"},
    "generic": {"method": "GET", "path_contains": "/jobs/ingest/"},
    "named_import": {"method": "GET", "path_contains": "/crm/v3/imports/"},
}
HOSTILE_IDS = ["../../../_control/reset?x=1#", "..", ".", "750/batches", "", "750\r\nX-Evil: 1", "7" * 300]


async def _run(
    tmp_path: Path, kind: str, plan: dict[str, Any], **bulk: Any
) -> tuple[BatchRun, dict[str, Any]]:
    target = await start_target(plan)
    try:
        job = write_kind_job(tmp_path, target.url, NAMES, kind)
        if bulk:
            spec = yaml.safe_load(job.read_text())
            spec["request"]["bulk_job"] |= bulk
            job.write_text(yaml.safe_dump(spec, sort_keys=False))
        result = await run_bulk_job(job, target)
        stats = target.state.stats()
    finally:
        await target.stop()
    return result, stats


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hostile", HOSTILE_IDS)
async def test_a_job_id_that_is_no_path_segment_never_steers_a_request(
    tmp_path: Path, kind: str, hostile: str
) -> None:
    made = {"match": MAKES[kind], "times": 1, "body": {"id": hostile, "state": "Open"}}
    result, stats = await _run(tmp_path, kind, {"rules": [made]})
    assert result.outcome.stop_reason is None, result.outcome
    # every request went to the kind's own API, none to a path or query the answer made
    base = "/crm/v3/imports" if kind == "named_import" else "/services/data/v62.0/jobs/ingest"
    for request in result.requests:
        assert request["path"].startswith(base), request
        assert ".." not in request["raw_path"] and "_control" not in request["raw_path"], request
        assert "\n" not in request["raw_path"] and request["headers"].get("X-Evil") is None
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3]  # each row journaled once
    if kind == "named_import":  # the import was made: its rows go in another, looked up by name first
        assert all(entry.success for entry in rows.values())
        assert stats["import_rows_in_two_imports"] == 0
        return
    # the job never got its data, so it never ran: its rows fail, saying why, for retry-failed
    assert stats["bulk_rows_processed"] == 0
    assert not any(r["method"] in ("PUT", "PATCH") for r in result.requests)
    why = "no job id" if hostile == "" else "is not one URL path segment"
    for entry in rows.values():
        assert not entry.success and why in (entry.error or ""), entry.error
    assert not job_ledgers(result.run.journal_path)  # no hostile id journaled


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("body", ["<html>", {"no": "state"}, {"state": 7}, ["JobComplete"]])
async def test_a_poll_answer_that_cannot_be_read_is_asked_again(tmp_path: Path, kind: str, body: Any) -> None:
    """It says nothing of the job's outcome: the job is polled on, as after a 500, and no row fails."""
    plan = {"rules": [{"match": POLLS[kind], "status": 200, "body": body, "times": 1}]}
    result, stats = await _run(tmp_path, kind, plan)
    assert result.outcome.stop_reason is None, result.outcome
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3] and all(entry.success for entry in rows.values()), result.entries
    if kind != "named_import":
        assert stats["bulk_rows_processed"] == 3 and stats["bulk_rows_in_two_jobs"] == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_polls_that_never_can_be_read_stop_resumably_at_max_wait(tmp_path: Path, kind: str) -> None:
    plan = {"rules": [{"match": POLLS[kind], "status": 200, "body": "<html>"}]}
    poll = {"first_seconds": 0.01, "max_seconds": 0.02, "max_wait": "300ms"}
    result, _ = await _run(tmp_path, kind, plan, poll=poll)
    assert result.outcome.stop_reason is StopReason.TIMEOUT
    assert result.entries == []  # nothing journaled: resume polls the same job on
    (ledger,) = job_ledgers(result.run.journal_path).values()
    assert not ledger.ended and ledger.remote


@pytest.mark.parametrize("kind", KINDS)
async def test_a_results_answer_that_cannot_be_read_is_asked_again(tmp_path: Path, kind: str) -> None:
    results = "/errors" if kind == "named_import" else "/successfulResults"
    plan = {"rules": [{"match": {"method": "GET", "path_contains": results}, "body": "<html>", "times": 2}]}
    result, _ = await _run(tmp_path, kind, plan)
    assert result.outcome.stop_reason is None, result.outcome
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3] and all(entry.success for entry in rows.values()), result.entries


@pytest.mark.parametrize("kind", ["salesforce_bulk2", "generic"])
async def test_a_job_id_with_query_characters_is_sent_as_one_encoded_segment(
    tmp_path: Path, kind: str
) -> None:
    made = {"match": MAKES[kind], "times": 1, "body": {"id": "750?x=1#y z", "state": "Open"}}
    result, _ = await _run(tmp_path, kind, {"rules": [made]})
    (first_upload, *_) = [r for r in result.requests if r["method"] == "PUT"]
    assert first_upload["raw_path"] == "/services/data/v62.0/jobs/ingest/750%3Fx%3D1%23y%20z/batches"
    assert first_upload["query"] == ""
    # the target knows no such job: the upload is refused, the job abandoned, its rows in another
    assert result.outcome.stop_reason is None and all(entry.success for entry in result.entries)
    assert sorted(result.by_row()) == [1, 2, 3]


async def test_an_import_submit_answered_without_an_id_is_looked_up_by_name_whatever_the_list_says(
    tmp_path: Path,
) -> None:
    """The import may have been made: its name is looked for in the list (a page of the wrong types is
    asked again) before its rows go in another import."""
    submit = {"match": MAKES["named_import"], "times": 1, "status": 200, "body": "<html>"}
    listed = {"match": {"method": "GET", "path_contains": "/crm/v3/imports"}, "times": 1}
    plan = {"rules": [submit, {**listed, "body": {"results": [], "paging": ["x"]}}]}
    result, stats = await _run(tmp_path, "named_import", plan)
    assert result.outcome.stop_reason is None, result.outcome
    assert sorted(result.by_row()) == [1, 2, 3] and all(entry.success for entry in result.entries)
    lists = [r for r in result.requests if r["method"] == "GET" and r["path"] == "/crm/v3/imports"]
    assert len(lists) >= 2 and lists[0]["status"] == 200  # the page of the wrong types, then asked again
    assert stats["import_rows_in_two_imports"] == 0
