"""The embedded loopback target: an HTTP server on 127.0.0.1 with programmable faults and request recording.

`bulkrelay demo`, the integration tests and the benchmarks relay to it. It accepts any method and path,
answers `{"id": "<n>"}` with status 200 by default, and follows a *plan*, a JSON object (all keys optional):

    {"status": 200,          the answer when no rule fires
     "record": true,         keep every request for GET /_control/requests (off for benchmarks)
     "dedup": false,         Idempotency-Key dedup, see below
     "dedup_header": "Idempotency-Key",
     "in_progress_status": null,  with dedup: a key whose first request is still being answered (a
                             slow rule or batch) gets this status (409: the IETF Idempotency-Key draft's
                             and Stripe's "still in progress"), neither applied nor recorded as a replay
     "store": false,         a key-value store, see below
     "store_keys": "exact",  how the store tells its keys (paths) apart: "exact", "nfc" or "casefold"
     "limit_rps": 20,        a server-side rate limit: a request beyond 20 let through in the last
                             second gets 429 (no Retry-After), before any rule
     "oauth": {...},         an OAuth2 token endpoint; other requests then need its bearer token
                             (bulkrelay/demo/oauth.py), checked after limit_rps, before any rule
     "signed": {...},        every request's signature verified (SigV4 or HMAC: bulkrelay/demo/signatures.py),
                             after the bearer check, before any rule
     "rules": [RULE, ...]}   tried in order; the first rule that fires decides the answer

A RULE selects requests with `match` (all conditions must hold, all optional):

    "match": {"method": "PUT", "path_contains": "/v1/", "body_contains": "text",
              "body_field": "email", "contains": "invalid"}      (or "equals": <JSON value>)

then fires only within its limits, counted over the requests that reach it:

    "first_attempts": N   the first N arrivals of each distinct request (its Idempotency-Key, else
                          a hash of method, path and body): "fail each row twice, then succeed"
    "after": N            from the (N+1)-th matching request on: "401 after 100 requests"
    "times": N            N times in all: a burst, "the next 20 requests get 503"

and then answers (all optional; status defaults to the plan's):

    "status": 503, "retry_after": "2", "headers": {...}, "body": <JSON value, or a string sent as text>
    "echo_header": "Authorization"   in the body, replace {echo} by that request header's value as sent,
                          {echo_json} by it escaped for a JSON string, {echo_url} percent-encoded,
                          {echo_b64} base64-encoded: a target that leaks what it was sent
    "delay_ms": 1500      wait this long first (a slow response), or until POST /_control/release
    "repeat": 10000       a string body this many times over (a huge answer)
    "reset": true         close the connection with a TCP reset instead of answering

Batch endpoints (demo/batchtarget.py): `.../batch/upsert` (HubSpot), `.../_bulk` (Elasticsearch),
`.../users/track` (Braze) and `.../batch/array` answer each item like those APIs when no rule fires;
the plan's "batch" object sets which items fail or are retried; stats count items applied by id.

CRM endpoints (demo/crmtarget.py): `.../crm/accounts`, `.../crm/contacts`, `.../crm/deals` issue ids
and refuse (422) a record naming an account or contact id never issued; stats count creations.

Bulk jobs (demo/bulktarget.py): `.../jobs/ingest` answers like Salesforce Bulk API 2.0 ingest jobs
when no rule fires; the plan's "bulk" object sets which rows fail or stay unprocessed, and which jobs fail.
Named imports (demo/importtarget.py): `.../crm/v3/imports` answers like HubSpot CRM imports; the plan's
"imports" object sets which rows and imports fail.
Batch operations (demo/batchopstarget.py): `.../3.0/batches` answers like Mailchimp's batches, serving
each batch's results as a tar.gz of JSON files; the plan's "batch_ops" object sets which operations fail
and how the archive is spoiled.
Profile imports (demo/profileimporttarget.py): `.../api/profile-bulk-import-jobs` answers like Klaviyo's
bulk profile import jobs, listing the failed profiles in pages; the plan's "profile_imports" object sets
which profiles fail and the page size.

Dedup: with "dedup": true, a request whose Idempotency-Key was already applied (answered 2xx) gets the
stored answer again and counts as a duplicate. `effects` counts applied operations: every 2xx answer
without dedup, each distinct key (or keyless request) with it.

Store: with "store": true, each applied request (answered 2xx, not a replay) changes the record at its
path: PUT, POST and PATCH set it to the request's body (JSON, else text), DELETE removes it. With
dedup, a replayed key changes nothing, as a target that keeps idempotency keys does; so the store
shows what such a target ends holding. GET /_control/store returns it, {path: body}.
"store_keys" says which paths are one record: "exact" (the default) only equal ones; "nfc" also paths
in another Unicode form (a target that normalizes: `Zoë` composed or decomposed), "casefold" also
paths in another case (a case-insensitive target: `ABC` is `abc`), both compared as BulkRelay's
`mirror.key_match` does. Such a store keeps each record under the path last written to it, so
`PUT /items/abc` replaces `/items/ABC` and `DELETE /items/ABC` removes `/items/abc`.

A request with `Content-Encoding: gzip` (`request.compression`) is inflated first, by aiohttp's own
parser: its recorded body is the inflated one, its Content-Length header the compressed size.

Control API (never recorded or counted):

    POST /_control/plan      replace the plan (rule counters start over)    GET /_control/plan
    GET  /_control/stats     requests, by_status, effects, duplicates, resets, arrivals per second,
                             max_arrivals_in_any_second (sliding one-second window over arrival times)
    GET  /_control/store     the records the store holds, {path: body}
    GET  /_control/requests  the recorded requests, one JSON object a line: seq, t (seconds since start),
                             method, path (decoded), raw_path and query (as sent), headers,
                             idempotency_key, body (text), status (null: reset), duplicate
    POST /_control/reset     forget requests, counters, stored answers and rule counters (keep the plan
                             and the store's records: the target a sync keeps in step across nights)
    POST /_control/release   end every delay under way (a rule's delay_ms, a batch's): those requests
                             are answered now. A test holds requests with a long delay and lets them go
                             when it has seen what it waits for, never on a guess of how long that takes

In-process: `await start_target(plan)`. As a process:
`python -m bulkrelay.demo.target --port 0 --plan plan.json --port-file F` writes the chosen port to F.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import os
import signal
import socket
import struct
import sys
import time
import unicodedata
from array import array
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, unquote

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bulkrelay.demo.batchopstarget import BatchOperations, BatchOpsOptions
from bulkrelay.demo.batchtarget import BatchEndpoints, BatchOptions
from bulkrelay.demo.bulktarget import BulkIngest, BulkOptions
from bulkrelay.demo.crmtarget import CrmEndpoints
from bulkrelay.demo.importtarget import ImportOptions, NamedImports
from bulkrelay.demo.oauth import OAuthPlan, OAuthState
from bulkrelay.demo.profileimporttarget import ProfileImportOptions, ProfileImports
from bulkrelay.demo.signatures import SignatureCheck, SignedPlan
from bulkrelay.relay.ratelimit import most_in_window

_CONTROL_PREFIX = "/_control/"
_JSON = "application/json"


class _Match(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str | None = None
    path_contains: str | None = None
    body_contains: str | None = None
    body_field: str | None = None
    contains: str | None = None
    equals: Any = None


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    match: _Match = _Match()
    first_attempts: int | None = Field(default=None, ge=0)
    after: int | None = Field(default=None, ge=0)
    times: int | None = Field(default=None, ge=0)
    status: int | None = Field(default=None, ge=100, le=599)
    retry_after: str | int | None = None
    headers: dict[str, str] = {}
    body: Any = None
    delay_ms: int = Field(default=0, ge=0)
    reset: bool = False
    echo_header: str | None = None
    repeat: int = Field(default=1, ge=1)  # a string body this many times over (a huge answer)


class _Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    status: int = Field(default=200, ge=100, le=599)
    record: bool = True
    dedup: bool = False
    dedup_header: str = "Idempotency-Key"
    in_progress_status: int | None = Field(default=None, ge=100, le=599)  # a key still being answered
    store: bool = False  # a key-value store: applied writes set the record at their path
    store_keys: Literal["exact", "nfc", "casefold"] = "exact"  # which paths are one record
    rules: tuple[_Rule, ...] = ()
    limit_rps: int | None = Field(default=None, ge=1)  # a server-side rate limit: 429 above it
    batch: BatchOptions = BatchOptions()  # the batch endpoints' options (demo/batchtarget.py)
    bulk: BulkOptions = BulkOptions()  # the ingest API's options (demo/bulktarget.py)
    imports: ImportOptions = ImportOptions()  # the named-import API's options (demo/importtarget.py)
    batch_ops: BatchOpsOptions = BatchOpsOptions()  # the batch-operations API's (demo/batchopstarget.py)
    profile_imports: ProfileImportOptions = ProfileImportOptions()  # demo/profileimporttarget.py's
    oauth: OAuthPlan | None = None  # a token endpoint, and a bearer token every other request needs
    signed: SignedPlan | None = None  # each request's signature verified


def parse_plan(plan: dict[str, Any] | None) -> _Plan:
    """The plan, checked; raises ValueError naming what is wrong."""
    try:
        return _Plan.model_validate(plan or {})
    except ValidationError as exc:
        raise ValueError(f"invalid target plan: {exc}") from None


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes
    content_type: str = _JSON
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class _RuleState:
    rule: _Rule
    seen: int = 0
    fired: int = 0
    attempts: Counter[str] = field(default_factory=Counter)

    def fires(self, key: str) -> bool:
        """Count this request against the rule's limits; True if the rule answers it."""
        rule = self.rule
        self.seen += 1
        if rule.first_attempts is not None:
            self.attempts[key] += 1
            if self.attempts[key] > rule.first_attempts:
                return False
        if rule.after is not None and self.seen <= rule.after:
            return False
        if rule.times is not None and self.fired >= rule.times:
            return False
        self.fired += 1
        return True


@dataclass(frozen=True, slots=True)
class _Arrival:
    """What one request looked like, kept compact (headers stay raw until they are dumped)."""

    at: float
    method: str
    raw_path: str  # path and query exactly as sent, still percent-encoded
    raw_headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    idempotency_key: str | None
    status: int | None  # None: the connection was reset
    duplicate: bool


class TargetState:
    """The plan, the counters and the recorded requests of one target."""

    def __init__(self, plan: dict[str, Any] | None = None) -> None:
        self._started = time.monotonic()
        self._released = asyncio.Event()  # set by POST /_control/release, then replaced by a new one
        self.set_plan(plan)
        self.reset()
        self.records: dict[str, Any] = {}  # the store's (plan "store"): outlives `reset`
        self._written_as: dict[str, str] = {}  # a record's path in the store's key form -> as last written

    def set_plan(self, plan: dict[str, Any] | None) -> None:
        self.plan = parse_plan(plan)
        self._accepted: deque[float] = deque()  # the answered requests of the last second (limit_rps)
        self._rules = [_RuleState(rule) for rule in self.plan.rules]
        self._needs_key = self.plan.dedup or any(r.first_attempts is not None for r in self.plan.rules)
        self.batches = BatchEndpoints(self.plan.batch)
        bulk: BulkIngest | None = getattr(self, "bulk", None)
        if bulk is not None:  # a new plan: the jobs the target holds go on under its options
            bulk.options = self.plan.bulk
        self.bulk = bulk or BulkIngest(self.plan.bulk)
        imports: NamedImports | None = getattr(self, "imports", None)
        if imports is not None:
            imports.options = self.plan.imports
        self.imports = imports or NamedImports(self.plan.imports)
        batch_ops: BatchOperations | None = getattr(self, "batch_ops", None)
        if batch_ops is not None:
            batch_ops.options = self.plan.batch_ops
        self.batch_ops = batch_ops or BatchOperations(self.plan.batch_ops)
        profile_imports: ProfileImports | None = getattr(self, "profile_imports", None)
        if profile_imports is not None:
            profile_imports.options = self.plan.profile_imports
        self.profile_imports = profile_imports or ProfileImports(self.plan.profile_imports)
        self.oauth = OAuthState(self.plan.oauth) if self.plan.oauth is not None else None
        self.signatures = SignatureCheck(self.plan.signed) if self.plan.signed is not None else None

    def reset(self) -> None:
        self._rules = [_RuleState(rule) for rule in self.plan.rules]
        self._arrivals = array("d")
        self._records: list[_Arrival] = []
        self._by_status: Counter[int] = Counter()
        self._stored: dict[str, _Answer] = {}
        self._in_progress: set[str] = set()  # keys whose first request is still being answered
        self.batches = BatchEndpoints(self.plan.batch)
        self.crm = CrmEndpoints()
        self.bulk = BulkIngest(self.plan.bulk)
        self.imports = NamedImports(self.plan.imports)
        self.batch_ops = BatchOperations(self.plan.batch_ops)
        self.profile_imports = ProfileImports(self.plan.profile_imports)
        self.effects = 0
        self.duplicates = 0
        self.resets = 0
        self._seq = 0

    def stats(self) -> dict[str, Any]:
        oauth = {} if self.oauth is None else {"oauth": self.oauth.stats()}
        if self.signatures is not None:
            oauth["signed"] = self.signatures.stats()
        return {
            **oauth,
            "requests": len(self._arrivals),
            "by_status": {str(status): count for status, count in sorted(self._by_status.items())},
            "effects": self.effects,
            "duplicates": self.duplicates,
            "resets": self.resets,
            "arrivals_per_second": _per_second(self._arrivals),
            "max_arrivals_in_any_second": most_in_window(self._arrivals, 1.0),
            **self.batches.stats(),
            **self.crm.stats(),
            **self.bulk.stats(),
            **self.imports.stats(),
            **self.batch_ops.stats(),
            **self.profile_imports.stats(),
        }

    def requests(self) -> list[dict[str, Any]]:
        return [self._describe(seq, arrival) for seq, arrival in enumerate(self._records, start=1)]

    def arrival_times(self) -> list[float]:
        """Arrival times of every request, in seconds since the target started."""
        return [t - self._started for t in self._arrivals]

    def _describe(self, seq: int, a: _Arrival) -> dict[str, Any]:
        raw_path, _, query = a.raw_path.partition("?")
        return {
            "seq": seq,
            "t": round(a.at - self._started, 6),
            "method": a.method,
            "path": unquote(raw_path),
            "raw_path": raw_path,
            "query": query,
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in a.raw_headers},
            "idempotency_key": a.idempotency_key,
            "body": a.body.decode("utf-8", "replace"),
            "status": a.status,
            "duplicate": a.duplicate,
        }

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path.startswith(_CONTROL_PREFIX):
            return await self._control(request)
        body = await request.read()
        if self.oauth is not None and self.oauth.is_token_request(request):
            return await self.oauth.token_response(request, body)  # neither counted nor recorded
        now = time.monotonic()
        self._arrivals.append(now)
        idem = request.headers.get(self.plan.dedup_header)
        answer: _Answer | None
        if self._still_in_progress(idem):
            answer, rule, duplicate, delay_ms = self._in_progress_answer(), None, False, 0
        else:
            answer, rule, duplicate = self._decide(request, body, idem)
            delay_ms = rule.delay_ms if rule is not None else self._batch_delay_ms(request, duplicate)
        if delay_ms:
            await self._answering(idem if self.plan.in_progress_status else None, delay_ms / 1000)
        if answer is not None and rule is not None and rule.echo_header is not None:
            answer = _echoed(answer, request.headers.get(rule.echo_header, ""))
        status = answer.status if answer is not None else None
        if self.plan.record:
            headers = request.raw_headers
            self._records.append(
                _Arrival(now, request.method, request.raw_path, headers, body, idem, status, duplicate)
            )
        if answer is None:
            self.resets += 1
            return _reset(request)
        self._by_status[answer.status] += 1
        return web.Response(
            status=answer.status,
            body=answer.body,
            content_type=answer.content_type,
            headers=answer.headers or None,
        )

    def _in_progress_answer(self) -> _Answer:
        assert self.plan.in_progress_status is not None
        return _Answer(self.plan.in_progress_status, b'{"error":"in progress"}')

    def _still_in_progress(self, idem: str | None) -> bool:
        return self.plan.dedup and self.plan.in_progress_status is not None and idem in self._in_progress

    async def _answering(self, idem: str | None, seconds: float) -> None:
        """The answer's delay, during which its key is in progress (plan `in_progress_status`)."""
        if idem is None:
            await self._delay(seconds)
            return
        self._in_progress.add(idem)
        try:
            await self._delay(seconds)
        finally:
            self._in_progress.discard(idem)

    async def _delay(self, seconds: float) -> None:
        """`seconds`, or less when POST /_control/release ends every delay under way."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), seconds)

    def release(self) -> None:
        """End every delay under way now; the delays that start later run their course."""
        self._released.set()
        self._released = asyncio.Event()

    def _decide(
        self, request: web.BaseRequest, body: bytes, idem: str | None
    ) -> tuple[_Answer | None, _Rule | None, bool]:
        """The answer (None: reset the connection), the rule that fired, and whether it is a replay."""
        if self.plan.dedup and idem is not None and (stored := self._stored.get(idem)) is not None:
            self.duplicates += 1
            return stored, None, True
        if self._over_limit(time.monotonic()):
            return _Answer(429, b'{"error":"rate limited"}'), None, False
        if self.oauth is not None and (refusal := self.oauth.bearer_refusal(request)) is not None:
            return _Answer(401, refusal, headers=(("WWW-Authenticate", "Bearer"),)), None, False
        if self.signatures is not None and (refused := self.signatures.refusal(request, body)) is not None:
            return _Answer(*refused), None, False
        rule = self._firing_rule(request, body, idem) if self._rules else None
        if rule is not None and rule.reset:
            return None, rule, False
        answer = self._default_answer(request, body) if rule is None else _rule_answer(rule, self.plan.status)
        if 200 <= answer.status < 300:
            self.effects += 1
            if self.plan.dedup and idem is not None:
                self._stored[idem] = answer
            if self.plan.store:
                self._apply(request.method, request.path, body)
        return answer, rule, False

    def _apply(self, method: str, path: str, body: bytes) -> None:
        """An applied write changes the store's record at `path` (the one `store_keys` says it is)."""
        if method not in ("DELETE", "PUT", "POST", "PATCH"):
            return
        key = _store_key(path, self.plan.store_keys)
        self.records.pop(self._written_as.pop(key, path), None)
        if method == "DELETE":
            return
        self._written_as[key] = path
        try:
            self.records[path] = orjson.loads(body)
        except orjson.JSONDecodeError:
            self.records[path] = body.decode("utf-8", "replace")

    def _over_limit(self, now: float) -> bool:
        """`limit_rps`: more than that many requests let through in the last second gets a 429."""
        limit = self.plan.limit_rps
        if limit is None:
            return False
        while self._accepted and now - self._accepted[0] >= 1.0:
            self._accepted.popleft()
        if len(self._accepted) >= limit:
            return True
        self._accepted.append(now)
        return False

    def _batch_delay_ms(self, request: web.BaseRequest, replay: bool) -> int:
        """A batch's delay (plan batch.delay_ms, bulk.delay_ms): applying it takes time, replaying its
        answer none."""
        if BulkIngest.handles(request.path):
            return self.plan.bulk.delay_ms
        if NamedImports.handles(request.path):
            return self.plan.imports.delay_ms
        if BatchOperations.handles(request.path):
            return self.plan.batch_ops.delay_ms
        return self.plan.batch.delay_ms if BatchEndpoints.handles(request.path) and not replay else 0

    def _default_answer(self, request: web.BaseRequest, body: bytes) -> _Answer:
        if BulkIngest.handles(request.path):
            return _Answer(*self.bulk.answer(request.method, request.path, body, request.query_string))
        if NamedImports.handles(request.path):
            kind = request.headers.get("Content-Type", "")
            return _Answer(
                *self.imports.answer(request.method, request.path, request.query_string, body, kind)
            )
        if BatchOperations.handles(request.path):
            origin = f"{request.scheme}://{request.host}"
            return _Answer(*self.batch_ops.answer(request.method, request.path, body, origin))
        if ProfileImports.handles(request.path):
            origin = f"{request.scheme}://{request.host}"
            query = request.query_string
            return _Answer(*self.profile_imports.answer(request.method, request.path, query, body, origin))
        if BatchEndpoints.handles(request.path):
            status, answer = self.batches.answer(request.path, body)
            return _Answer(status, answer)
        if CrmEndpoints.handles(request.path):  # demo/crmtarget.py: ids the target issues
            return _Answer(*self.crm.answer(request.path, body))
        self._seq += 1
        return _Answer(self.plan.status, b'{"id":"%d"}' % self._seq)

    def _firing_rule(self, request: web.BaseRequest, body: bytes, idem: str | None) -> _Rule | None:
        key = (idem or _request_hash(request, body)) if self._needs_key else ""
        for state in self._rules:
            if _matches(state.rule.match, request, body) and state.fires(key):
                return state.rule
        return None

    async def _control(self, request: web.BaseRequest) -> web.StreamResponse:
        action = (request.method, request.path[len(_CONTROL_PREFIX) :])
        if action == ("GET", "stats"):
            return _json_response(self.stats())
        if action == ("GET", "store"):
            return _json_response(self.records)
        if action == ("GET", "plan"):
            return _json_response(self.plan.model_dump(mode="json"))
        if action == ("GET", "requests"):
            lines = b"".join(orjson.dumps(r) + b"\n" for r in self.requests())
            return web.Response(body=lines, content_type="application/x-ndjson")
        if action == ("POST", "reset"):
            self.reset()
            return _json_response({"ok": True})
        if action == ("POST", "release"):
            self.release()
            return _json_response({"ok": True})
        if action == ("POST", "plan"):
            return await self._control_plan(request)
        return _json_response({"error": f"no control action {action[0]} {request.path}"}, status=404)

    async def _control_plan(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            self.set_plan(orjson.loads(await request.read()))
        except (ValueError, TypeError) as exc:
            return _json_response({"error": str(exc)}, status=400)
        return _json_response({"ok": True})


def _store_key(path: str, form: str) -> str:
    """`path` as the store compares it: as written, in NFC, or in NFC and case-folded."""
    if form == "exact":
        return path
    composed = unicodedata.normalize("NFC", path)
    return composed if form == "nfc" else unicodedata.normalize("NFC", composed.casefold())


def _matches(match: _Match, request: web.BaseRequest, body: bytes) -> bool:
    if match.method is not None and request.method != match.method.upper():
        return False
    if match.path_contains is not None and match.path_contains not in request.path:
        return False
    if match.body_contains is not None and match.body_contains.encode() not in body:
        return False
    if match.body_field is None:
        return True
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(document, dict) or match.body_field not in document:
        return False
    value = document[match.body_field]
    if match.contains is not None and not (isinstance(value, str) and match.contains in value):
        return False
    return "equals" not in match.model_fields_set or value == match.equals


def _rule_answer(rule: _Rule, default_status: int) -> _Answer:
    headers = dict(rule.headers)
    if rule.retry_after is not None:
        headers["Retry-After"] = str(rule.retry_after)
    status = rule.status if rule.status is not None else default_status
    if isinstance(rule.body, str):
        return _Answer(status, rule.body.encode() * rule.repeat, "text/plain", tuple(headers.items()))
    body = orjson.dumps(rule.body) if rule.body is not None else b'{"rule":true}'
    return _Answer(status, body, _JSON, tuple(headers.items()))


def _echoed(answer: _Answer, value: str) -> _Answer:
    forms = {
        b"{echo}": value.encode(),
        b"{echo_json}": orjson.dumps(value)[1:-1],
        b"{echo_url}": quote(value, safe="").encode(),
        b"{echo_b64}": base64.b64encode(value.encode()),
    }
    body = answer.body
    for placeholder, form in forms.items():
        body = body.replace(placeholder, form)
    return replace(answer, body=body)


def _request_hash(request: web.BaseRequest, body: bytes) -> str:
    digest = hashlib.sha256(f"{request.method} {request.path_qs}\n".encode())
    digest.update(body)
    return digest.hexdigest()


def _reset(request: web.BaseRequest) -> web.StreamResponse:
    """Abort the connection with a TCP RST (linger 0); the response returned is never written."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return web.Response(status=500)


def _json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type=_JSON)


def _per_second(arrivals: array[float]) -> list[int]:
    """Arrivals counted per whole second since the first one."""
    if not arrivals:
        return []
    first = arrivals[0]
    counts: list[int] = []
    for t in arrivals:
        index = int(t - first)
        while len(counts) <= index:
            counts.append(0)
        counts[index] += 1
    return counts


@dataclass
class RunningTarget:
    host: str
    port: int
    state: TargetState
    _runner: web.BaseRunner

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        await self._runner.cleanup()


async def start_target(plan: dict[str, Any] | None = None, port: int = 0) -> RunningTarget:
    """Serve the target on 127.0.0.1:`port` (0: any free port) in the running event loop."""
    state = TargetState(plan)
    server = web.Server(state.handle, access_log=None)
    # Stopping waits for requests in flight at most a second: a fault plan can hold one for minutes
    # (aiohttp's default wait is 60 s; every test whose requests still hung paid 10 s at teardown).
    runner = web.ServerRunner(server, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    return RunningTarget("127.0.0.1", int(bound), state, runner)


def _write_port_file(path: Path, port: int) -> None:
    """Write atomically so a reader polling the file never sees half of it."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(f"{port}\n")
    os.replace(temp, path)


async def _serve(args: argparse.Namespace) -> None:
    plan = orjson.loads(Path(args.plan).read_bytes()) if args.plan else {}
    if args.no_record:
        plan["record"] = False
    target = await start_target(plan, args.port)
    if args.port_file:
        _write_port_file(Path(args.port_file), target.port)
    sys.stdout.write(f"{target.port}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await target.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bulkrelay.demo.target", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--plan", help="JSON file holding the plan")
    parser.add_argument("--port-file", help="write the chosen port to this file once serving")
    parser.add_argument("--no-record", action="store_true", help="do not keep requests (benchmarks)")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
