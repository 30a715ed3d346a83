"""One row, start to final result: render, rate-limit each attempt, send, retry, judge.

`RowSender.send` returns the journal entry of the row's final result, or None when the row
must stay pending: a halt status was seen, or a stop arrived while it waited to retry.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import anyio

from bulkrelay.job.compression import gzip_request
from bulkrelay.job.inputs.lookups import LookupMissed
from bulkrelay.job.preflight import Preflight
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.relay.auth import Authenticator, Token
from bulkrelay.relay.earliersends import EarlierSends
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.ratelimit import Limiter
from bulkrelay.relay.response import ResponseReader
from bulkrelay.relay.retry import (
    IN_PROGRESS_STATUS,
    LOOKUP_MISS,
    Decision,
    RetryPolicy,
    counts_as_success,
    quota_exhausted_for,
    retry_after_of,
)
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.relay.transport.base import Response, Transport, TransportError
from bulkrelay.store.journal import JournalEntry, entry_of

__all__ = ["Exchange", "RowSender"]


def _milliseconds(seconds: float) -> float:
    """`seconds` in milliseconds to the microsecond: round(seconds * 1000, 3) at a quarter of the cost
    (round() with digits goes through a decimal conversion), twice per row."""
    return int(seconds * 1_000_000 + 0.5) / 1000


class Exchange(NamedTuple):
    """One attempt's send: what came back (or the transport error), its round trip, when it left, the
    token it carried, and the secrets made for it alone (its signatures: `Authorized.hidden`), to hide in
    what is written of its answer. A NamedTuple built with `tuple.__new__`: one is made per attempt."""

    response: Response | None
    error: TransportError | None
    latency: float
    sent: float
    token: Token | None
    hidden: tuple[str, ...]


_NOTHING_HIDDEN: tuple[str, ...] = ()
_new_tuple = tuple.__new__  # Exchange(...) would go through a Python-level __new__
_monotonic = time.monotonic


class RowSender:
    def __init__(
        self,
        preflight: Preflight,
        transport: Transport,
        limiter: Limiter,
        policy: RetryPolicy,
        stop: StopControl,
        *,
        stats: RelayStats | None = None,
        auth: Authenticator | None = None,
        delivery: str | None = None,
        earlier: EarlierSends | None = None,
    ) -> None:
        config = preflight.job.config
        self._earlier = earlier  # a continued run's rows an earlier call may have sent (None: a new run)
        self._auth = auth  # request.auth: each attempt's token or signature (relay/auth/base.py)
        self._delivery = delivery  # a delta job's delivering run: part of each row's idempotency key
        self._stats = stats or RelayStats()
        self._renderer = preflight.renderer
        self._keyed = preflight.row_requests(delivery).keyed  # the row's request and idempotency key
        self._digester = preflight.digester
        self._key_field = config.input.key
        self._transport = transport
        self._limiter = limiter
        self._policy = policy
        self.stop = stop
        self._respect_retry_after = config.retry.respect_retry_after
        self._max_pause = config.retry.max_retry_after_seconds
        self._reader = ResponseReader(
            config.response.capture, config.response.failure_body_bytes, self._renderer.redactor
        )
        self._captures = bool(config.response.capture)
        self._gzip = config.request.compression == "gzip"

    async def send(self, record: Record) -> JournalEntry | None:
        try:
            request, key = self._keyed(record)
        except LookupMissed as missed:  # on_miss: skip: journaled unsent, retry-failed takes it later
            return self._not_sent(record, missed)
        wire = gzip_request(request) if self._gzip else request  # request.compression; digests read request
        started = _monotonic()
        first_sent = 0.0  # when the row was first sent: a token younger than that was fetched for it
        attempt = waits = 0  # waits: 409s to the row's key in progress, apart from max_attempts
        # an earlier call of the run may have sent it unjournaled (relay/earliersends.py)
        sent_before = self._earlier is not None and self._earlier.in_doubt(record.row_number)
        while True:
            attempt += 1
            if not self._limiter.try_start() and not await self._started():
                return None  # a stop came while the start was held: the row stays pending
            tried = await self._exchange(wire)
            if tried is None:
                return None  # no token to be had: the run is stopping, the row stays pending
            response, error, _, sent, token, _ = tried
            status = response.status if response is not None else None
            first_sent = first_sent or sent
            if token is not None and self._token_ran_out(tried, first_sent):
                if await self._renewed(token) is None:
                    return None
                self._stats.on_retry()
                continue
            # A 409 to a key sent before, by this call or maybe an earlier one: the target still answers it
            if status == IN_PROGRESS_STATUS and key is not None and (attempt > 1 or sent_before):
                decision, retry_after = self._policy.in_progress(waits, self._retry_after(response)), None
                waits += 1
            else:
                decision, retry_after = self._decided(attempt - waits, response, error)
            if decision.halt:
                self._halt(response, record.row_number, tried.hidden)
                return None
            if response is not None and (status == 429 or self._respect_retry_after):
                self._slow_down(response, retry_after)
            if not decision.retry:
                return self._entry(record, key, attempt, started, tried, decision, request)
            self._stats.on_retry()
            if await self._stopped_during(decision.delay_seconds):
                return None

    def _decided(
        self, attempt: int, response: Response | None, error: TransportError | None
    ) -> tuple[Decision, float | None]:
        """The policy's decision on this attempt, and the response's Retry-After (None when the decision
        was known already: a success, a failure never retried; a 429 is still read for its pause)."""
        status = response.status if response is not None else None
        final = self._policy.final(status)
        if final is not None and status != 429:
            return final, None
        retry_after = self._retry_after(response)
        return self._policy.decide(attempt, status, error, retry_after), retry_after

    def _halt(self, response: Response | None, row: int, hidden: tuple[str, ...]) -> None:
        """A halt status: the run stops, with the reason request.auth can read from the answer (the
        attempt's `hidden` secrets not shown)."""
        status = response.status if response is not None else None
        auth = self._auth
        why = auth.refusal(response, hidden) if auth is not None and response is not None else None
        if why is not None:
            self.stop.request(StopReason.SIGNATURE_REFUSED, message=why, status_code=status, row=row)
        else:
            self.stop.request(StopReason.HALT_AUTH, status_code=status, row=row)

    async def _exchange(self, request: PreparedRequest) -> Exchange | None:
        """One send of `request`, authorized for this attempt when the job has request.auth (a token, a
        signature over its final bytes); None when it cannot be (the run is stopping)."""
        token, hidden = None, _NOTHING_HIDDEN
        if self._auth is not None:
            authorized = await self._auth.authorize(request)
            if authorized is None:
                return None
            request, token, hidden = authorized
        sent = _monotonic()
        try:
            response = await self._transport.send(request)
        except TransportError as exc:
            latency = _monotonic() - sent
            self._stats.on_attempt(None, latency)
            return _new_tuple(Exchange, (None, exc, latency, sent, token, hidden))
        latency = _monotonic() - sent
        self._stats.on_attempt(response.status, latency)
        return _new_tuple(Exchange, (response, None, latency, sent, token, hidden))

    @staticmethod
    def _token_ran_out(tried: Exchange, first_sent: float) -> bool:
        """A 401 to a token older than the row's (or batch's) first send: the token may have run out on
        the way, so one new token for all and one more send (an attempt). A 401 to a token fetched since
        is a refusal, and the policy decides (halt.on_statuses)."""
        status = tried.response.status if tried.response is not None else None
        return status == 401 and tried.token is not None and tried.token.obtained <= first_sent

    async def _renewed(self, refused: Token | None) -> Token | None:
        assert self._auth is not None and refused is not None
        return await self._auth.renew(refused)

    async def _started(self) -> bool:
        """Wait for the limiter's start; False when a stop request came first (a long Retry-After pause
        must not hold a SIGTERM'd run, nor send after it)."""
        with self.stop.ends_on_request() as wait:
            await self._limiter.acquire()
        return not wait.cancelled_caught

    async def _stopped_during(self, delay: float) -> bool:
        """Wait out a backoff; a stop request ends the wait and leaves the row pending."""
        with anyio.move_on_after(delay):
            await self.stop.wait()
        return self.stop.requested

    @property
    def limiter(self) -> Limiter:
        return self._limiter

    def _slow_down(self, response: Response | None, retry_after: float | None) -> None:
        """What the target said about its load applies to every start, not only this row's."""
        if response is None:
            return
        if response.status == 429:
            self._limiter.rate_limited()  # AIMD: repeated 429s lower the rate
            if retry_after is not None:
                now = time.monotonic()
                self._limiter.pause_until(now + retry_after)
                self._stats.on_pause(retry_after, now)
        if self._respect_retry_after:
            reset = quota_exhausted_for(response.headers)  # nothing remains: wait for the reset
            if reset is not None:
                self._limiter.pause_until(time.monotonic() + min(reset, self._max_pause))

    def _retry_after(self, response: Response | None) -> float | None:
        """The response's Retry-After in seconds, capped at `retry.max_retry_after_seconds`."""
        if response is None or not self._respect_retry_after:
            return None
        seconds = retry_after_of(response.headers)
        return None if seconds is None else min(seconds, self._max_pause)

    def _not_sent(self, record: Record, missed: LookupMissed) -> JournalEntry:
        key = record.fields.get(self._key_field) if self._key_field is not None else None
        return JournalEntry(
            row_number=record.row_number,
            success=False,
            classification=LOOKUP_MISS,
            status_code=None,
            attempts=0,
            retryable=False,
            error=missed.message,
            duration_ms=0.0,
            key=key,
        )

    def _entry(  # noqa: PLR0917 (the hot path: one call a row, positional)
        self,
        record: Record,
        key: str | None,
        attempts: int,
        started: float,
        tried: Exchange,
        decision: Decision,
        request: PreparedRequest,
    ) -> JournalEntry:
        response = tried.response
        classification = decision.classification
        success = counts_as_success(classification)
        captured = response_body = digest = None
        if self._digester is not None:  # a delta job: the sync state learns from this line
            digest = self._digester.digest(request, record.fields).hex()
        if response is not None:
            reader = self._reader.hiding(tried.hidden) if tried.hidden else self._reader
            if not success:
                response_body = reader.failure_body(response.body, truncated=response.truncated)
            elif self._captures:
                captured = reader.captured(response.body)
        duration = _monotonic() - started  # the row: waits and retries too
        return entry_of(
            record.row_number,
            success,
            classification,
            response.status if response is not None else None,
            attempts,
            decision.retryable,
            None if success else self._error_text(response, tried.error, tried.hidden),
            int(duration * 1_000_000 + 0.5) / 1000,  # duration_ms: _milliseconds(), inline
            int(tried.latency * 1_000_000 + 0.5) / 1000,  # latency_ms: the final attempt's round trip
            record.fields.get(self._key_field) if self._key_field is not None else None,
            key,
            captured,
            response_body,
            digest,
            None,  # batch: a row of its own
        )

    def _error_text(
        self, response: Response | None, error: TransportError | None, hidden: tuple[str, ...] = ()
    ) -> str:
        if error is not None:
            return self._renderer.redactor.hiding(hidden).redact(f"{type(error).__name__}: {error}")
        assert response is not None
        return f"HTTP {response.status}"
