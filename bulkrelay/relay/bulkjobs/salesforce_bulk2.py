"""`kind: salesforce_bulk2`: the steps of a Salesforce Bulk API 2.0 ingest job, over the transport seam.

    POST  {base_url}/jobs/ingest                       create: {object, operation, externalIdFieldName,
                                                       contentType: CSV, lineEnding} -> {id, state: Open}
    PUT   {base_url}/jobs/ingest/{id}/batches          the job's CSV, in one request (text/csv)
    PATCH {base_url}/jobs/ingest/{id}                  {"state": "UploadComplete"} closes it; "Aborted" aborts
    GET   {base_url}/jobs/ingest/{id}                  its state: Open, UploadComplete, InProgress,
                                                       JobComplete, Failed, Aborted (errorMessage)
    GET   {base_url}/jobs/ingest/{id}/successfulResults    CSV: sf__Id, sf__Created, then the job's columns
    GET   {base_url}/jobs/ingest/{id}/failedResults        CSV: sf__Id, sf__Error, then the job's columns
    GET   {base_url}/jobs/ingest/{id}/unprocessedrecords   CSV: the job's columns

Every step but the upload is asked again after a 5xx, a 429 or a transport error, with backoff from
`poll.first_seconds` doubling to `poll.max_seconds` (a Retry-After honoured), until the call's
deadline: such an answer never fails the run. A 404 on a job's state is `JobForgotten`; any other 4xx is
`StepRefused`. An upload is never sent twice to a job: one that fails is answered by aborting the job
(relay/bulkjobs/jobs.py).
"""

from __future__ import annotations

import csv
import io
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson

from bulkrelay.job.bulkcsv import BulkCsv
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.ratelimit import Limiter
from bulkrelay.relay.retry import RetryPolicy, retry_after_of
from bulkrelay.relay.transport.base import Response, Transport, TransportError

OPEN, UPLOAD_COMPLETE, JOB_COMPLETE, FAILED, ABORTED = (
    "Open",
    "UploadComplete",
    "JobComplete",
    "Failed",
    "Aborted",
)
TERMINAL = frozenset({JOB_COMPLETE, FAILED, ABORTED})
_API = RetryPolicy()  # the API's own success rule (any 2xx), not the job's response.success_statuses
_STEP_SLICE = 0.25  # seconds: a wait is cut in slices this long, so a stop is heard soon


class StepRefused(Exception):
    """A step answered with a 4xx (not 429) or an answer that does not fit: the job cannot go on."""

    def __init__(self, step: str, status: int | None, message: str) -> None:
        super().__init__(f"{step}: {message}" if status is None else f"{step} answered {status}: {message}")
        self.status = status


class JobForgotten(StepRefused):
    """The target answers 404 for a job it created: it no longer knows it."""


class StepStopped(Exception):
    """A stop was requested, or the call's deadline passed, while a step was waiting to ask again."""


@dataclass(slots=True)
class JobResults:
    """A finished job's three result sets, by key text: (captured, error) of each processed row."""

    succeeded: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unprocessed: set[str] = field(default_factory=set)


class SalesforceBulk2:
    """The ingest API of one job file: its base URL, headers (auth included) and CSV columns."""

    def __init__(
        self,
        bulk: BulkCsv,
        transport: Transport,
        headers: tuple[tuple[str, str], ...],
        stopped: Callable[[], bool],
        *,
        base_url: str,
        attempts: int,
        limiter: Limiter,
    ) -> None:
        self._bulk = bulk
        self._config = bulk.config
        self._transport = transport
        self._headers = tuple((k, v) for k, v in headers if k.lower() != "content-type")
        self._stopped = stopped
        self._jobs = f"{base_url.rstrip('/')}/jobs/ingest"  # as rendered: its ${NAME}s bound
        self._attempts = attempts  # a step but a poll gives up after this many
        self._limiter = limiter  # execution.rate_limit: every step but a poll
        self.deadline = float("inf")  # monotonic: the call's poll.max_wait, set by the driver
        self.requests = 0
        self.polls = 0

    async def create(self) -> str:
        config = self._config
        spec: dict[str, Any] = {"object": config.object, "operation": config.operation, "contentType": "CSV"}
        if config.external_id_field is not None:
            spec["externalIdFieldName"] = config.external_id_field
        spec["lineEnding"] = config.line_ending
        answer = await self._asked("create", "POST", self._jobs, orjson.dumps(spec), "application/json")
        remote = _json(answer, "create").get("id")
        if not isinstance(remote, str) or not remote:
            raise StepRefused("create", answer.status, "the answer names no job id")
        return remote

    async def upload(self, remote: str, body: bytes) -> None:
        """The job's CSV, once: a transport error or any answer but 2xx is StepRefused (abort the job)."""
        request = self._request("PUT", f"{self._jobs}/{remote}/batches", body, "text/csv")
        self.requests += 1
        await self._limiter.acquire()
        try:
            answer = await self._transport.send(request)
        except TransportError as exc:
            raise StepRefused("upload", None, str(exc)) from None
        if not _API.is_success(answer.status):
            raise StepRefused("upload", answer.status, _text(answer))

    async def close(self, remote: str) -> None:
        """Close the job; a refusal after an earlier try whose answer was lost is no refusal when the
        job is closed already."""
        try:
            await self._set_state(remote, UPLOAD_COMPLETE)
        except StepRefused:
            if (await self.state(remote))[0] == OPEN:
                raise

    async def abort(self, remote: str) -> None:
        await self._set_state(remote, ABORTED)

    async def state(self, remote: str) -> tuple[str, str | None]:
        """The job's state and, for a failed one, its errorMessage."""
        self.polls += 1
        answer = await self._asked("poll", "GET", f"{self._jobs}/{remote}", None, None, poll=True)
        data = _json(answer, "poll")
        state = data.get("state")
        if not isinstance(state, str):
            raise StepRefused("poll", answer.status, "the answer has no state")
        message = data.get("errorMessage")
        return state, message if isinstance(message, str) and message else None

    async def results(self, remote: str, sent: set[str]) -> JobResults:
        """The three result sets, matched by the key column; StepRefused for a key never sent or a
        result file that does not parse (a truncated CSV)."""
        results = JobResults()
        key = self._bulk.key_column
        for row in await self._result_rows(remote, "successfulResults", key, sent):
            results.succeeded[row[key]] = {"sf__Id": row.get("sf__Id"), "sf__Created": row.get("sf__Created")}
        for row in await self._result_rows(remote, "failedResults", key, sent):
            results.failed[row[key]] = row.get("sf__Error") or "failed without an sf__Error"
        for row in await self._result_rows(remote, "unprocessedrecords", key, sent):
            results.unprocessed.add(row[key])
        return results

    async def _result_rows(self, remote: str, name: str, key: str, sent: set[str]) -> list[dict[str, str]]:
        answer = await self._asked(name, "GET", f"{self._jobs}/{remote}/{name}", None, None)
        rows = _csv_rows(answer.body, name, key)
        for row in rows:
            if row[key] not in sent:
                raise StepRefused(name, None, f"names key {row[key]!r}, which job {remote} was never sent")
        return rows

    async def _set_state(self, remote: str, state: str) -> None:
        body = orjson.dumps({"state": state})
        await self._asked(f"state {state}", "PATCH", f"{self._jobs}/{remote}", body, "application/json")

    def _request(
        self, method: str, url: str, body: bytes | None, content_type: str | None
    ) -> PreparedRequest:
        headers = self._headers if content_type is None else (*self._headers, ("Content-Type", content_type))
        return PreparedRequest(method, url, headers, body)

    async def _asked(
        self,
        step: str,
        method: str,
        url: str,
        body: bytes | None,
        content_type: str | None,
        *,
        poll: bool = False,
    ) -> Response:
        """The step's 2xx answer, asked again after a 5xx, 429 or transport error until the deadline."""
        request = self._request(method, url, body, content_type)
        delay = self._config.poll.first_seconds
        for attempt in itertools.count(1):
            if not poll:  # polls are counted apart, never against requests_per_second
                self.requests += 1
                await self._limiter.acquire()
            wait = delay
            try:
                answer = await self._transport.send(request)
            except TransportError:
                pass
            else:
                if _API.is_success(answer.status):
                    return answer
                if answer.status == 404 and step == "poll":
                    raise JobForgotten(step, 404, f"the target does not know job {url.rsplit('/', 1)[-1]}")
                if answer.status != 429 and answer.status < 500:
                    raise StepRefused(step, answer.status, _text(answer))
                retry_after = retry_after_of(answer.headers)
                wait = max(delay, retry_after) if retry_after is not None else delay
            if not poll and attempt >= self._attempts:
                raise StepRefused(step, None, f"no answer but errors after {attempt} attempts")
            await self.pause(wait)
            delay = min(delay * 2, self._config.poll.max_seconds)
        raise AssertionError("unreachable")  # itertools.count never ends

    async def pause(self, seconds: float) -> None:
        """Wait `seconds`, in slices; StepStopped when a stop is requested or the deadline passes first."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self._stopped() or time.monotonic() + left > self.deadline:
                raise StepStopped
            await anyio.sleep(min(left, _STEP_SLICE))


def _json(answer: Response, step: str) -> dict[str, Any]:
    try:
        data = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        raise StepRefused(step, answer.status, "the answer is not JSON") from None
    if not isinstance(data, dict):
        raise StepRefused(step, answer.status, "the answer is not a JSON object")
    return data


def _csv_rows(body: bytes, name: str, key: str) -> list[dict[str, str]]:
    """The rows of a result CSV; StepRefused when it does not parse whole or lacks the key column."""
    text = body.decode("utf-8", "replace")
    if text and not text.endswith(("\n", "\r")):
        raise StepRefused(name, None, "the result file is truncated (its last line has no line end)")
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
        rows = list(reader)
    except csv.Error as exc:
        raise StepRefused(name, None, f"the result file is not valid CSV: {exc}") from None
    if reader.fieldnames is None:
        return []
    if key not in reader.fieldnames:
        raise StepRefused(name, None, f"the result file has no {key} column")
    width = len(reader.fieldnames)
    if any(None in row or len(row) != width or row[key] is None for row in rows):
        raise StepRefused(name, None, "the result file is truncated (a row has too few or too many cells)")
    return rows


def _text(answer: Response) -> str:
    return answer.body[:300].decode("utf-8", "replace")
