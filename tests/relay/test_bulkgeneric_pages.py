"""`kind: generic` JSON result sets over several pages (`results[].pages`), against the embedded target's
ingest API serving its JSON results `results_page_size` records a page (demo/bulktarget.py): the next
page by a pointer or the Link header, every page's items matched by key, the hostile pagers (a loop, a
key in two pages, a key never sent, more pages than max_pages) failing the job's rows clearly, and a page
that is not JSON asked again. A run halted mid-paging fetches every page again on resume: no row lost or
doubled."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bulkrelay.demo.target import start_target
from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.config import load_job
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.batchrun import BatchRun
from tests.relay.bulkrun import (
    SHORT_WAIT,
    assert_stopped_unread,
    generic_json_steps,
    run_bulk_job,
    with_poll,
    write_generic_job,
)

pytestmark = pytest.mark.anyio

NEXT = {"next": "/nextRecordsUrl"}
NAMES = ["ann", "bob", "bogus-cy", "dan", "later-eve", "fay", "gus", "hal", "ida"]


def paged_job(tmp_path: Path, url: str, pages: dict[str, Any], *, names: list[str] = NAMES) -> Path:
    """The JSON generic job, every result set paged as `pages` says, max_rows 6."""
    job = write_generic_job(tmp_path, url, names, max_rows=6)
    spec = yaml.safe_load(job.read_text())
    steps = generic_json_steps()
    for result_set in steps["results"]:
        result_set["pages"] = dict(pages)
    spec["request"]["bulk_job"]["steps"] = steps
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


async def _run(
    tmp_path: Path, bulk: dict[str, Any], pages: dict[str, Any]
) -> tuple[BatchRun, dict[str, Any]]:
    target = await start_target({"bulk": bulk})
    try:
        result = await run_bulk_job(paged_job(tmp_path, target.url, pages), target)
        return result, target.state.stats()
    finally:
        await target.stop()


@pytest.mark.parametrize(
    ("links", "pages"), [("body", {"next": "/nextRecordsUrl"}), ("header", {"max_pages": 10})]
)
async def test_every_page_of_a_result_set_is_matched_by_key(
    tmp_path: Path, links: str, pages: dict[str, Any]
) -> None:
    result, stats = await _run(tmp_path, {"results_page_size": 2, "page_links": links}, pages)
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == list(range(1, len(NAMES) + 1))  # each row once
    for number, name in enumerate(NAMES, start=1):
        entry = rows[number]
        if name.startswith("bogus"):
            assert (entry.classification, entry.error) == (
                "item_rejected",
                "INVALID_FIELD:bad value in k3-bogus-cy",
            )
        else:  # later-eve: unprocessed at first, then in a job of its own
            assert entry.success and entry.captured is not None and entry.captured["sf__Id"].startswith("003")
    # each job's 4 successes came in 2 pages, the second asked at the URL the first gave
    for ledger in job_ledgers(result.run.journal_path).values():
        asked = [
            r["query"] for r in result.requests if f"{ledger.remote}/successfulResults.json" in r["path"]
        ]
        assert asked == ["", "page=2"]
    assert stats["bulk_rows_in_two_jobs"] == 0


@pytest.mark.parametrize(
    ("bulk", "pages", "message"),
    [
        ({"hostile_pages": "loop"}, NEXT, "page 5 would be page 2 again: the pages loop"),
        ({"hostile_pages": "repeat_key"}, NEXT, "twice in job 750"),
        ({"hostile_results": "unknown_key"}, NEXT, "'never-sent', which job 750"),
        ({}, {**NEXT, "max_pages": 2}, "has more than max_pages (2) pages"),
    ],
)
async def test_a_hostile_pager_fails_the_jobs_rows_clearly(
    tmp_path: Path, bulk: dict[str, Any], pages: dict[str, Any], message: str
) -> None:
    result, _ = await _run(tmp_path, {"results_page_size": 1, **bulk}, pages)
    assert result.outcome.stop_reason is None
    rows = result.by_row()
    assert sorted(rows) == list(range(1, len(NAMES) + 1))
    first_job = [rows[number] for number in range(1, 7)]  # the job whose successes are paged badly
    assert {entry.classification for entry in first_job} == {"batch_answer_invalid"}
    assert all(message in (entry.error or "") for entry in first_job), first_job[0].error


async def test_a_page_that_is_not_json_is_asked_again_from_the_first_page(tmp_path: Path) -> None:
    target = await start_target({"bulk": {"results_page_size": 1, "hostile_pages": "not_json"}})
    try:
        job = with_poll(paged_job(tmp_path, target.url, NEXT), SHORT_WAIT)
        result = await run_bulk_job(job, target)
    finally:
        await target.stop()
    assert_stopped_unread(result, "successfulResults.json, page 2 answered 200: the answer is not JSON")
    firsts = [r for r in result.requests if r["path"].endswith("/successfulResults.json") and not r["query"]]
    assert len(firsts) > 1  # every page asked again, from the first


async def test_a_run_halted_mid_paging_fetches_every_page_again_on_resume(tmp_path: Path) -> None:
    """Results are journaled only once every page is read: a halt on page 2 (a 403) journals none of
    the job's rows; resume attaches to the job, reads every page again, and journals each row once."""
    pager = {"method": "GET", "path_contains": "successfulResults.json"}
    refusal = {"match": pager, "after": 1, "status": 403}
    plan = {"bulk": {"results_page_size": 2}, "rules": [refusal]}
    target = await start_target(plan)
    try:
        job = paged_job(tmp_path, target.url, NEXT, names=NAMES[:6])
        first = await run_bulk_job(job, target)
        assert first.outcome.stop_reason is StopReason.HALT_AUTH and first.entries == []
        (ledger,) = job_ledgers(first.run.journal_path).values()
        assert ledger.state == "JobComplete" and not ledger.ended
        target.state.set_plan({"bulk": {"results_page_size": 2}})  # the credentials are fixed
        before = len(first.requests)
        again = await run_bulk_job(job, target, run=first.run)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert again.outcome.stop_reason is None
    numbers = Counter(entry.row_number for entry in again.entries)
    assert sorted(numbers) == [1, 2, 3, 4, 5, 6] and set(numbers.values()) == {1}
    resumed = again.requests[before:]
    successes = [r["query"] for r in resumed if f"{ledger.remote}/successfulResults.json" in r["path"]]
    assert successes == ["", "page=2"]  # every page again, the first included
    assert stats["bulk_jobs"]["created"] == 2 and stats["bulk_rows_in_two_jobs"] == 0  # later-eve's own job


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["results"][0].update(pages={"next": "/n"}),
            "pages, status and archive go with format: json",
        ),
        (lambda s: s["status"].update(pages={}), "pages, status, archive, .* go on results"),
    ],
)
def test_pages_are_refused_where_they_do_not_fit(tmp_path: Path, change: Any, message: str) -> None:
    job = write_generic_job(tmp_path, "http://127.0.0.1:9")
    spec = yaml.safe_load(job.read_text())
    change(spec["request"]["bulk_job"]["steps"])
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ConfigInvalid, match=message):
        load_job(job)
