"""OAuth2 client credentials at run time: one token for every request in flight, fetched and renewed once.

`TokenSource.current()` hands each attempt the token it sends as `Authorization: Bearer`. The first
call fetches it, so no row is sent before the token endpoint has accepted the client. A token with
`expires_in` is renewed `refresh_before_seconds` before it runs out (at half its lifetime when that
margin is longer than the lifetime); one without is kept until a request with it gets 401, when
`renew()` replaces it. Either way one fetch serves every request waiting: they queue behind one lock,
and whoever comes after a fetch finds the new token there (one refresh at a concurrency of 32, not 32).

The token request goes through the transport seam, on a client of its own built from the job's own
settings (one connection): the same client library, proxy, trusted authorities, client certificate and
connect/read timeouts as the rows, so a hanging token endpoint is bounded like a hanging target, and
both clients behave alike. Its failures:

    200 without a Bearer access_token     refused (also one no header can carry: a control or
                                          non-ASCII character), like
    400/401/403 and other final answers   refused: the run halts (`token_refused`, exit 8
                                          TARGET_AUTH_FAILED) with the endpoint's error and description
    408, 425, 429, 5xx, transport errors  retried with the run's backoff (Retry-After honoured), at least
                                          TOKEN_ATTEMPTS tries; then `token_unavailable` (exit 12)

Tokens are secrets: each is taught to the run's redactor as it arrives, never put in a stop's detail.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import anyio
import orjson

from bulkrelay.errors import TargetAuthFailed, TargetUnavailable, UsageError
from bulkrelay.job.oauth2 import TokenRequest, with_bearer
from bulkrelay.job.preflight import Preflight
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.redact import Redactor, url_for_display
from bulkrelay.relay.auth.base import Authorized, Token
from bulkrelay.relay.retry import RetryPolicy, retry_after_of
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.relay.transport.base import Response, Transport, TransportError, TransportSettings

TOKEN_ATTEMPTS = 3  # tries of a token request at least, whatever retry.max_attempts says
_TRANSIENT = frozenset({408, 425, 429})
_DESCRIPTION_CHARS = 300  # of the endpoint's error_description, kept in messages
_LONGEST_LIFETIME = 366 * 86400.0  # an expires_in beyond it is treated as none said
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]+")  # what an HTTP header value may hold (visible ASCII)


@dataclass(frozen=True, slots=True)
class TokenFailure:
    """No token: the endpoint refused the client (`refused`), or could not be had (down, stopped)."""

    refused: bool
    message: str
    detail: dict[str, Any]


async def fetch_token(
    request: TokenRequest,
    transport: Transport,
    policy: RetryPolicy,
    redactor: Redactor,
    stop: StopControl | None = None,
) -> Token | TokenFailure:
    """One token from the endpoint, retrying what a retry can fix; a stop ends the waits."""
    attempts = max(policy.max_attempts, TOKEN_ATTEMPTS)
    place = {"token_url": url_for_display(request.token_url, redactor)}
    for attempt in range(1, attempts + 1):
        prepared = request.prepared(redactor.learn)  # an assertion is never sent twice (its jti)
        sent = time.monotonic()
        try:
            response = await transport.send(prepared)
        except TransportError as exc:
            failure = TokenFailure(
                False, redactor.redact(exc.message), {**place, "cause": exc.classification}
            )
            retry_after = None
        else:
            outcome = _read(response, sent, request, redactor, place)
            if isinstance(outcome, Token) or outcome.refused:
                return outcome
            failure, retry_after = outcome, retry_after_of(response.headers)
        if attempt == attempts:
            break
        delay = policy.delay(attempt, retry_after)
        if stop is None:
            await anyio.sleep(delay)
        elif await _stopped_during(stop, delay):
            return TokenFailure(False, "stopped while waiting to ask again", {**place, "stopped": True})
    return TokenFailure(False, failure.message, {**failure.detail, "attempts": attempts})


def _read(
    response: Response, sent: float, request: TokenRequest, redactor: Redactor, place: dict[str, Any]
) -> Token | TokenFailure:
    status = response.status
    document = _json_object(response.body)
    if status == 200:  # RFC 6749 §5.1: a token comes with 200 OK; the job's success rule is for rows
        return _token(document, sent, request, redactor, place)
    detail = {**place, "status": status}
    if status in _TRANSIENT or status >= 500:
        return TokenFailure(False, f"the token endpoint answered {status}", detail)
    for name in ("error", "error_description"):
        value = document.get(name)
        if isinstance(value, str) and value:
            detail[name] = redactor.redact(value[:_DESCRIPTION_CHARS])
    said = ": ".join(str(detail[name]) for name in ("error", "error_description") if name in detail)
    return TokenFailure(
        True, f"the token endpoint refused the client ({status}{': ' if said else ''}{said})", detail
    )


def _token(
    document: Mapping[str, Any], sent: float, request: TokenRequest, redactor: Redactor, place: dict[str, Any]
) -> Token | TokenFailure:
    value = document.get("access_token")
    token_type = document.get("token_type", "Bearer")
    if not isinstance(value, str) or not value:
        what = "holds no access_token" if document else "is not a JSON object"
        detail = {**place, "error": "invalid_response"}
        return TokenFailure(True, f"the token endpoint's answer {what}", detail)
    redactor.learn(value)  # before anything else can see it
    if not _HEADER_VALUE.fullmatch(value):  # sent, every row would fail as a transport error
        message = (
            "the token endpoint's access_token cannot be sent in a header (a control or non-ASCII character)"
        )
        return TokenFailure(True, message, {**place, "error": "invalid_response"})
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        message = f"the token endpoint issued a {str(token_type)[:40]!r} token; only Bearer tokens are sent"
        return TokenFailure(True, redactor.redact(message), {**place, "error": "unsupported_token_type"})
    expires_in = _seconds(document.get("expires_in"))
    if expires_in == 0:  # the endpoint's doing, not the client's: say so rather than blame our credentials
        message = "the token endpoint issued a token that has already expired (expires_in: 0)"
        return TokenFailure(True, message, {**place, "error": "invalid_response"})
    expires_in = expires_in or request.default_expires_in
    refresh_before = request.refresh_before_seconds
    refresh_at = None
    if expires_in is not None:
        margin = refresh_before if refresh_before < expires_in else expires_in / 2
        refresh_at = sent + expires_in - margin  # counted from the request: the token cannot be older
    return Token(value, time.monotonic(), refresh_at, expires_in)


def _seconds(value: Any) -> float | None:
    """`expires_in`: a number of seconds (some endpoints send it as a string); 0 when it says so; None
    when unknown, or beyond any lifetime (a year: 1e400, 2**70), which is no reason to refuse a token."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= _LONGEST_LIFETIME:
        return float(value)
    return None


def _json_object(body: bytes) -> dict[str, Any]:
    """The answer as a JSON object ({} when it is none). The standard library reads what orjson refuses
    and a token endpoint may still send: integers beyond 64 bits, a number beyond a float (infinity)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            return {}
    return document if isinstance(document, dict) else {}


async def _stopped_during(stop: StopControl, delay: float) -> bool:
    with anyio.move_on_after(delay):
        await stop.wait()
    return stop.requested


class TokenSource:
    """The run's token: fetched on first use, renewed when due or refused, once for all who wait.

    Made inside the running event loop (its lock). A failure to get a token requests the run's stop
    (`token_refused`, `token_unavailable`) and every later call answers None: the row stays pending."""

    def __init__(
        self,
        request: TokenRequest,
        transport: Transport,
        policy: RetryPolicy,
        redactor: Redactor,
        stop: StopControl,
    ) -> None:
        self._request = request
        self._transport = transport
        self._policy = policy
        self._redactor = redactor
        self._stop = stop
        self._token: Token | None = None
        self._failed = False
        self._lock = anyio.Lock()
        self.fetches = 0  # token requests made (successful or not), for tests and the run's stats

    async def current(self) -> Token | None:
        """The token to send now; None when none can be had (the run is stopping)."""
        token = self._token
        if token is not None and not token.due(time.monotonic()):
            return token  # the common case: no await, no lock
        return await self._replace(token)

    async def renew(self, refused: Token) -> Token | None:
        """The token after `refused` got a 401: a new one, fetched unless another caller already did."""
        return await self._replace(refused)

    async def _replace(self, stale: Token | None) -> Token | None:
        async with self._lock:
            token = self._token
            if self._failed or self._stop.requested:
                return None
            if token is not None and token is not stale and not token.due(time.monotonic()):
                return token  # replaced while this caller waited for the lock
            self.fetches += 1
            outcome = await fetch_token(
                self._request, self._transport, self._policy, self._redactor, self._stop
            )
            if isinstance(outcome, TokenFailure):
                self._failed = True
                reason = StopReason.TOKEN_REFUSED if outcome.refused else StopReason.TOKEN_UNAVAILABLE
                self._stop.request(reason, message=outcome.message, **outcome.detail)
                return None
            self._token = outcome
            return outcome

    async def authorize(self, request: PreparedRequest) -> Authorized | None:
        """`request` with the current token (relay/auth/base.py); None when none can be had."""
        token = await self.current()
        return None if token is None else Authorized(with_bearer(request, token.value), token)

    def refusal(self, response: Response, hidden: Collection[str] = ()) -> str | None:
        return None  # a 401 renews the token once (the senders), then halt.on_statuses decides

    async def aclose(self) -> None:
        await self._transport.aclose()


def open_token_source(
    preflight: Preflight,
    transport_factory: Callable[[TransportSettings], Transport],
    settings: TransportSettings,
    stop: StopControl,
) -> TokenSource | None:
    """The run's token source (None: the job has no `request.auth`), on a client of its own: one
    connection, the rows' settings otherwise. Call it inside the running event loop."""
    request = preflight.renderer.token_request
    if request is None:
        return None
    config = preflight.job.config
    policy = RetryPolicy.from_config(config.retry, config.response, config.halt)
    transport = transport_factory(replace(settings, concurrency=1, decompress=False))
    return TokenSource(request, transport, policy, preflight.renderer.redactor, stop)


async def check_token(
    preflight: Preflight,
    transport_factory: Callable[[TransportSettings], Transport],
    settings: TransportSettings,
) -> Token:
    """`validate --check-auth`: one token from the endpoint (nothing else is sent), or the error saying
    why not: `TargetAuthFailed` (refused, exit 8) or `TargetUnavailable` (exit 12)."""
    request = preflight.renderer.token_request
    if request is None:
        raise UsageError(
            "--check-auth: the job has no request.auth to check", context={"job": str(preflight.job.path)}
        )
    config = preflight.job.config
    policy = RetryPolicy.from_config(config.retry, config.response, config.halt)
    transport = transport_factory(replace(settings, concurrency=1, decompress=False))
    try:
        outcome = await fetch_token(request, transport, policy, preflight.renderer.redactor)
    finally:
        await transport.aclose()
    if isinstance(outcome, Token):
        return outcome
    error = TargetAuthFailed if outcome.refused else TargetUnavailable
    raise error(outcome.message, context=outcome.detail, phase="check-auth")
