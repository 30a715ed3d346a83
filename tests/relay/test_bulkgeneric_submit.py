"""`kind: generic` without `create`: the upload makes the job, its rows in the request (Mailchimp's
`POST /3.0/batches` with its operations), against the embedded target's batches API
(demo/batchopstarget.py). The job file must say `resubmit: safe`: `submitting` (the rows' keys) is
journaled before the request and `created` (the id) after its answer, and a job lost between the two
has its rows submitted again (at-least-once), each row still journaled once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bulkrelay.demo.target import start_target
from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.store.journal.jobrecords import encode_job_record, job_ledgers, read_job_records
from bulkrelay.store.rundir import RunDir
from tests.relay.bulkrun import run_bulk_job, write_batches_job

pytestmark = pytest.mark.anyio

NAMES = ["ann", "bob", "bogus-cy", "dan", "eve", "fay"]


async def test_the_upload_makes_the_job_its_rows_in_the_request(tmp_path: Path) -> None:
    target = await start_target({"batch_ops": {"members_size": 2}})
    try:
        job = write_batches_job(tmp_path, target.url, NAMES, submit=True)
        result = await run_bulk_job(job, target)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3, 4, 5, 6]
    assert [rows[n].success for n in range(1, 7)] == [True, True, False, True, True, True]
    ledgers = job_ledgers(result.run.journal_path)
    assert [ledger.rows for ledger in ledgers.values()] == [[1, 2, 3, 4], [5, 6]]
    assert {tuple(ledger.events) for ledger in ledgers.values()} == {
        ("created", "uploaded", "closed", "state", "results")  # `submitting` folded into `created`
    }
    events = [
        record["event"] for record in read_job_records(result.run.journal_path) if record["bulk_job"] == 1
    ]
    assert events[:2] == ["submitting", "created"]  # the keys durable before the request, the id after
    submits = [r for r in result.requests if r["method"] == "POST"]
    assert len(submits) == 2 and not [r for r in result.requests if r["method"] == "PUT"]
    assert stats["batch_ops"]["created"] == 2 and stats["batch_ops_in_two_batches"] == 0


def test_a_job_file_without_create_must_say_resubmit_safe(tmp_path: Path) -> None:
    job = write_batches_job(tmp_path, "http://127.0.0.1:9", NAMES, submit=True)
    spec = yaml.safe_load(job.read_text())
    del spec["request"]["bulk_job"]["steps"]["resubmit"]
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigInvalid, match="Say resubmit: safe if the target may apply them twice"):
        load_job(job)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["upload"].update(path="/batches/{job}"), "its path has no {job}"),
        (lambda s: s["upload"].pop("id"), "create \\(or, without it, upload\\) needs id"),
        (
            lambda s: s.update(create={"method": "POST", "path": "/b", "id": "/id"}),
            "go with an upload that makes the job",
        ),
    ],
)
def test_an_upload_that_makes_the_job_is_refused_when_incoherent(
    tmp_path: Path, change: Any, message: str
) -> None:
    job = write_batches_job(tmp_path, "http://127.0.0.1:9", NAMES, submit=True)
    spec = yaml.safe_load(job.read_text())
    change(spec["request"]["bulk_job"]["steps"])
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigInvalid, match=message):
        load_job(job)


async def test_a_job_lost_between_its_submit_and_its_id_has_its_rows_submitted_again(tmp_path: Path) -> None:
    """A crash after the submit landed but before `created` was journaled: the batch cannot be found
    again, so resume abandons it (`aborted`, saying why) and its rows go in a new batch. The target
    runs them twice (what resubmit: safe accepts); the journal has each row once."""
    target = await start_target({})
    try:
        job = write_batches_job(tmp_path, target.url, NAMES, submit=True)
        keys = [f"k{n}-{name}" for n, name in enumerate(NAMES[:4], start=1)]
        operations = [{"operation_id": key, "method": "PUT", "path": "/lists/abc/members"} for key in keys]
        async with httpx.AsyncClient() as client:  # the earlier process's submit, which landed
            await client.post(f"{target.url}/3.0/batches", json={"operations": operations})
        preflight = run_preflight(load_job(job), None, env={"SF_TOKEN": "t"})
        run = RunDir.create(tmp_path / "runs", plan_for(preflight))
        run.journal_path.write_bytes(encode_job_record(1, "submitting", rows=[[1, 4]], keys=keys))
        result = await run_bulk_job(job, target, run=run)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None
    assert sorted(entry.row_number for entry in result.entries) == [1, 2, 3, 4, 5, 6]  # each row once
    ledgers = job_ledgers(result.run.journal_path)
    assert ledgers[1].events == ["submitting", "aborted"] and ledgers[1].remote == ""
    aborted = [r for r in read_job_records(result.run.journal_path) if r["bulk_job"] == 1][-1]
    assert "its id was never journaled: its rows are submitted again" in aborted["why"]
    assert ledgers[2].rows == [1, 2, 3, 4]  # submitted again, at least once
    assert stats["batch_ops_in_two_batches"] == 4


async def test_a_refused_submit_is_abandoned_and_its_rows_go_in_another_job(tmp_path: Path) -> None:
    refused = {"match": {"method": "POST", "path_contains": "/3.0/batches"}, "times": 1, "status": 400}
    target = await start_target({"rules": [refused]})
    try:
        job = write_batches_job(tmp_path, target.url, NAMES, submit=True)
        result = await run_bulk_job(job, target)
    finally:
        await target.stop()
    rows = result.by_row()
    assert sorted(rows) == [1, 2, 3, 4, 5, 6] and rows[1].success
    ledgers = job_ledgers(result.run.journal_path)
    assert ledgers[1].events == ["submitting", "aborted"] and ledgers[2].rows == [1, 2, 3, 4]
    aborted = [r for r in read_job_records(result.run.journal_path) if r["bulk_job"] == 1][-1]
    assert aborted["why"].startswith("the submit failed: upload answered 400")


async def test_the_mailchimp_example_runs_against_the_demo_target(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "bulk-jobs" / "mailchimp.yaml"
    target = await start_target({})
    try:
        env = {"MC_BASE": f"{target.url}/3.0", "MC_ACCESS_TOKEN": "demo"}
        result = await run_bulk_job(example, target, runs=tmp_path / "runs", env=env)
    finally:
        await target.stop()
    failed = {entry.key: entry.error for entry in result.entries if not entry.success}
    assert len(result.entries) == 6 and list(failed) == ["M-0004-bogus-dan"]
    assert "bad value in M-0004-bogus-dan" in (failed["M-0004-bogus-dan"] or "")
    submitted = [r for r in result.requests if r["method"] == "POST"]
    assert (
        len(submitted) == 2 and '"body":"{\\"email_address\\":\\"ann@example.com\\"' in submitted[0]["body"]
    )
