"""`request.bulk_job` (salesforce_bulk2) in-process against the embedded target's ingest API: jobs formed
in input order, results shuffled and matched by key, failed and unprocessed rows, hostile answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from bulkrelay.demo.target import start_target
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay import stopping
from bulkrelay.relay.progress import CallbackReporter, JobCounts, Snapshot
from bulkrelay.relay.stopping import IdleWatchdog, StopReason
from bulkrelay.store.journal.jobrecords import encode_job_record, job_ledgers
from bulkrelay.store.rundir import RunDir
from tests.relay.batchrun import BatchRun
from tests.relay.bulkrun import SHORT_WAIT, assert_stopped_unread, run_bulk_job, write_bulk_job

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


async def _run_against(tmp_path: Path, plan: dict[str, Any], names: list[str], **bulk: Any) -> BatchRun:
    target = await start_target(plan)
    try:
        return await run_bulk_job(write_bulk_job(tmp_path, target.url, names, **bulk), target)
    finally:
        await target.stop()


async def test_polls_answered_503_and_429_with_retry_after_are_asked_again(tmp_path: Path) -> None:
    polls = {"method": "GET", "path_contains": "/jobs/ingest/"}
    plan = {
        "rules": [
            {"match": polls, "times": 2, "status": 503, "retry_after": "0"},
            {"match": polls, "times": 2, "status": 429, "retry_after": "0"},
        ]
    }
    result = await _run_against(tmp_path, plan, ["ann", "bob", "cy"])
    assert result.outcome.stop_reason is None
    assert [entry.success for entry in result.entries] == [True, True, True]
    statuses = [r["status"] for r in result.requests if r["method"] == "GET"]
    assert statuses[:4] == [503, 503, 429, 429] and statuses[-1] == 200


async def test_a_failed_job_fails_its_rows_with_its_error_message(tmp_path: Path) -> None:
    result = await _run_against(tmp_path, {"bulk": {"fail_job_every": 2}}, ["a", "b", "c", "d", "e", "f"])
    rows = result.by_row()
    assert all(rows[n].success for n in (1, 2, 3, 4))
    for n in (5, 6):
        assert not rows[n].success and rows[n].classification == "http_client_error"
        assert "Failed: InvalidBatch" in (rows[n].error or "")


@pytest.mark.parametrize(
    ("plan", "error"),
    [
        ({"hostile_results": "unknown_key"}, "names key 'never-sent', which job 750"),
        ({"forget_jobs": True}, "poll answered 404: the target does not know job 750"),
    ],
)
async def test_hostile_answers_fail_the_jobs_rows_clearly_and_lose_none(
    tmp_path: Path, plan: dict[str, Any], error: str
) -> None:
    result = await _run_against(tmp_path, {"bulk": plan}, ["ann", "bob", "cy", "dan", "eve"])
    assert result.outcome.stop_reason is None
    assert sorted(result.by_row()) == [1, 2, 3, 4, 5]  # every row journaled, once
    assert all(not entry.success and error in (entry.error or "") for entry in result.entries)


async def test_a_result_file_cut_short_is_asked_again_and_never_fails_the_rows(tmp_path: Path) -> None:
    """The job ran: a result file that cannot be read says nothing of its rows, which would be sent
    again by retry-failed if they failed. It is asked again until max_wait, then the call stops."""
    plan = {"bulk": {"hostile_results": "truncated"}}
    result = await _run_against(tmp_path, plan, ["ann", "bob"], poll=SHORT_WAIT)
    assert_stopped_unread(result, "successfulResults: the result file is truncated")
    fetches = [r for r in result.requests if r["path"].endswith("/successfulResults")]
    assert len(fetches) > 1  # asked again


async def test_a_job_stuck_in_progress_past_max_wait_stops_resumably(tmp_path: Path) -> None:
    poll = {"first_seconds": 0.01, "max_seconds": 0.02, "max_wait": "300ms"}
    result = await _run_against(tmp_path, {"bulk": {"stuck": True}}, ["ann", "bob"], poll=poll)
    assert result.outcome.stop_reason is StopReason.TIMEOUT
    assert result.entries == []  # nothing journaled as done
    (ledger,) = job_ledgers(result.run.journal_path).values()
    assert ledger.events == ["created", "uploaded", "closed"] and not ledger.ended


async def _earlier_job(url: str, csv: bytes, *, then: str | None) -> str:
    """A job an earlier process made and loaded, then maybe closed or aborted (`then`), before it died."""
    jobs = f"{url}/services/data/v62.0/jobs/ingest"
    async with httpx.AsyncClient() as client:
        remote = (await client.post(jobs, json={"object": "Contact"})).json()["id"]
        await client.put(f"{jobs}/{remote}/batches", content=csv)
        if then is not None:
            await client.patch(f"{jobs}/{remote}", json={"state": then})
    return str(remote)


@pytest.mark.parametrize("then", ["UploadComplete", None, "Aborted"])
async def test_the_journals_unfinished_job_is_attached_to_before_any_new_one(
    tmp_path: Path, then: str | None
) -> None:
    """A closed job is polled and its results fetched, never submitted again; an Open one is aborted
    and its rows go in a new job, as do those of one whose abort landed but whose `aborted` record was
    lost: it never ran (its rows never failed as `Aborted`)."""
    closed = then == "UploadComplete"
    names = ["ann", "bob", "cy", "dan", "eve", "fay"]
    target = await start_target({})
    try:
        job = write_bulk_job(tmp_path, target.url, names)
        csv = b"External_Id__c,Email\n" + b"".join(
            b"k%d-%s,%s@example.com\n" % (n, s.encode(), s.encode()) for n, s in enumerate(names[:4], 1)
        )
        remote = await _earlier_job(target.url, csv, then=then)
        preflight = run_preflight(load_job(job), None, env={"SF_TOKEN": "t"})
        run = RunDir.create(tmp_path / "runs", plan_for(preflight))
        keys = [f"k{n}-{s}" for n, s in enumerate(names[:4], 1)]
        records = [encode_job_record(1, "created", remote=remote, rows=[[1, 4]], keys=keys)]
        records += [encode_job_record(1, "uploaded")] + ([encode_job_record(1, "closed")] if closed else [])
        run.journal_path.write_bytes(b"".join(records))
        snapshots: list[Snapshot] = []
        result = await run_bulk_job(job, target, run=run, reporter=CallbackReporter(snapshots.append))
    finally:
        await target.stop()
    assert sorted(result.by_row()) == [1, 2, 3, 4, 5, 6] and all(e.success for e in result.entries)
    jobs = snapshots[-1].jobs
    assert jobs is not None and jobs.aborted == (0 if closed else 1)  # the progress counts the job it gave up
    stats = target.state.stats()
    assert stats["bulk_rows_in_two_jobs"] == 0 and stats["bulk_rows_processed"] == 6
    ledgers = job_ledgers(result.run.journal_path)
    assert ledgers[1].events[-1] == ("results" if closed else "aborted")
    assert stats["bulk_jobs"].get("aborted", 0) == (0 if closed else 1)
    new_rows = sorted(row for ledger in list(ledgers.values())[1:] for row in ledger.rows)
    assert new_rows == ([5, 6] if closed else [1, 2, 3, 4, 5, 6])


async def test_the_example_runs_against_the_demo_target(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "bulk-jobs" / "salesforce.yaml"
    target = await start_target({})
    try:
        result = await run_bulk_job(example, target, runs=tmp_path / "runs")
    finally:
        await target.stop()
    failed = {entry.key: entry.error for entry in result.entries if not entry.success}
    assert len(result.entries) == 12 and failed == {
        "C-0006-bogus-fay": "INVALID_FIELD:bad value in C-0006-bogus-fay"
    }


async def test_a_poll_refused_with_a_4xx_fails_the_jobs_rows_and_the_run_goes_on(tmp_path: Path) -> None:
    polls = {"method": "GET", "path_contains": "/jobs/ingest/750000000000000001"}
    plan = {"rules": [{"match": polls, "times": 1, "status": 400}]}
    result = await _run_against(tmp_path, plan, ["ann", "bob", "cy", "dan", "eve"])
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3, 4, 5]
    for n in (1, 2, 3, 4):
        assert not rows[n].success and "poll answered 400" in (rows[n].error or "")
        assert (rows[n].classification, rows[n].status_code) == ("http_client_error", 400)
    assert rows[5].success


async def test_the_progress_shows_jobs_created_processing_and_done_beside_the_rows(tmp_path: Path) -> None:
    snapshots: list[Snapshot] = []
    target = await start_target({"bulk": {"polls_to_complete": 2}})
    try:
        job = write_bulk_job(tmp_path, target.url, NAMES)
        result = await run_bulk_job(job, target, reporter=CallbackReporter(snapshots.append))
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    seen = [snapshot.jobs for snapshot in snapshots]
    assert seen[0] == JobCounts() and seen[-1] == JobCounts(created=3, done=3)
    # each job as it moves on: created (open), then processing once closed, then done with its rows
    assert JobCounts(created=1) in seen and JobCounts(created=1, processing=1) in seen
    assert JobCounts(created=2, processing=1, done=1) in seen
    assert snapshots[-1].to_dict()["jobs"] == {"created": 3, "processing": 0, "done": 3, "aborted": 0}
    assert snapshots[-1].done == 9
    done_at = seen.index(JobCounts(created=1, done=1))
    assert snapshots[done_at].done == 4  # the first job's rows are committed before it counts as done
    # each poll answered moves the run on (the idle watchdog's measure) though no row is committed
    polled = [snapshot.movement for snapshot in snapshots if snapshot.done == 0]
    assert snapshots[-1].jobs is not None and snapshots[-1].jobs.polls >= 3 * 2
    assert len(set(polled)) >= 2, polled


def test_a_poll_answered_is_progress_to_the_idle_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(stopping, "_clock", lambda: now[0])
    watchdog = IdleWatchdog(idle_seconds=300)
    for polls in (1, 2, 3):  # a job working for 15 minutes, no row committed, a poll answered each 5
        now[0] += 300
        watchdog.progressed(Snapshot(10, 0, 0, 0, jobs=JobCounts(created=1, polls=polls)).movement)
        assert watchdog.idle_for() == 0
    now[0] += 300
    watchdog.progressed(Snapshot(10, 0, 0, 0, jobs=JobCounts(created=1, polls=3)).movement)
    assert watchdog.idle_for() == 300  # nothing moved: a stall
