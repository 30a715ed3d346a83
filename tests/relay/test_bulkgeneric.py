"""`request.bulk_job` with `kind: generic`: the steps as request templates, configured to speak the
embedded target's Salesforce-like ingest API (demo/bulktarget.py), which proves the templates: create,
upload, close, status and three result sets, each row's outcome matched by key."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.demo.target import start_target
from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.config import BULK_ANSWER_BYTES, config_semantic_dict, load_job
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.stopping import StopReason
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import Response, Transport, TransportSettings
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.bulkrun import (
    FAST_POLL,
    SHORT_WAIT,
    assert_stopped_unread,
    generic_json_steps,
    run_bulk_job,
    with_poll,
    write_generic_job,
)

pytestmark = pytest.mark.anyio


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


async def test_a_json_upload_of_the_rows_and_json_results_are_matched_by_key(tmp_path: Path) -> None:
    target = await start_target({})
    try:
        job = write_generic_job(tmp_path, target.url)
        spec = yaml.safe_load(job.read_text())
        spec["request"]["bulk_job"]["steps"] = generic_json_steps()
        spec["request"]["bulk_job"]["columns"]["Active"] = {"value": True}
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        result = await run_bulk_job(job, target)
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    for number in (1, 2, 4, 5, 6):  # 5 unprocessed at first, then in a job of its own
        captured = rows[number].captured
        assert rows[number].success and captured is not None and captured["sf__Id"].startswith("003")
    assert (rows[3].classification, rows[3].error) == (
        "item_rejected",
        "INVALID_FIELD:bad value in k3-bogus-cy",
    )
    upload = next(r for r in result.requests if r["method"] == "PUT")
    assert upload["headers"]["Content-Type"] == "application/json"
    records = orjson.loads(upload["body"])["records"]
    assert records[0] == {"External_Id__c": "k1-ann", "Email": "ann@example.com", "Active": True}
    assert [record["External_Id__c"] for record in records] == ["k1-ann", "k2-bob", "k3-bogus-cy", "k4-dan"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["results"][0].update(format="json"), "format: json needs items"),
        (lambda s: s["results"][1].update(format="json", items="/r"), "reads a row's error at error"),
        (lambda s: s["results"][0].update(items="/r"), "items and key go with format: json"),
        (lambda s: s["upload"].update(rows_at="/records"), "json and rows_at go with format: json"),
        (lambda s: s["status"].update(format="json"), "format goes on upload and results"),
    ],
)
def test_json_steps_are_refused_when_incoherent(tmp_path: Path, change: Any, message: str) -> None:
    job = write_generic_job(tmp_path, "http://127.0.0.1:9")
    spec = yaml.safe_load(job.read_text())
    change(spec["request"]["bulk_job"]["steps"])
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigInvalid, match=message):
        load_job(job)


async def test_a_json_result_item_without_a_key_is_asked_again_never_failing_rows(tmp_path: Path) -> None:
    spoiled = {"match": {"path_contains": "successfulResults.json"}, "body": {"records": [{"sf__Id": "003"}]}}
    target = await start_target({"rules": [spoiled]})
    try:
        job = write_generic_job(tmp_path, target.url)
        spec = yaml.safe_load(job.read_text())
        spec["request"]["bulk_job"]["steps"] = generic_json_steps()
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        result = await run_bulk_job(with_poll(job, SHORT_WAIT), target)
    finally:
        await target.stop()
    assert_stopped_unread(result, "an item has no key at /External_Id__c")


class _Cutting:
    """The real transport, its answers to `cut` marked cut at max_body_bytes (as a huge one would be)."""

    def __init__(self, settings: TransportSettings, cut: str) -> None:
        self.settings = settings
        self._inner = open_transport(settings)
        self._cut = cut

    async def send(self, request: PreparedRequest) -> Response:
        answer = await self._inner.send(request)
        return answer._replace(truncated=True) if self._cut in request.url else answer

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_result_answer_cut_at_the_transports_bound_fails_the_jobs_rows(tmp_path: Path) -> None:
    """A bulk run reads answers up to BULK_ANSWER_BYTES (not a row's 1 MiB); one larger still is refused,
    never read as the shorter result set it would seem (its missing rows would go in another job)."""
    made: list[_Cutting] = []

    def cutting(settings: TransportSettings) -> Transport:
        made.append(_Cutting(settings, "successfulResults"))
        return made[-1]

    target = await start_target({})
    try:
        job = write_generic_job(tmp_path, target.url)
        result = await run_bulk_job(job, target, transport_factory=cutting)
    finally:
        await target.stop()
    assert made[0].settings.max_body_bytes == BULK_ANSWER_BYTES
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    assert {entry.classification for entry in rows.values()} == {"batch_answer_invalid"}
    assert "successfulResults answered 200: the answer is larger than" in (rows[1].error or "")


def test_a_generic_job_written_before_the_later_settings_keeps_its_fingerprint(tmp_path: Path) -> None:
    """pages, status, archive, its bounds, url_at, unlisted and resubmit, left unset, are not in the
    fingerprint (nor a delta row's digest): a run begun before them resumes, a delta night resends nothing."""
    job = write_generic_job(tmp_path, "http://127.0.0.1:9")
    steps = config_semantic_dict(load_job(job).config)["request"]["bulk_job"]["steps"]
    assert not {"unlisted", "resubmit"} & set(steps)
    later = {"pages", "status", "archive", "max_members", "max_unpacked_bytes", "url_at"}
    assert not any(later & set(step) for step in [*steps["results"], steps["create"], steps["upload"]])
    spec = yaml.safe_load(job.read_text())
    spec["request"]["bulk_job"]["steps"]["unlisted"] = "success"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert config_semantic_dict(load_job(job).config)["request"]["bulk_job"]["steps"]["unlisted"] == "success"
