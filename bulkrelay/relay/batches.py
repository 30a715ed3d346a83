"""Batch mode's half of the pipeline: pending rows ─► batches ─► workers ─► one journal group a request.

Batches are formed by a fixed rule, so the same pending rows make the same batches after a crash:

    take the pending rows in input order; a batch closes before the row that would make it hold more
    than `max_items` items or a body over `max_bytes`, and before a row that follows a row already
    journaled (a batch never spans a committed row).

Since all rows of one request are committed in one journal group, the rows a crash leaves pending are
whole batches of the run that crashed, and the rule forms exactly those batches again (same items,
same order, same Idempotency-Key). A row whose item was answered retryably goes back and leads a later
batch (before the next pending rows) once its backoff is over; such a batch may come out differently
after a crash, its items keeping their ids (docs/batching.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import anyio.abc

from bulkrelay.job.batch import BatchRenderer
from bulkrelay.job.records import Record
from bulkrelay.relay.batchsender import Batch, BatchSender, Group, PendingItem
from bulkrelay.relay.failurerate import FailureRate
from bulkrelay.relay.ratelimit import LimiterUnavailable
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry, JournalWriter
from bulkrelay.store.rowset import RowSet

_IDLE_POLL_SECONDS = 0.25  # the longest an idle worker waits before it looks again (a stop, a retry due)


class BatchFormer:
    """Hands each worker its next batch: due retries first, then the pending rows by the fixed rule."""

    def __init__(self, batcher: BatchRenderer, stop: StopControl, journaled: RowSet | None = None) -> None:
        self._batcher = batcher
        self._stop = stop
        # The rows the journal held when the run started: a batch never spans one. (Rows outside a
        # retry-failed or shard selection count as done too, and are passed over without a gap.)
        self._journaled = journaled
        self._records: Iterator[Record] = iter(())
        self._exhausted = False
        self._gap = False  # a journaled row was skipped since the last record read
        self._held: tuple[PendingItem, bool] | None = None  # read, not placed: it closed the last batch
        self._retries: list[PendingItem] = []
        self._in_flight = 0
        self._changed = anyio.Event()

    def feed(self, records: Iterator[Record]) -> None:
        self._records = records

    def skipped(self, row_number: int) -> None:
        """A row counted as done was passed over (the records' `on_done`)."""
        if self._journaled is not None and row_number in self._journaled:
            self._gap = True

    async def next(self) -> Batch | None:
        """The next batch to send; None when nothing is left (or a stop was requested)."""
        while not self._stop.requested:
            now = time.monotonic()
            due = [pending for pending in self._retries if pending.not_before <= now]
            if due or not self._exhausted or self._held is not None:
                batch = self._form(due)
                if batch is not None:
                    self._in_flight += 1
                    return batch
            if not self._retries and not self._in_flight:
                return None
            await self._wait(now)
        return None

    def done(self, retry: list[PendingItem]) -> None:
        """A batch came back; `retry` are its rows to send again."""
        self._in_flight -= 1
        self._retries.extend(retry)
        self._changed.set()
        self._changed = anyio.Event()

    async def _wait(self, now: float) -> None:
        soonest = min((pending.not_before for pending in self._retries), default=now + _IDLE_POLL_SECONDS)
        changed = self._changed
        with anyio.move_on_after(min(max(soonest - now, 0.0), _IDLE_POLL_SECONDS)):
            await changed.wait()

    def _form(self, due: list[PendingItem]) -> Batch | None:
        batcher = self._batcher
        items: list[PendingItem] = []
        item_bytes = 0
        for pending in sorted(due, key=lambda p: p.row_number):
            if not self._fits(items, item_bytes, pending):
                break
            self._retries.remove(pending)
            items.append(pending)
            item_bytes += len(pending.item.data)
        from_input = False
        while len(items) < batcher.max_items:
            taken = self._take()
            if taken is None:
                break
            pending, after_gap = taken
            if items and ((after_gap and from_input) or not self._fits(items, item_bytes, pending)):
                self._held = (pending, after_gap)
                break
            items.append(pending)
            item_bytes += len(pending.item.data)
            from_input = True
        if not items:
            return None
        return Batch(tuple(items), batcher.size(len(items), item_bytes))

    def _fits(self, items: list[PendingItem], item_bytes: int, pending: PendingItem) -> bool:
        return self._batcher.fits(len(items), item_bytes, pending.item)

    def _take(self) -> tuple[PendingItem, bool] | None:
        """The next pending row and whether a journaled row came before it."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        if self._exhausted:
            return None
        self._gap = False
        record = next(self._records, None)
        if record is None:
            self._exhausted = True
            return None
        return PendingItem(self._batcher.item(record)), self._gap


class RequestStreak:
    """halt.consecutive_failures counted per request: whole requests failing with a transport error or
    a 5xx, in the order they ended. Their groups are held back; when the streak reaches the limit the
    run halts and they are never journaled, so a resume sends them again. Any other ending releases
    them as final."""

    def __init__(self, limit: int, stop: StopControl) -> None:
        self._limit = limit
        self._stop = stop
        self._held: list[Group] = []

    def admit(self, group: Group) -> list[Group]:
        if self._stop.reason is StopReason.HALT_UNAVAILABLE:
            return [] if group.streak_failure else [group]
        if not group.streak_failure:
            released, self._held = self._held, []
            return [*released, group]
        self._held.append(group)
        if len(self._held) >= self._limit:
            self._stop.request(
                StopReason.HALT_UNAVAILABLE,
                consecutive_failures=len(self._held),
                last_classification=group.entries[0].classification,
            )
            self._held = []
        return []

    def release(self) -> list[Group]:
        held, self._held = self._held, []
        return [] if self._stop.reason is StopReason.HALT_UNAVAILABLE else held


class BatchRelay:
    """The batch workers of one relay, their former and their streak."""

    def __init__(
        self,
        sender: BatchSender,
        stop: StopControl,
        consecutive_failures: int,
        journaled: RowSet | None,
        rate: FailureRate | None = None,
    ) -> None:
        self.sender = sender
        self.former = BatchFormer(sender.batcher, stop, journaled)
        self.streak = RequestStreak(consecutive_failures, stop)
        self._rate = rate  # halt.failure_rate: rows counted in the order the former takes them

    def start(
        self, workers: anyio.abc.TaskGroup, records: Iterator[Record], journal: JournalWriter, count: int
    ) -> None:
        self.former.feed(records if self._rate is None else _taken(records, self._rate))
        for _ in range(count):
            workers.start_soon(self._worker, journal)

    async def release(self, journal: JournalWriter) -> None:
        for group in self.streak.release():
            await self._submit(journal, group)

    async def _submit(self, journal: JournalWriter, group: Group) -> None:
        if self._rate is not None:
            for entry in group.entries:
                self._rate.ended(entry)
        await _submit(journal, group)

    async def _worker(self, journal: JournalWriter) -> None:
        sender, former = self.sender, self.former
        while True:
            batch = await former.next()
            if batch is None:
                return
            retry: list[PendingItem] = []
            try:
                result = await sender.send_batch(batch)
                retry = result.retry
            except LimiterUnavailable as exc:  # never a local fallback: that could exceed the shared limit
                sender.stop.request(StopReason.HALT_LIMIT_UNAVAILABLE, limiter=exc.url, cause=exc.cause)
                return
            finally:
                former.done(retry)
            for group in result.groups:
                for admitted in self.streak.admit(group):
                    await self._submit(journal, admitted)


def _taken(records: Iterator[Record], rate: FailureRate) -> Iterator[Record]:
    """The rows as the former takes them, each told to the failure rate first (row order: a row retried
    later in another batch keeps its first place)."""
    for record in records:
        rate.taken(record.row_number)
        yield record


async def _submit(journal: JournalWriter, group: Group) -> None:
    def build(first_seq: int) -> list[JournalEntry]:
        # Each entry's own `batch` dict, made for it by the sender and not yet seen by the writer,
        # gets its seq in place (a dataclasses.replace per row cost more than the rest of the entry).
        for entry in group.entries:
            if entry.batch is not None:
                entry.batch["seq"] = first_seq
        return group.entries

    await journal.submit_group(build)
