"""What every bulk-job kind shares: the states the driver (jobs.py) speaks, the errors a step raises,
the results it returns, and `StepClient`, which asks one step of a job over the transport seam.

A kind (salesforce_bulk2.py, named_import.py, generic.py) is a `BulkApi`: create, upload, close, abort,
state, results and pause. Its states are spoken in Salesforce's words (`Open`, `JobComplete`, `Failed`,
`Aborted`; anything else is still working), whatever the target says. Every step but the upload is asked
again after a 5xx, a 429 or a transport error, with backoff from `poll.first_seconds` doubling to
`poll.max_seconds` (a Retry-After honoured), until the call's deadline: such an answer never fails the
run. A 404 on a job's state is `JobForgotten`; any other 4xx is `StepRefused`. A 2xx answer that cannot be
read (not JSON, no state, the wrong types, a result file cut short) is `AnswerUnreadable`: it says nothing
of the job's outcome, so a poll or a results download meeting one asks again as after a 5xx (`readable`),
never failing rows of a job that may have run.

A job id the target gives goes in every later URL as one path segment, percent-encoded (`segment`); an
id no encoding keeps one segment (`..`, a `/`, a control character) is refused where it is answered.

Every step goes through `request.auth`'s seam (relay/auth/base.py) as a row does: each attempt is
authorized right before it is sent, every other header set (an OAuth2 bearer token, or a signature over
its exact bytes). A 401 to a token older than the step's first send means the token ran out on the way:
one new token for all, and the step is sent again (a 401 was not acted on, so even an upload may be).
A status in `halt.on_statuses` otherwise (a 401 to a fresh token, a 403) halts the run (`StepStopped`),
the job's rows pending and its journal records kept, so `resume` attaches to it once the credentials
are fixed; so does a token that cannot be had.
"""

from __future__ import annotations

import csv
import io
import itertools
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import anyio
import orjson

from bulkrelay.job.bulkcsv import BulkCsv
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.redact import Redactor
from bulkrelay.relay.auth import Authenticator
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.ratelimit import Limiter
from bulkrelay.relay.response import same_origin
from bulkrelay.relay.retry import RetryPolicy, retry_after_of
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.relay.transport.base import Response, Transport, TransportError

OPEN, UPLOAD_COMPLETE, JOB_COMPLETE, FAILED, ABORTED = (
    "Open",
    "UploadComplete",
    "JobComplete",
    "Failed",
    "Aborted",
)
TERMINAL = frozenset({JOB_COMPLETE, FAILED, ABORTED})
API_SUCCESS = RetryPolicy()  # the API's own success rule (any 2xx), not the job's response.success_statuses
_STEP_SLICE = 0.25  # seconds: a wait is cut in slices this long, so a stop is heard soon
MAX_ID_CHARS = 255  # a job id longer is none (Salesforce's have 18 characters, HubSpot's fewer)
_T = TypeVar("_T")


class StepRefused(Exception):
    """A step answered with a 4xx (not 429) or an answer that does not fit: the job cannot go on."""

    def __init__(self, step: str, status: int | None, message: str) -> None:
        super().__init__(f"{step}: {message}" if status is None else f"{step} answered {status}: {message}")
        self.status = status


class JobForgotten(StepRefused):
    """The target answers 404 for a job it created: it no longer knows it."""


class AnswerUnreadable(StepRefused):
    """A 2xx answer that cannot be read (not JSON, no state, the wrong types, a result file cut short): it
    says nothing of the job's outcome, so it is asked again (`StepClient.readable`), never taken as one."""


class StepStopped(Exception):
    """A stop was requested, or the call's deadline passed, while a step was waiting to ask again."""


@dataclass(slots=True)
class JobResults:
    """A finished job's result sets, by key text: (captured, error) of each processed row."""

    succeeded: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    unprocessed: set[str] = field(default_factory=set)


class BulkApi(Protocol):
    """One kind's steps, as the driver (jobs.py) calls them; `remote` is what `create` returned, the
    id journaled before any byte of the job's data leaves. A kind with a `submitter` has no create: it
    sends the job's data in the request that makes it and returns its id (docs/bulk-jobs.md says what
    that costs)."""

    deadline: float
    submitter: Callable[[bytes], Awaitable[str]] | None
    unreadable: str | None  # the last answer that could not be read, for the stop at the deadline

    async def create(self, number: int, keys: list[str]) -> str: ...
    async def upload(self, remote: str, body: bytes) -> None: ...
    async def close(self, remote: str) -> None: ...
    async def abort(self, remote: str) -> None: ...
    async def state(self, remote: str) -> tuple[str, str | None]: ...
    async def results(self, remote: str, sent: set[str]) -> JobResults: ...
    async def pause(self, seconds: float) -> None: ...


class StepClient:
    """Asks a job's steps of one target: its base URL and headers (auth included), rate limit, retries and
    deadline; `run_id` is the run's, for a kind that names its jobs."""

    def __init__(
        self,
        bulk: BulkCsv,
        transport: Transport,
        headers: tuple[tuple[str, str], ...],
        stop: StopControl,
        *,
        base_url: str,
        run_id: str,
        attempts: int,
        limiter: Limiter,
        stats: RelayStats,
        auth: Authenticator | None = None,
        halt_statuses: Collection[int] = (),
        redactor: Redactor | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")  # as rendered: its ${NAME}s bound
        self._run_id = run_id
        self._bulk = bulk
        self._config = bulk.config
        self._transport = transport
        self._headers = tuple((k, v) for k, v in headers if k.lower() != "content-type")
        self._stop = stop
        self._auth = auth  # request.auth: each attempt's token or signature
        # what is written of a refusal (its rows' error text) hides the job's secrets and the attempt's
        self._redactor = redactor or Redactor(())
        self._halt_statuses = frozenset(halt_statuses)  # halt.on_statuses: the run halts, resumably
        self._attempts = attempts  # a step but a poll gives up after this many
        self._limiter = limiter  # execution.rate_limit: every step but a poll
        self.deadline = float("inf")  # monotonic: the call's poll.max_wait, set by the driver
        self._stats = stats  # polls and other steps counted apart (the metrics file)
        # A kind whose upload makes the job sets it: the data leaves before the job has an id.
        self.submitter: Callable[[bytes], Awaitable[str]] | None = None
        self.unreadable: str | None = None

    def _request(
        self, method: str, url: str, body: bytes | None, content_type: str | None, *, credentials: bool = True
    ) -> PreparedRequest:
        """The step's request: with the job's headers, or none (`credentials` False: a URL the target
        gave on another origin, a next page or an archive elsewhere, is sent neither headers nor auth)."""
        own = self._headers if credentials else ()
        headers = own if content_type is None else (*own, ("Content-Type", content_type))
        return PreparedRequest(method, url, headers, body)

    def same_origin(self, url: str) -> bool:
        """Whether `url` is on base_url's scheme, host and port (the job's credentials may go there)."""
        return same_origin(self._base, url)

    async def _sent_once(self, step: str, request: PreparedRequest) -> Response:
        """A request that is never sent twice (an upload, a submit): any failure is StepRefused."""
        self._stats.bulk_steps += 1
        await self._limiter.acquire()
        try:
            answer, redactor = await self._send(step, request)
        except TransportError as exc:
            raise StepRefused(step, None, self._redactor.redact(str(exc))) from None
        if not API_SUCCESS.is_success(answer.status):
            raise StepRefused(step, answer.status, answer_text(answer, redactor))
        return answer

    async def _asked(
        self,
        step: str,
        method: str,
        url: str,
        body: bytes | None,
        content_type: str | None,
        *,
        poll: bool = False,
        patient: bool = False,
        credentials: bool = True,
    ) -> Response:
        """The step's 2xx answer, asked again after a 5xx, 429 or transport error: a poll, or a `patient`
        step (a finished job's results: giving up would fail rows it ran), until the deadline; any other
        step `retry.max_attempts` times."""
        request = self._request(method, url, body, content_type, credentials=credentials)
        delay = self._config.poll.first_seconds
        for attempt in itertools.count(1):
            if poll:  # polls are counted apart, never against requests_per_second
                self._stats.bulk_polls += 1
            else:
                self._stats.bulk_steps += 1
                await self._limiter.acquire()
            if attempt > 1:
                self._stats.on_retry()
            wait = delay
            try:
                answer, redactor = await self._send(step, request, credentials=credentials)
            except TransportError:
                pass
            else:
                if API_SUCCESS.is_success(answer.status) and answer.truncated:  # cut at the transport's bound
                    larger = f"the answer is larger than {len(answer.body)} bytes"
                    raise StepRefused(step, answer.status, larger)
                if API_SUCCESS.is_success(answer.status):
                    return answer
                if answer.status == 404 and poll:
                    raise JobForgotten(step, 404, f"the target does not know job {url.rsplit('/', 1)[-1]}")
                if answer.status != 429 and answer.status < 500:
                    raise StepRefused(step, answer.status, answer_text(answer, redactor))
                retry_after = retry_after_of(answer.headers)
                wait = max(delay, retry_after) if retry_after is not None else delay
            if not (poll or patient) and attempt >= self._attempts:
                raise StepRefused(step, None, f"no answer but errors after {attempt} attempts")
            await self.pause(wait)
            delay = min(delay * 2, self._config.poll.max_seconds)
        raise AssertionError("unreachable")  # itertools.count never ends

    async def _send(
        self, step: str, request: PreparedRequest, *, credentials: bool = True
    ) -> tuple[Response, Redactor]:
        """`request` authorized for this attempt and sent; once more with a new token after a 401 to a
        token older than its first send. StepStopped when it halts the run or no token can be had.
        Without `credentials` (a URL on another origin) it is sent as it is, unauthorized. With the
        answer, what hides the job's secrets and this attempt's signatures in what is written of it."""
        first_sent = 0.0
        while True:
            token = None
            hidden: tuple[str, ...] = ()
            if self._auth is not None and credentials:
                authorized = await self._auth.authorize(request)
                if authorized is None:  # the token source asked for the stop, saying why
                    raise StepStopped
                request_sent, token, hidden = authorized
            else:
                request_sent = request
            sent = time.monotonic()
            first_sent = first_sent or sent
            answer = await self._counted(request_sent)
            if answer.status == 401 and token is not None and token.obtained <= first_sent:
                assert self._auth is not None
                if await self._auth.renew(token) is None:
                    raise StepStopped
                continue
            if answer.status in self._halt_statuses:
                self._halt(step, answer, hidden)
                raise StepStopped
            return answer, self._redactor.hiding(hidden)

    def _halt(self, step: str, answer: Response, hidden: tuple[str, ...]) -> None:
        """A halt status: the run stops, with the reason request.auth reads from the answer if any (the
        attempt's `hidden` signatures not shown)."""
        why = self._auth.refusal(answer, hidden) if self._auth is not None else None
        place = {"status_code": answer.status, "bulk_step": step}
        if why is not None:
            self._stop.request(StopReason.SIGNATURE_REFUSED, message=why, **place)
        else:
            self._stop.request(StopReason.HALT_AUTH, **place)

    async def _counted(self, request: PreparedRequest) -> Response:
        """The transport's answer, counted among the run's requests by status (the summary's `requests`,
        the metrics' requests and latency) as a row's request is: each step is a request to the target."""
        started = time.monotonic()
        try:
            answer = await self._transport.send(request)
        except TransportError:
            self._stats.on_attempt(None, time.monotonic() - started)
            raise
        self._stats.on_attempt(answer.status, time.monotonic() - started)
        return answer

    async def readable(self, read: Callable[[], Awaitable[_T]]) -> _T:
        """What `read` makes of its answers, asked again while one cannot be read (`AnswerUnreadable`),
        with the steps' backoff until the deadline, as after a 5xx: such an answer says nothing of the
        job's outcome, and rows of a job that may have run are never failed on it."""
        delay = self._config.poll.first_seconds
        while True:
            try:
                return await read()
            except AnswerUnreadable as unreadable:
                self.unreadable = str(unreadable)
                self._stats.on_retry()
            await self.pause(delay)
            delay = min(delay * 2, self._config.poll.max_seconds)

    async def pause(self, seconds: float) -> None:
        """Wait `seconds`, in slices; StepStopped when a stop is requested or the deadline passes first."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self._stop.requested or time.monotonic() + left > self.deadline:
                raise StepStopped
            await anyio.sleep(min(left, _STEP_SLICE))


def json_answer(answer: Response, step: str) -> dict[str, Any]:
    try:
        data = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        raise AnswerUnreadable(step, answer.status, "the answer is not JSON") from None
    if not isinstance(data, dict):
        raise AnswerUnreadable(step, answer.status, "the answer is not a JSON object")
    return data


def job_id(found: Any, step: str, status: int | None) -> str:
    """The job id an answer gave (a string, or a number), as text; StepRefused when there is none or it
    cannot be one URL path segment (`segment`): the target's answer never steers a later request."""
    if isinstance(found, bool) or not isinstance(found, (str, int)) or found == "":
        raise StepRefused(step, status, "the answer has no job id")
    remote = str(found)
    why = _not_a_segment(remote)
    if why is not None:
        shown = remote if len(remote) <= 60 else remote[:60] + "..."
        raise StepRefused(step, status, f"the answer's job id {shown!r} is not one URL path segment ({why})")
    return remote


def segment(remote: str) -> str:
    """A job id the target gave as one URL path segment, percent-encoded (a `?`, `#`, `%` or space in it is
    inert); StepRefused for one no encoding keeps one segment (a journal written before ids were checked)."""
    why = _not_a_segment(remote)
    if why is not None:
        raise StepRefused("job id", None, f"{remote[:60]!r} is not one URL path segment ({why})")
    return quote(remote, safe="")


def _not_a_segment(remote: str) -> str | None:
    """Why `remote` can be no URL path segment, or None: empty, a dot segment (a URL's `..` climbs, even
    encoded), a slash (many servers decode %2F back into one), a control character, or absurdly long."""
    if remote in ("", ".", ".."):
        return "empty, '.' or '..'"
    if "/" in remote or "\\" in remote:
        return "it holds a slash"
    if any(ord(char) < 32 or ord(char) == 127 for char in remote):
        return "it holds a control character"
    if len(remote) > MAX_ID_CHARS:
        return f"longer than {MAX_ID_CHARS} characters"
    return None


def csv_rows(body: bytes, name: str, key: str) -> list[dict[str, str]]:
    """The rows of a result CSV; AnswerUnreadable when it does not parse whole or lacks the key column."""
    text = body.decode("utf-8", "replace")
    if text and not text.endswith(("\n", "\r")):
        raise AnswerUnreadable(name, None, "the result file is truncated (its last line has no line end)")
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
        rows = list(reader)
    except csv.Error as exc:
        raise AnswerUnreadable(name, None, f"the result file is not valid CSV: {exc}") from None
    if reader.fieldnames is None:
        return []
    if key not in reader.fieldnames:
        raise AnswerUnreadable(name, None, f"the result file has no {key} column")
    width = len(reader.fieldnames)
    if any(None in row or len(row) != width or row[key] is None for row in rows):
        truncated = "the result file is truncated (a row has too few or too many cells)"
        raise AnswerUnreadable(name, None, truncated)
    return rows


def never_sent(name: str, key: str, remote: str) -> StepRefused:
    return StepRefused(name, None, f"names key {key!r}, which job {remote} was never sent")


_ANSWER_TEXT = 300  # characters of a refusal's answer kept as its rows' error text


def answer_text(answer: Response, redactor: Redactor) -> str:
    """The start of a refused step's answer, secrets hidden before it is cut (a secret across the cut
    would otherwise keep its first characters)."""
    text = answer.body[: _ANSWER_TEXT + 6 * redactor.longest].decode("utf-8", "replace")
    return redactor.redact(text)[:_ANSWER_TEXT]
