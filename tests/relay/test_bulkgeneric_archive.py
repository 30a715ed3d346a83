"""`kind: generic` results served as a gzip'd tar of JSON files (`archive: tar.gz`, the URL at `url_at`
in the status answer, each item's own `status`), against the embedded target's Mailchimp-batches-like
API (demo/batchopstarget.py): each operation's result matched by its operation_id, a 4xx or 5xx failing
its row with the response, the hostile archives (a key never sent, a bomb over max_unpacked_bytes or
max_members) failing the job's rows clearly, and those that cannot be read (cut short, corrupt, a member
not JSON) asked again, never failing rows of a batch that ran. Also `unlisted:
success`, for an API that lists only its failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.demo.target import start_target
from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.config import load_job
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import Response, TransportSettings
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.batchrun import BatchRun
from tests.relay.bulkrun import (
    SHORT_WAIT,
    assert_stopped_unread,
    run_bulk_job,
    with_poll,
    write_batches_job,
    write_generic_job,
)

pytestmark = pytest.mark.anyio

NAMES = ["ann", "bob", "bogus-cy", "dan", "broken-eve", "fay", "gus"]


async def _run(
    tmp_path: Path, plan: dict[str, Any], poll: dict[str, Any] | None = None, **archived: Any
) -> tuple[BatchRun, dict[str, Any]]:
    target = await start_target(plan)
    try:
        job = write_batches_job(tmp_path, target.url, NAMES, **archived)
        result = await run_bulk_job(job if poll is None else with_poll(job, poll), target)
        return result, target.state.stats()
    finally:
        await target.stop()


async def test_each_operations_result_in_the_archive_is_matched_by_its_operation_id(tmp_path: Path) -> None:
    result, stats = await _run(tmp_path, {"batch_ops": {"members_size": 2}})
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == list(range(1, len(NAMES) + 1))  # each row once
    for number, name in enumerate(NAMES, start=1):
        entry, key = rows[number], f"k{number}-{name}"
        if name.startswith("bogus"):  # a 400: its row fails with the operation's response
            assert entry.classification == "item_rejected"
            assert orjson.loads(entry.error or "")["detail"] == f"bad value in {key}"
        elif name.startswith("broken"):  # a 500 fails its row too
            assert not entry.success and "Internal Server Error" in (entry.error or "")
        else:
            assert entry.success and entry.captured is not None
            assert orjson.loads(entry.captured["response"])["id"] == f"m-{key}"
    assert [ledger.rows for ledger in job_ledgers(result.run.journal_path).values()] == [
        [1, 2, 3, 4],
        [5, 6, 7],
    ]
    assert stats["batch_ops_in_two_batches"] == 0 and stats["batch_ops"]["finished"] == 2
    # the archive is on base_url's origin: asked with the job's credentials, as every step
    archives = [r for r in result.requests if "/batch-archives/" in r["path"]]
    assert len(archives) == 2 and all(r["headers"]["Authorization"] == "Bearer tok-secret" for r in archives)
    uploads = [orjson.loads(r["body"]) for r in result.requests if r["method"] == "PUT"]
    assert uploads[0]["operations"][0] == {
        "operation_id": "k1-ann",
        "method": "PUT",
        "path": "/lists/abc/members",
        "body": "ann@example.com",
    }


@pytest.mark.parametrize(
    ("hostile", "archived", "message"),
    [
        ("unknown_key", {}, "names key 'never-sent', which job mc00000001 was never sent"),
        ("bomb", {"max_unpacked_bytes": 65536}, "unpacks to more than max_unpacked_bytes (65536) bytes"),
        ("many_members", {"max_members": 3}, "has more than max_members (3) members: refused as a bomb"),
    ],
)
async def test_a_hostile_archive_fails_the_jobs_rows_clearly(
    tmp_path: Path, hostile: str, archived: dict[str, Any], message: str
) -> None:
    plan = {"batch_ops": {"members_size": 2, "hostile_archive": hostile}}
    result, _ = await _run(tmp_path, plan, **archived)
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == list(range(1, len(NAMES) + 1))
    first_job = [rows[number] for number in range(1, 5)]
    assert {entry.classification for entry in first_job} == {"batch_answer_invalid"}
    assert all(message in (entry.error or "") for entry in first_job), first_job[0].error
    assert "mc00000001" in (first_job[0].error or "")  # the job is named


@pytest.mark.parametrize(
    ("hostile", "message"),
    [
        ("truncated", "job mc00000001's archive is not a whole tar.gz"),
        ("corrupt", "job mc00000001's archive is not a whole tar.gz"),
        ("not_json", "results, archive member 2: job mc00000001's archive member is not JSON"),
    ],
)
async def test_an_archive_that_cannot_be_read_is_asked_again_and_never_fails_the_rows(
    tmp_path: Path, hostile: str, message: str
) -> None:
    plan = {"batch_ops": {"members_size": 2, "hostile_archive": hostile}}
    result, _ = await _run(tmp_path, plan, SHORT_WAIT)
    assert_stopped_unread(result, message)


class _FileStore:
    """The real transport, a request to https://files.example sent to the target instead (a stand-in for
    the file store a real archive is on), as the relay made it."""

    def __init__(self, settings: TransportSettings, target_url: str) -> None:
        self._inner = open_transport(settings)
        self._target = target_url

    async def send(self, request: PreparedRequest) -> Response:
        if request.url.startswith(_FILES):
            request = request._replace(url=self._target + request.url.removeprefix(_FILES))
        return await self._inner.send(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


_FILES = "https://files.example"


async def test_an_archive_on_another_origin_is_asked_without_the_jobs_credentials(tmp_path: Path) -> None:
    target = await start_target({"batch_ops": {"archive_origin": _FILES}})
    try:
        job = write_batches_job(tmp_path, target.url, NAMES)
        result = await run_bulk_job(job, target, transport_factory=lambda s: _FileStore(s, target.url))
    finally:
        await target.stop()
    rows = result.by_row()
    assert sorted(rows) == list(range(1, len(NAMES) + 1)) and rows[1].success
    archives = [r for r in result.requests if "/batch-archives/" in r["path"]]
    assert len(archives) == 2
    assert all("Authorization" not in r["headers"] for r in archives)  # the job's token stays with its API
    polls = [r for r in result.requests if r["method"] == "GET" and "/3.0/batches/" in r["path"]]
    assert all(r["headers"]["Authorization"] == "Bearer tok-secret" for r in polls)


async def test_a_status_answer_without_the_results_url_is_asked_again(tmp_path: Path) -> None:
    finished = {
        "match": {"method": "GET", "path_contains": "/3.0/batches/mc"},
        "body": {"status": "finished"},
    }
    result, _ = await _run(tmp_path, {"rules": [finished]}, SHORT_WAIT)
    assert_stopped_unread(result, "status answer has no URL at /response_body_url")


async def test_unlisted_success_takes_rows_named_in_no_result_as_succeeded(tmp_path: Path) -> None:
    """An API that lists only its failures (Klaviyo's import errors): the other rows succeeded."""
    target = await start_target({})
    names = ["ann", "bob", "bogus-cy", "dan"]
    try:
        job = write_generic_job(tmp_path, target.url, names)
        spec = yaml.safe_load(job.read_text())
        steps = spec["request"]["bulk_job"]["steps"]
        steps["results"] = [steps["results"][1]]  # failedResults alone
        steps["unlisted"] = "success"
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        result = await run_bulk_job(job, target)
    finally:
        await target.stop()
    rows = result.by_row()
    assert [rows[n].success for n in (1, 2, 3, 4)] == [True, True, False, True]
    assert rows[1].captured == {} and rows[3].error == "INVALID_FIELD:bad value in k3-bogus-cy"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(format="csv", items=None, key=None), "pages, status and archive go with format"),
        (
            lambda r: r.update(max_members=5, archive=None),
            "max_members and max_unpacked_bytes go with archive",
        ),
        (lambda r: r.update(error=None), "status needs error"),
        (lambda r: r.update(path="/x"), "each has a path, or url_at"),
        (lambda r: r.update(outcome="success"), "outcome .* or status .* not both"),
        (lambda r: r.update(pages={}), "an archive is one file"),
    ],
)
def test_archived_results_are_refused_when_incoherent(tmp_path: Path, change: Any, message: str) -> None:
    job = write_batches_job(tmp_path, "http://127.0.0.1:9", NAMES)
    spec = yaml.safe_load(job.read_text())
    result_set = spec["request"]["bulk_job"]["steps"]["results"][0]
    change(result_set)
    for name in [name for name, value in result_set.items() if value is None]:
        del result_set[name]
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigInvalid, match=message):
        load_job(job)
