"""One batch request, start to each row's result: the same limiter, transport, retry policy and halts
as a row (`RowSender`), then each row's outcome read from the answer (relay/itemresults.py).

    a whole-request 429, 5xx or transport error   the same request again (same items, same key), after
                                                  the backoff and Retry-After; attempts count per row
    a halt status (401/403)                       the run halts; the batch's rows stay pending
    a 409 to the batch's key sent before      still in progress (IETF Idempotency-Key draft, Stripe):
                                                  the same request again after the backoff, at most
                                                  IN_PROGRESS_WAITS times, never split under new keys
    a whole-batch 4xx (not 401/403/429)           `on_batch_rejected: split` bisects it down to single
                                                  rows, so a bad row fails alone; `fail_all` fails all.
                                                  A 413 always splits.
    a success status                              each row's outcome from the answer; a retryable item
                                                  with attempts left goes back, to go again with its
                                                  batch's other pending rows; an answer that does
                                                  not fit fails every row as `batch_answer_invalid`
                                                  (retryable, never resent here: the target may have
                                                  applied it)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bulkrelay.job.batch import BatchRenderer, Item
from bulkrelay.job.preflight import Preflight
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.auth import Authenticator
from bulkrelay.relay.earliersends import EarlierSends
from bulkrelay.relay.itemresults import PLAIN_SUCCESS, AnswerInvalid, ItemOutcome, ItemReader
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.ratelimit import Limiter
from bulkrelay.relay.response import ResponseReader
from bulkrelay.relay.retry import (
    BATCH_ANSWER_INVALID,
    IN_PROGRESS_STATUS,
    Decision,
    RetryPolicy,
    counts_as_success,
)
from bulkrelay.relay.sender import Exchange, RowSender, _milliseconds
from bulkrelay.relay.stopping import StopControl
from bulkrelay.relay.transport.base import Response, Transport
from bulkrelay.store.journal import JournalEntry, entry_fields, entry_of, entry_with

# A whole request failing so counts toward halt.consecutive_failures (per request in batch mode).
STREAK_CLASSES = frozenset({"http_server_error", "timeout_error", "connect_error", "protocol_error"})
_NOT_SPLIT = frozenset({401, 403, 429})


@dataclass(slots=True)
class PendingItem:
    """A row on its way: its item, the requests that carried it so far, when it may go again."""

    item: Item
    attempts: int = 0
    started: float = field(default_factory=time.monotonic)
    not_before: float = 0.0

    @property
    def row_number(self) -> int:
        return self.item.record.row_number


@dataclass(frozen=True, slots=True)
class Batch:
    items: tuple[PendingItem, ...]
    size: int  # bytes of its body
    # How many requests of exactly these rows were sent before (store/batchretries.py), part of its key;
    # None for the first. `again`: the rows of the request before it, their number made durable first.
    retry: int | None = None
    again: bool = False


@dataclass(slots=True)
class Group:
    """The final results of one request's rows (journaled together); `index` in each entry's `batch`."""

    entries: list[JournalEntry]
    streak_failure: bool = False  # the whole request failed as halt.consecutive_failures counts


@dataclass(slots=True)
class BatchResult:
    groups: list[Group] = field(default_factory=list)
    retry: list[PendingItem] = field(default_factory=list)  # to send again, in a later batch
    too_large: bool = False  # a request of it was answered 413
    accepted_bytes: int = 0  # the largest body of it answered otherwise (the target read it)

    @property
    def learned(self) -> int | None:
        """The body size a 413 taught: the largest of the batch's requests the target then read."""
        return self.accepted_bytes if self.too_large and self.accepted_bytes else None


class BatchSender(RowSender):
    """Sends batches for one job; built once, shared by every worker."""

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
        super().__init__(
            preflight,
            transport,
            limiter,
            policy,
            stop,
            stats=stats,
            auth=auth,
            delivery=delivery,
            earlier=earlier,
        )
        assert preflight.batcher is not None
        self.batcher: BatchRenderer = preflight.batcher
        response = preflight.job.config.response
        self._items = ItemReader(response.items, policy, self._renderer.redactor)
        self._split = response.on_batch_rejected != "fail_all"
        self._capture = bool(response.capture)
        self._sends_keys = self.batcher.idempotency_header is not None  # a 409 then means "in progress"

    async def send_batch(self, batch: Batch) -> BatchResult:
        result = BatchResult()
        await self._send(list(batch.items), result, batch.retry)
        return result

    async def _send(self, items: list[PendingItem], result: BatchResult, retry: int | None) -> None:
        request, _ = self.batcher.request([pending.item for pending in items], self._delivery, retry)
        answered = await self._until_decided(items, request)
        if answered is None:
            return  # stopping (a halt, a stop request, no token): every row of the batch stays pending
        tried, decision = answered
        response, error, latency = tried.response, tried.error, tried.latency
        status = response.status if response is not None else None
        if status == 413:
            result.too_large = True
        elif status is not None:
            result.accepted_bytes = max(result.accepted_bytes, len(request.body or b""))
        if response is not None and self._policy.is_success(response.status):
            self._read_answer(items, response, tried, result)
        elif self._splits(response, len(items)) and not (status == IN_PROGRESS_STATUS and decision.retryable):
            self._stats.on_split()
            half = len(items) // 2
            await self._send(items[:half], result, retry)
            if not self.stop.requested:
                await self._send(items[half:], result, retry)
        else:
            error_text = self._error_text(response, error, tried.hidden)
            body = self._failure_body(response, tried.hidden)
            ended, latency_ms = time.monotonic(), _milliseconds(latency)
            classification, retryable = decision.classification, decision.retryable
            entries = [
                self._batch_entry(
                    pending, index, len(items), latency_ms, status, classification, retryable, error_text,
                    body, None, ended,
                )
                for index, pending in enumerate(items)
            ]  # fmt: skip
            result.groups.append(Group(entries, classification in STREAK_CLASSES))

    async def _until_decided(
        self, items: list[PendingItem], request: PreparedRequest
    ) -> tuple[Exchange, Decision] | None:
        """Send the batch until the policy decides (attempts counted per row, retries whole); None when
        the run stops first."""
        first_sent = 0.0
        waits = 0  # 409s to the batch's key in progress (sent before), apart from max_attempts
        earlier = self._earlier  # a continued run's: the batch may be an earlier call's unjournaled send
        sent_before = earlier is not None and earlier.in_doubt(min(p.row_number for p in items), len(items))
        while True:
            for pending in items:
                pending.attempts += 1
            if not self._limiter.try_start() and not await self._started():
                return None  # a stop came while the start was held: the rows stay pending
            tried = await self._exchange(request)
            if tried is None:
                return None
            first_sent = first_sent or tried.sent
            if self._token_ran_out(tried, first_sent):
                if await self._renewed(tried.token) is None:
                    return None
                self._stats.on_retry()
                continue
            response = tried.response
            status = response.status if response is not None else None
            retry_after = self._retry_after(response)
            sent_before = sent_before or first_sent != tried.sent
            if status == IN_PROGRESS_STATUS and self._sends_keys and sent_before:
                decision = self._policy.in_progress(waits, retry_after)
                waits += 1
            else:
                attempts = max(p.attempts for p in items) - waits
                decision = self._policy.decide(attempts, status, tried.error, retry_after)
            if decision.halt:
                self._halt(response, items[0].row_number, tried.hidden)
                return None
            self._slow_down(response, retry_after)
            if not decision.retry:
                return tried, decision
            self._stats.on_retry()
            if await self._stopped_during(decision.delay_seconds):
                return None

    def _splits(self, response: Response | None, count: int) -> bool:
        if response is None or count < 2 or not self.batcher.splits:
            return False
        status = response.status
        return status == 413 or (self._split and 400 <= status < 500 and status not in _NOT_SPLIT)

    def _read_answer(
        self, items: list[PendingItem], response: Response, tried: Exchange, result: BatchResult
    ) -> None:
        ids = [pending.item.item_id for pending in items]
        ended, latency_ms, size = time.monotonic(), _milliseconds(tried.latency), len(items)
        hidden = tried.hidden  # the attempt's signatures: hidden from what the answer gives
        reader = self._reader.hiding(hidden) if hidden else self._reader
        try:
            item_reader = self._items.hiding(hidden) if hidden else self._items
            outcomes = item_reader.outcomes(response.body, ids, truncated=response.truncated)
        except AnswerInvalid as exc:
            error = self._renderer.redactor.hiding(hidden).redact(f"batch answer invalid: {exc}")
            body = self._failure_body(response, hidden)
            entries = [
                self._batch_entry(
                    pending, index, size, latency_ms, response.status, BATCH_ANSWER_INVALID, True, error,
                    body, None, ended,
                )
                for index, pending in enumerate(items)
            ]  # fmt: skip
            result.groups.append(Group(entries))
            return
        entries = []
        max_attempts, status, key_field = self._policy.max_attempts, response.status, self._key_field
        # Rows the answer calls plain successes (every row of `whole`, the common case) share all but six
        # fields: each is a copy of one template (entry_with). A capture or a delta digest: _item_entry.
        plain = PLAIN_SUCCESS if not self._capture and self._digester is None else None
        template: dict[str, Any] | None = None
        for index, (pending, outcome) in enumerate(zip(items, outcomes, strict=True)):
            if outcome.retryable and pending.attempts < max_attempts:
                pending.not_before = time.monotonic() + self._policy.delay(pending.attempts)
                result.retry.append(pending)
                self._stats.on_retry()
                continue
            if outcome is not plain:
                entries.append(
                    self._item_entry(pending, index, size, latency_ms, status, outcome, ended, reader)
                )
                continue
            if template is None:  # the first: by the general path, and the others' template
                first = self._item_entry(pending, index, size, latency_ms, status, outcome, ended, reader)
                entries.append(first)
                template = entry_fields(first)
                continue
            item = pending.item
            record = item.record
            fields = template.copy()  # then this row's own values, as _batch_entry sets them
            fields["row_number"] = record.row_number
            fields["attempts"] = pending.attempts
            fields["duration_ms"] = int((ended - pending.started) * 1_000_000 + 0.5) / 1000
            fields["key"] = record.fields.get(key_field) if key_field is not None else None
            fields["idempotency_key"] = item.item_id
            fields["batch"] = {"seq": 0, "index": index, "size": size}
            entries.append(entry_with(fields))
        if entries:
            result.groups.append(Group(entries))

    def _item_entry(  # noqa: PLR0917 (the hot path: one call a row, positional)
        self,
        pending: PendingItem,
        index: int,
        size: int,
        latency_ms: float,
        status: int,
        outcome: ItemOutcome,
        ended: float,
        reader: ResponseReader,
    ) -> JournalEntry:
        classification = outcome.classification
        error = captured = None
        if not counts_as_success(classification):
            named = f"item {outcome.status}" if outcome.status is not None else "item rejected"
            error = named if outcome.message is None else f"{named}: {outcome.message}"
        elif self._capture and outcome.entry is not None:
            captured = reader.captured(orjson.dumps(outcome.entry))
        return self._batch_entry(
            pending, index, size, latency_ms, outcome.status if outcome.status is not None else status,
            classification, outcome.retryable, error, None, captured, ended,
        )  # fmt: skip

    def _failure_body(self, response: Response | None, hidden: tuple[str, ...]) -> str | None:
        if response is None:
            return None
        reader = self._reader.hiding(hidden) if hidden else self._reader
        return reader.failure_body(response.body, truncated=response.truncated)

    def _batch_entry(  # noqa: PLR0917 (the hot path: one call a row, positional)
        self,
        pending: PendingItem,
        index: int,
        size: int,
        latency_ms: float,
        status: int | None,
        classification: str,
        retryable: bool,
        error: str | None,
        response_body: str | None,
        captured: dict[str, object] | None,
        ended: float,
    ) -> JournalEntry:
        """A row's result in a batch whose answer came at `ended`; `batch.seq` is set when its group is
        journaled."""
        item = pending.item
        record = item.record
        digest = None
        if self._digester is not None:
            digest = self._digester.digest(item.request, record.fields).hex()
        success = counts_as_success(classification)
        return entry_of(
            record.row_number,
            success,
            classification,
            status,
            pending.attempts,
            retryable,
            None if success else error,
            int((ended - pending.started) * 1_000_000 + 0.5) / 1000,  # duration_ms: _milliseconds(), inline
            latency_ms,
            record.fields.get(self._key_field) if self._key_field is not None else None,
            item.item_id,
            captured,
            None if success else response_body,
            digest,
            {"seq": 0, "index": index, "size": size},  # batch: seq set when its group is journaled
        )
