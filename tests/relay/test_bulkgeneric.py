"""`request.bulk_job` with `kind: generic`: the steps as request templates, configured to speak the
embedded target's Salesforce-like ingest API (demo/bulktarget.py), which proves the templates: create,
upload, close, status and three result sets, each row's outcome matched by key."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bulkrelay.demo.target import start_target
from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.config import load_job
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.bulkrun import FAST_POLL, GENERIC_STEPS, run_bulk_job, write_bulk_job

pytestmark = pytest.mark.anyio

NAMES = ["ann", "bob", "bogus-cy", "dan", "later-eve", "fay"]


def write_generic_job(tmp_path: Path, url: str, **bulk: Any) -> Path:
    job = write_bulk_job(tmp_path, url, NAMES, kind="generic", steps=GENERIC_STEPS, **bulk)
    spec = yaml.safe_load(job.read_text())
    for key in ("object", "operation", "external_id_field"):
        del spec["request"]["bulk_job"][key]
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


async def test_generic_steps_speak_the_salesforce_like_api_row_by_row(tmp_path: Path) -> None:
    polls = {"method": "GET", "path_contains": "/jobs/ingest/"}
    plan = {"bulk": {"fail_job_every": 3}, "rules": [{"match": polls, "times": 2, "status": 503}]}
    target = await start_target(plan)
    relayed = RelayStats()
    try:
        job = write_generic_job(tmp_path, target.url)
        result = await run_bulk_job(job, target, stats=relayed)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    for number in (1, 2, 4):
        captured = rows[number].captured
        assert rows[number].success and captured is not None and captured["sf__Id"].startswith("003")
    assert rows[3].error == "INVALID_FIELD:bad value in k3-bogus-cy"
    # the unprocessed row went in a later job; the third job closed Failed, its rows fail with its error
    ledgers = job_ledgers(result.run.journal_path)
    assert [ledger.rows for ledger in ledgers.values()] == [[1, 2, 3, 4], [5, 6], [5]]
    assert ledgers[3].state == "Failed" and "InvalidBatch" in (rows[5].error or "")
    assert rows[6].success and stats["bulk_rows_in_two_jobs"] == 0
    # the metrics count polls (the 503s asked again included) apart from the other steps
    state_gets = [r for r in result.requests if r["method"] == "GET" and r["path"][-1].isdigit()]
    assert relayed.bulk_polls == len(state_gets) >= 3 * 2 + 2
    assert relayed.bulk_steps == len(result.requests) - len(state_gets)
    # ... and every step is one of the run's requests, by its status (the summary's `requests` said 0)
    counted = relayed.request_counts()
    assert counted.sent == len(result.requests) and counted.by_status["503"] == 2 and counted.retries == 2
    assert counted.by_status == dict(Counter(str(r["status"]) for r in result.requests))


async def test_a_generic_job_stuck_past_max_wait_stops_resumably(tmp_path: Path) -> None:
    target = await start_target({"bulk": {"stuck": True}})
    poll = {**FAST_POLL, "max_wait": "200ms"}
    try:
        job = write_generic_job(tmp_path, target.url, poll=poll)
        result = await run_bulk_job(job, target)
    finally:
        await target.stop()
    assert result.outcome.stop_reason is StopReason.TIMEOUT and result.entries == []
    assert [ledger.events for ledger in job_ledgers(result.run.journal_path).values()] == [
        ["created", "uploaded", "closed"]
    ]


def test_generic_needs_its_steps_and_pointers(tmp_path: Path) -> None:
    job = write_generic_job(tmp_path, "http://127.0.0.1:9")
    spec = yaml.safe_load(job.read_text())
    del spec["request"]["bulk_job"]["steps"]["status"]["state"]
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigInvalid, match="status needs state"):
        load_job(job)
