"""OAuth2 client credentials while relaying (relay/auth/oauth2.py): the token source alone with a fake token
endpoint, then whole runs in-process against the loopback target's token endpoint, on both clients."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from bulkrelay.envelope import Result
from bulkrelay.errors import ExitCode
from bulkrelay.job.config import load_job
from bulkrelay.job.oauth2 import TokenRequest
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.redact import Redactor
from bulkrelay.ops.lifecycle import RunOptions, plan_for, relay_locked
from bulkrelay.relay.auth import Token, TokenFailure, TokenSource, fetch_token
from bulkrelay.relay.engine import StartPoint
from bulkrelay.relay.progress import NullReporter
from bulkrelay.relay.retry import RetryPolicy
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.relay.transport.base import ConnectFailed, Response
from bulkrelay.relay.transport.mock import MockTransport
from bulkrelay.store.journal import read_journal
from bulkrelay.store.rundir import RunDir
from tests.jobfiles import write_job
from tests.listeners import never_accepting
from tests.targetproc import TargetProcess

# a real target process: outside the fast lane; one for the module, each test sets its plan first
pytestmark = [pytest.mark.slow, pytest.mark.shared_target]

SECRET = "s3cret-of-the-client"
ENV = {"CLIENT_ID": "demo-client", "CLIENT_SECRET": SECRET}
_NO_WAIT = RetryPolicy(initial_backoff_seconds=0.01, max_backoff_seconds=0.01, jitter_ratio=0)
_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())

# ------------------------------------------------------------------- the token source alone


class _TokenEndpoint(MockTransport):
    """Answers token requests from a script of (status, body); the last entry repeats. Each answer
    takes `delay` seconds, so that callers pile up behind a fetch."""

    def __init__(self, *answers: tuple[int, dict[str, Any]], delay: float = 0.01) -> None:
        super().__init__(self._answer)
        self._answers = list(answers)
        self.delay = delay
        self.requests: list[PreparedRequest] = []

    async def _answer(self, request: PreparedRequest) -> Response:
        self.requests.append(request)
        await anyio.sleep(self.delay)
        status, body = self._answers.pop(0) if len(self._answers) > 1 else self._answers[0]
        return Response(status, _HEADERS, orjson.dumps(body))


def _request(refresh_before: float = 60.0) -> TokenRequest:
    return TokenRequest(
        "http://auth/token", "id", SECRET, (("grant_type", "client_credentials"),), "body", refresh_before
    )


def _source(endpoint: Any, stop: StopControl, refresh_before: float = 60.0) -> TokenSource:
    return TokenSource(_request(refresh_before), endpoint, _NO_WAIT, Redactor([SECRET]), stop)


def _issued(n: int, **more: Any) -> tuple[int, dict[str, Any]]:
    return 200, {"access_token": f"tok-{n}", "token_type": "Bearer", **more}


@pytest.mark.anyio
async def test_one_fetch_serves_every_caller_waiting_for_the_first_token() -> None:
    endpoint = _TokenEndpoint(_issued(1))
    source = _source(endpoint, StopControl())
    tokens: list[Token | None] = []

    async def ask() -> None:
        tokens.append(await source.current())

    async with anyio.create_task_group() as group:
        for _ in range(32):
            group.start_soon(ask)
    assert len(endpoint.requests) == 1
    assert {token.value for token in tokens if token is not None} == {"tok-1"} and len(tokens) == 32


@pytest.mark.anyio
async def test_32_requests_refused_with_one_token_renew_it_once() -> None:
    endpoint = _TokenEndpoint(_issued(1), _issued(2), _issued(3))
    source = _source(endpoint, StopControl())
    first = await source.current()
    assert first is not None
    renewed: list[str] = []

    async def refused() -> None:
        token = await source.renew(first)
        assert token is not None
        renewed.append(token.value)

    async with anyio.create_task_group() as group:
        for _ in range(32):
            group.start_soon(refused)
    assert len(endpoint.requests) == 2 and renewed == ["tok-2"] * 32


@pytest.mark.anyio
async def test_a_token_is_renewed_before_it_expires_and_kept_without_expires_in() -> None:
    endpoint = _TokenEndpoint(_issued(1, expires_in=100), _issued(2))
    source = _source(endpoint, StopControl(), refresh_before=30)
    first = await source.current()
    assert first is not None and first.refresh_at is not None
    assert first.refresh_at - first.obtained <= 70  # 100 s less the 30 s margin
    short = _source(_TokenEndpoint(_issued(1, expires_in=10)), StopControl(), refresh_before=60)
    halved = await short.current()
    assert halved is not None and halved.refresh_at is not None
    assert halved.refresh_at - halved.obtained <= 5  # a margin longer than the lifetime: half of it
    object.__setattr__(first, "refresh_at", first.obtained)  # due now
    second = await source.current()
    assert second is not None and second.value == "tok-2" and second.refresh_at is None  # no expires_in
    assert await source.current() is second  # kept until a 401


@pytest.mark.anyio
async def test_a_refusal_stops_the_run_with_the_endpoints_error() -> None:
    refusal = (401, {"error": "invalid_client", "error_description": f"bad secret {SECRET}"})
    endpoint = _TokenEndpoint(refusal)
    stop = StopControl()
    source = _source(endpoint, stop)
    assert await source.current() is None
    assert await source.current() is None and len(endpoint.requests) == 1  # never asked again
    assert stop.reason is StopReason.TOKEN_REFUSED
    assert stop.detail["error"] == "invalid_client"
    assert stop.detail["error_description"] == "bad secret ***"
    assert SECRET not in str(stop.detail)


@pytest.mark.anyio
async def test_an_invalid_scope_is_a_refusal_asked_once() -> None:
    endpoint = _TokenEndpoint((400, {"error": "invalid_scope", "error_description": "contacts.write"}))
    outcome = await fetch_token(_request(), endpoint, _NO_WAIT, Redactor([SECRET]))
    assert isinstance(outcome, TokenFailure) and outcome.refused and len(endpoint.requests) == 1
    assert (
        outcome.detail["error"] == "invalid_scope" and "400: invalid_scope: contacts.write" in outcome.message
    )


@pytest.mark.anyio
async def test_503_and_transport_errors_are_retried_then_the_run_halts_unavailable() -> None:
    endpoint = _TokenEndpoint((503, {}), (429, {}), _issued(1))
    outcome = await fetch_token(_request(), endpoint, _NO_WAIT, Redactor([SECRET]))
    assert isinstance(outcome, Token) and outcome.value == "tok-1" and len(endpoint.requests) == 3

    sent = 0

    async def refuse(request: PreparedRequest) -> Response:
        nonlocal sent
        sent += 1
        raise ConnectFailed("cannot connect to auth:80: refused")

    stop = StopControl()
    assert await _source(MockTransport(refuse), stop).current() is None
    assert sent == 3  # TOKEN_ATTEMPTS, retry.max_attempts being 1
    assert stop.reason is StopReason.TOKEN_UNAVAILABLE and stop.detail["cause"] == "connect_error"


@pytest.mark.anyio
async def test_a_token_endpoints_retry_after_is_capped_by_max_retry_after_seconds() -> None:
    # A 503 asking for a day held the run (or --check-auth) that day: the cap held only for rows.
    answers = [Response(503, CIMultiDictProxy(CIMultiDict({"Retry-After": "86400"})), b"{}")]
    answers.append(Response(200, _HEADERS, orjson.dumps(_issued(1)[1])))

    async def answer(request: PreparedRequest) -> Response:
        return answers.pop(0)

    policy = RetryPolicy(initial_backoff_seconds=0.01, jitter_ratio=0, max_retry_after_seconds=0.01)
    assert policy.delay(1, 86400.0) == 0.01
    with anyio.fail_after(60):  # far beyond the cap, far short of the day asked for
        outcome = await fetch_token(_request(), MockTransport(answer), policy, Redactor([SECRET]))
    assert isinstance(outcome, Token) and outcome.value == "tok-1"


@pytest.mark.anyio
async def test_an_answer_without_a_bearer_token_is_a_refusal() -> None:
    for answer in [(200, {"token_type": "Bearer"}), (200, {"access_token": "x", "token_type": "mac"})]:
        outcome = await fetch_token(_request(), _TokenEndpoint(answer), _NO_WAIT, Redactor([SECRET]))
        assert isinstance(outcome, TokenFailure) and outcome.refused, answer


@pytest.mark.anyio
async def test_a_token_that_cannot_be_a_header_value_is_a_refusal_that_does_not_show_it() -> None:
    # Sent, it would fail every row as a transport error ("invalid URL or header"), retried, journaled
    # as connect_error, until the run halted saying the target looks down.
    for value in ["tok\nen-1234", "tok\ren-1234", "tok\x00en-1234", "tok\u00e9en-1234", "tok\x7fen-1234"]:
        answer = (200, {"access_token": value, "token_type": "Bearer"})
        outcome = await fetch_token(_request(), _TokenEndpoint(answer), _NO_WAIT, Redactor([SECRET]))
        assert isinstance(outcome, TokenFailure) and outcome.refused, value
        assert outcome.detail["error"] == "invalid_response"
        assert "en-1234" not in outcome.message + str(outcome.detail)


# ------------------------------------------------------------- whole runs against the target


def _oauth_plan(target: TargetProcess, rules: tuple[dict[str, Any], ...] = (), **oauth: Any) -> None:
    """The target's token endpoint knows our client; `oauth` adds to its plan, `rules` to the target's."""
    oauth_plan = {"client_id": "demo-client", "client_secret": SECRET, **oauth}
    target.set_plan({"oauth": oauth_plan, "rules": list(rules)})


def _job(
    tmp_path: Path, target: TargetProcess, client: str, rows: int, token_url: str = "", **execution: Any
) -> Path:
    """Rows to the target; the token from the target's endpoint unless `token_url` names another."""
    return write_job(
        tmp_path,
        target.url,
        rows=rows,
        input={"key": "id"},
        request={
            "auth": {
                "oauth2": {
                    "token_url": token_url or f"{target.url}/oauth/token",
                    "client_id": "${CLIENT_ID}",
                    "client_secret": "${CLIENT_SECRET}",
                }
            }
        },
        execution={"client": client, **execution},
        retry={"initial_backoff_seconds": 0.05, "max_backoff_seconds": 0.05},
    )


def _relay(tmp_path: Path, job: Path, env: dict[str, str] = ENV) -> tuple[Result, RunDir]:
    preflight = run_preflight(load_job(job), env=env)
    run = RunDir.create(tmp_path / "runs", plan_for(preflight))
    with run.locked():
        result = relay_locked(
            preflight, run, StartPoint(), options=RunOptions(handle_signals=False), reporter=NullReporter()
        )
    return result, run


CLIENTS = ["reqwest", "httpx"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_token_revoked_with_32_in_flight_is_renewed_once(
    tmp_path: Path, target: TargetProcess, client: str
) -> None:
    # The first token stops working after 40 requests; answers take 50 ms, so 32 are in flight then.
    _oauth_plan(target, ({"delay_ms": 50},), revoke_first_after=40)
    result, run = _relay(tmp_path, _job(tmp_path, target, client, rows=200, concurrency=32))
    assert result.exit_code == ExitCode.SUCCESS, result.error
    oauth = target.stats()["oauth"]
    assert oauth["issued"] == 2 and oauth["token_requests"] == 2  # one refresh, not one per request
    assert 1 <= oauth["bearer_refusals"] <= 32
    entries = list(read_journal(run.journal_path))
    assert len(entries) == 200 and all(entry.success for entry in entries)
    assert sum(entry.attempts == 2 for entry in entries) == oauth["bearer_refusals"]  # each 401 sent again


@pytest.mark.parametrize("client", CLIENTS)
def test_a_refused_client_halts_before_any_row_is_sent(
    tmp_path: Path, target: TargetProcess, client: str
) -> None:
    _oauth_plan(target)
    target.reset()
    result, run = _relay(tmp_path, _job(tmp_path, target, client, rows=20), {**ENV, "CLIENT_SECRET": "wrong"})
    assert result.exit_code == ExitCode.AUTH_REQUIRED
    assert result.error is not None and result.error.code == "TARGET_AUTH_FAILED"
    assert (result.error.context or {})["error"] == "invalid_client"
    assert "invalid_client" in result.error.message and "unknown client" in (result.error.detail or "")
    assert target.stats()["requests"] == 0  # no row reached the target
    assert run.journal_path.read_bytes() == b""
    assert run.manifest.stop_reason == "token_refused" and run.state.resumable


@pytest.mark.parametrize("client", CLIENTS)
def test_a_token_endpoint_answering_503_then_200_is_retried(
    tmp_path: Path, target: TargetProcess, client: str
) -> None:
    _oauth_plan(target, unavailable_first=2)
    result, _ = _relay(tmp_path, _job(tmp_path, target, client, rows=10))
    assert result.exit_code == ExitCode.SUCCESS, result.error
    assert target.stats()["oauth"]["token_requests"] == 3


@pytest.mark.parametrize("client", CLIENTS)
def test_a_hanging_token_endpoint_is_bounded_by_the_read_timeout(
    tmp_path: Path, target: TargetProcess, client: str
) -> None:
    _oauth_plan(target, hang=True)
    target.reset()
    job = _job(tmp_path, target, client, rows=10, timeout={"connect_seconds": 1, "read_seconds": 0.3})
    result, _ = _relay(tmp_path, job)
    assert result.exit_code == ExitCode.UNAVAILABLE
    assert result.error is not None and result.error.code == "TARGET_UNAVAILABLE"
    assert (result.error.context or {})["cause"] == "timeout_error"
    stats = target.stats()
    assert stats["oauth"]["token_requests"] == 3 and stats["requests"] == 0


def _relay_or_hang(tmp_path: Path, job: Path, bound: float) -> tuple[Result, RunDir]:
    """`_relay` in a thread, failing if it has not ended after `bound` seconds (a hang, not slowness)."""
    ended: list[tuple[Result, RunDir]] = []
    thread = threading.Thread(target=lambda: ended.append(_relay(tmp_path, job)), daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"the run had not ended after {bound:g} s"
    assert ended, "the run raised (see the thread's traceback above)"
    return ended[0]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_token_endpoint_that_never_takes_the_connection_is_bounded_by_the_connect_timeout(
    tmp_path: Path, target: TargetProcess, client: str
) -> None:
    # read_seconds longer than connect_seconds: on reqwest too, the connect timer is the one that ends it
    _oauth_plan(target)
    target.reset()
    with never_accepting() as url:
        timeout = {"connect_seconds": 0.5, "read_seconds": 2}
        job = _job(tmp_path, target, client, rows=10, token_url=url, timeout=timeout)
        result, run = _relay_or_hang(tmp_path, job, bound=60)  # 3 tries of 0.5 s; 60 s only a hang reaches
    assert result.exit_code == ExitCode.UNAVAILABLE
    assert result.error is not None and result.error.code == "TARGET_UNAVAILABLE"
    context = result.error.context or {}
    assert context["message"] == "connect timeout" and result.error.detail == "connect timeout"
    assert context["cause"] == "timeout_error" and context["attempts"] == 3
    assert target.stats()["requests"] == 0 and run.journal_path.read_bytes() == b""
    assert run.manifest.stop_reason == "token_unavailable" and run.state.resumable


def test_a_401_with_a_token_younger_than_the_row_halts_as_before(
    tmp_path: Path, target: TargetProcess
) -> None:
    _oauth_plan(target, ({"status": 401, "delay_ms": 20},))
    result, run = _relay(tmp_path, _job(tmp_path, target, "reqwest", rows=50))
    assert result.exit_code == ExitCode.AUTH_REQUIRED
    assert run.manifest.stop_reason == "halt_auth"
    assert target.stats()["oauth"]["token_requests"] <= 2  # at most one renewal, whatever the timing


def test_a_batch_job_carries_the_token_and_renews_it_once_when_it_is_revoked(
    tmp_path: Path, target: TargetProcess
) -> None:
    # Batches of 10 rows, 4 requests in flight; the first token stops working after 3 requests.
    _oauth_plan(target, ({"delay_ms": 50},), revoke_first_after=3)
    job = write_job(
        tmp_path,
        target.url,
        rows=100,
        input={"key": "id"},
        request={
            "url": f"{target.url}/v1/contacts/batch/array",
            "json": None,
            "batch": {"max_items": 10, "item": {"id": {"from": "id"}, "email": {"from": "email"}}},
            "auth": {
                "oauth2": {
                    "token_url": f"{target.url}/oauth/token",
                    "client_id": "${CLIENT_ID}",
                    "client_secret": "${CLIENT_SECRET}",
                }
            },
        },
        response={"items": {"mode": "whole"}},
        retry={"initial_backoff_seconds": 0.05, "max_backoff_seconds": 0.05},
    )
    result, run = _relay(tmp_path, job)
    assert result.exit_code == ExitCode.SUCCESS, result.error
    oauth = target.stats()["oauth"]
    assert oauth["token_requests"] == 2 and 1 <= oauth["bearer_refusals"] <= 4  # one renewal for all
    entries = list(read_journal(run.journal_path))
    assert len(entries) == 100 and all(entry.success and entry.batch is not None for entry in entries)
