"""`kind: generic`: a bulk job's steps as request templates, for an API neither preset fits.

    steps.create    {method, path, json}  -> the job's id at the JSON pointer `id`; without it the upload
                                          makes the job (its id at the upload's `id`), which the job file
                                          allows with `resubmit: safe` (the driver journals `submitting`)
    steps.upload    {method, path}        the job's CSV, once (text/csv); with `format: json` the rows as
                                          JSON objects, their list at `rows_at` in `json` (or the body)
    steps.close     {method, path, json}  optional: without it the upload closes the job
    steps.abort     {method, path, json}  optional: without it an unclosed job is left open (never runs)
    steps.status    {method, path}        the job's state at the pointer `state` (`error`: a failed one's)
    steps.results   [{method, path, outcome, error_column, capture}]   CSV files, matched by the key column;
                    with `format: json`, a JSON list at `items`, each item's row named at `key` (default
                    /<key column>, or the key column's own pointer when it nests), its error at `error`,
                    `capture` JSON pointers (kept by their last name);
                    with `pages`, over several pages (`next` pointer or Link header, `max_pages`); with
                    `archive: tar.gz`, a gzip'd tar of JSON files (archive.py); `status`: each item's own
                    HTTP status in place of `outcome`; `url_at`: the set's URL in the status answer
    unlisted        unprocessed (a row named in no result goes in a later job) | success (only failures
                    are listed)

Every `path` follows `base_url`; `{job}` in it is the job's id, one path segment (steps.segment: an id no
encoding keeps one is refused where it is answered). The target's states
are told apart by the lists `done_states`, `failed_states`, `aborted_states` and `open_states`; any
other state is still working. Each step is asked as steps.py says (the upload never twice); a poll or a
result set that cannot be read is asked again (steps.readable).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from typing import Any
from urllib.parse import urljoin

import orjson

from bulkrelay.job.config import BulkGenericConfig, BulkStepConfig
from bulkrelay.relay.bulkjobs.archive import archive_documents
from bulkrelay.relay.bulkjobs.steps import (
    ABORTED,
    API_SUCCESS,
    FAILED,
    JOB_COMPLETE,
    OPEN,
    AnswerUnreadable,
    JobResults,
    StepClient,
    StepRefused,
    csv_rows,
    job_id,
    json_answer,
    never_sent,
    segment,
)
from bulkrelay.relay.response import next_page, resolve_pointer
from bulkrelay.relay.transport.base import Response

_Outcomes = Iterator[tuple[str, str, Any]]  # each named row's key text, outcome, and error or captured


class GenericBulk(StepClient):
    """The steps of `request.bulk_job.steps`, against one base URL."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self._config.steps is not None  # kind: generic (config.py refuses it without steps)
        self._steps: BulkGenericConfig = self._config.steps
        steps = self._steps
        if steps.create is None:  # the upload makes the job (steps.resubmit: safe)
            self.submitter = self._submit
        self._states = {
            **dict.fromkeys(steps.open_states, OPEN),
            **dict.fromkeys(steps.aborted_states, ABORTED),
            **dict.fromkeys(steps.failed_states, FAILED),
            **dict.fromkeys(steps.done_states, JOB_COMPLETE),
        }

    async def create(self, number: int, keys: list[str]) -> str:
        step = self._steps.create
        assert step is not None  # else the driver submits
        return _job_id(await self._step("create", step, ""), step, "create")

    async def _submit(self, body: bytes) -> str:
        """The upload that makes the job (no create): sent once, as any upload; its answer's id."""
        step = self._steps.upload
        request = self._request(step.method, self._url(step, ""), body, self._bulk.content_type)
        return _job_id(await self._sent_once("upload", request), step, "upload")

    async def upload(self, remote: str, body: bytes) -> None:
        step = self._steps.upload
        url = self._url(step, remote)
        await self._sent_once("upload", self._request(step.method, url, body, self._bulk.content_type))

    async def close(self, remote: str) -> None:
        """Close the job (when a step does); a refusal is no refusal when the job is closed already."""
        if self._steps.close is None:
            return
        try:
            await self._step("close", self._steps.close, remote)
        except StepRefused:
            if (await self.state(remote))[0] == OPEN:
                raise

    async def abort(self, remote: str) -> None:
        if self._steps.abort is not None:
            await self._step("abort", self._steps.abort, remote)

    async def state(self, remote: str) -> tuple[str, str | None]:
        """The job's state in the driver's words, asked until an answer can be read."""
        return await self.readable(lambda: self._state(remote))

    async def _state(self, remote: str) -> tuple[str, str | None]:
        step = self._steps.status
        answer = await self._asked("poll", step.method, self._url(step, remote), None, None, poll=True)
        state = _pointed(answer, step.state or "", "poll")
        if not isinstance(state, str):
            raise AnswerUnreadable("poll", answer.status, f"the answer has no state at {step.state}")
        mapped = self._states.get(state, "InProgress")
        error = _pointed(answer, step.error, "poll") if step.error and mapped == FAILED else None
        return mapped, str(error) if error not in (None, "") else None

    async def results(self, remote: str, sent: set[str]) -> JobResults:
        """Every result set's outcomes, all its pages read before any is returned (the driver journals
        them in one group, so a crash while paging fetches them all again, none lost or doubled); all
        asked again, from the first, while an answer cannot be read."""
        return await self.readable(lambda: self._results(remote, sent))

    async def _results(self, remote: str, sent: set[str]) -> JobResults:
        results = JobResults()
        key = self._bulk.key_column
        for step in self._steps.results:
            name = _set_name(step)
            named: set[str] = set()  # the keys this JSON result set named: one named twice is refused
            async with aclosing(self._outcomes(name, step, remote, key)) as pages:
                async for outcomes in pages:
                    for row_key, outcome, what in outcomes:
                        if row_key not in sent:
                            raise never_sent(name, row_key, remote)
                        if step.format == "json":
                            if row_key in named:
                                twice = f"names key {row_key!r} twice in job {remote}"
                                raise StepRefused(name, None, twice)
                            named.add(row_key)
                        _take(results, row_key, outcome, what, name)
        if self._steps.unlisted != "unprocessed":  # the target lists only its failures (Klaviyo's errors)
            listed = results.succeeded.keys() | results.failed.keys() | results.unprocessed
            results.succeeded |= {row_key: {} for row_key in sent - listed}
        return results

    async def _outcomes(
        self, name: str, step: BulkStepConfig, remote: str, key: str
    ) -> AsyncGenerator[_Outcomes, None]:
        """The outcomes of each page of a result set (one page unless it has `pages`; each JSON file of
        an archive)."""
        url = await self._set_url(name, step, remote)
        if step.format != "json":
            answer = await self._fetch(name, step, url)
            yield _csv_outcomes(csv_rows(answer.body, name, key), step, key)
            return
        default_key = key if key.startswith("/") else "/" + _escaped(key)  # a nested key column: its pointer
        if step.archive is not None:
            answer = await self._fetch(name, step, url)
            limits = {"max_members": step.max_members, "max_unpacked_bytes": step.max_unpacked_bytes}
            for document, where in archive_documents(answer.body, name=name, job=remote, **limits):
                yield _json_outcomes(document, step, where, default_key)
        elif step.pages is None:
            answer = await self._fetch(name, step, url)
            yield _json_outcomes(_json_document(answer, name), step, name, default_key)
        else:
            async with aclosing(self._pages(name, step, remote, url)) as pages:
                async for document, where in pages:
                    yield _json_outcomes(document, step, where, default_key)

    async def _set_url(self, name: str, step: BulkStepConfig, remote: str) -> str:
        """A result set's URL: its path's, or the one at `url_at` in the job's status answer, asked
        again now (a URL signed for a while, as Mailchimp's response_body_url, is fresh)."""
        if step.url_at is None:
            return self._url(step, remote)
        status = self._steps.status
        status_url = self._url(status, remote)
        answer = await self._asked(name, status.method, status_url, None, None, poll=True)
        found = _pointed(answer, step.url_at, name)
        if not isinstance(found, str) or not found:
            raise AnswerUnreadable(
                name, answer.status, f"job {remote}'s status answer has no URL at {step.url_at}"
            )
        return urljoin(status_url, found)

    async def _pages(
        self, name: str, step: BulkStepConfig, remote: str, first: str
    ) -> AsyncGenerator[tuple[Any, str], None]:
        """Each page of a paged JSON result set, as a `get` lookup reads them: the next page's URL at the
        pointer `next` (else the Link header's rel="next"), relative to the page's; a page asked for twice
        (a loop) or more than `max_pages` pages is StepRefused."""
        assert step.pages is not None
        pages = step.pages
        url: str | None = first
        seen: dict[str, int] = {}
        while url is not None:
            if url in seen:
                loop = f"page {len(seen) + 1} would be page {seen[url]} again: the pages loop"
                raise StepRefused(name, None, f"{loop} (job {remote})")
            if len(seen) == pages.max_pages:
                most = f"more than max_pages ({pages.max_pages}) pages"
                raise StepRefused(name, None, f"job {remote} has {most}")
            seen[url] = len(seen) + 1
            where = f"{name}, page {len(seen)}"
            answer = await self._fetch(name, step, url)
            document = _json_document(answer, where)
            yield document, where
            url = next_page(pages.next, document, answer.headers, url)

    async def _fetch(self, name: str, step: BulkStepConfig, url: str, *, patient: bool = True) -> Response:
        """A result set's answer (or page's), asked until the deadline (the job ran): a URL on another
        origin than base_url, given by the target (a next page, an archive on a file store), is asked
        without the job's headers and auth."""
        body = None if step.json_ is None else orjson.dumps(step.json_)
        kind = None if body is None else "application/json"
        credentials = self.same_origin(url)
        return await self._asked(name, step.method, url, body, kind, patient=patient, credentials=credentials)

    async def _step(self, name: str, step: BulkStepConfig, remote: str) -> Response:
        """A create, close or abort: asked retry.max_attempts times."""
        return await self._fetch(name, step, self._url(step, remote), patient=False)

    def _url(self, step: BulkStepConfig, remote: str) -> str:
        assert step.path is not None  # config.py: every step has one
        if "{job}" not in step.path:  # a create, or an upload that makes the job: no id yet
            return self._base + step.path
        return self._base + step.path.replace("{job}", segment(remote))


def _take(results: JobResults, row_key: str, outcome: str, what: Any, name: str) -> None:
    """One named row's outcome, as the target says and the job file reads it."""
    match outcome:
        case "failed":
            results.failed[row_key] = what or f"failed (in {name})"
        case "unprocessed":
            results.unprocessed.add(row_key)
        case _:
            results.succeeded[row_key] = what or {}


def _job_id(answer: Response, step: BulkStepConfig, name: str) -> str:
    remote = _pointed(answer, step.id or "", name)
    if not isinstance(remote, (str, int)) or isinstance(remote, bool) or not str(remote):
        raise StepRefused(name, answer.status, f"the answer has no job id at {step.id}")
    return job_id(remote, name, answer.status)


def _set_name(step: BulkStepConfig) -> str:
    """A result set's name in messages: its path's last part."""
    return (step.path or "results").rsplit("/", 1)[-1]


def _csv_outcomes(rows: list[dict[str, str]], step: BulkStepConfig, key: str) -> _Outcomes:
    """Each result row's key cell, the set's outcome, and its error (failed) or captured columns."""
    for row in rows:
        if step.outcome == "failed":
            yield row[key], "failed", row.get(step.error_column or "")
        else:
            yield row[key], step.outcome or "success", {column: row.get(column) for column in step.capture}


def _json_document(answer: Response, name: str) -> Any:
    try:
        return orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        raise AnswerUnreadable(name, answer.status, "the answer is not JSON") from None


def _json_outcomes(document: Any, step: BulkStepConfig, name: str, key: str) -> _Outcomes:
    """Each item of a JSON result's list: its row's key text, its outcome (the set's, or by the item's
    own `status`), and its error or captured values; an item without a key or a status, or an answer
    without the list, is AnswerUnreadable (asked again, nothing guessed)."""
    items = resolve_pointer(document, step.items or "")
    if not isinstance(items, list):
        raise AnswerUnreadable(name, None, f"the answer has no list at {step.items or '(the document)'}")
    for item in items:
        found = resolve_pointer(item, step.key or key)
        if isinstance(found, bool) or not isinstance(found, (str, int)) or found == "":
            raise AnswerUnreadable(name, None, f"an item has no key at {step.key or key}")
        outcome = step.outcome or _item_outcome(item, step, name)
        if outcome == "failed":
            error = _value(resolve_pointer(item, step.error)) if step.error else None
            yield str(found), outcome, None if error is None else _text(error)
        else:
            yield str(found), outcome, {_last_name(p): _value(resolve_pointer(item, p)) for p in step.capture}


def _item_outcome(item: Any, step: BulkStepConfig, name: str) -> str:
    """An item's own HTTP status (`status`): a 2xx is a success (the API's rule, as for every step's
    answer), any other a failure."""
    assert step.status is not None
    status = resolve_pointer(item, step.status)
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise AnswerUnreadable(name, None, f"an item has no status (100 to 599) at {step.status}")
    return "success" if API_SUCCESS.is_success(status) else "failed"


def _text(value: Any) -> str:
    """A failed item's message as its row's error: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _escaped(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _last_name(pointer: str) -> str:
    return pointer.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")


def _value(found: Any) -> Any:
    return found if isinstance(found, (str, int, float, bool, dict, list)) else None


def _pointed(answer: Response, pointer: str, step: str) -> Any:
    """The answer's value at `pointer`; None when it has none (resolve_pointer's own marker is no value)."""
    found = resolve_pointer(json_answer(answer, step), pointer)
    return found if isinstance(found, (str, int, float, bool, dict, list)) else None
