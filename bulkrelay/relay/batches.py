"""Batch mode's half of the pipeline: pending rows ─► batches ─► workers ─► one journal group a request.

A batch is fixed by the input, by one rule, so that a crash can never make a batch out of other rows:

    take the run's rows in input order, those already journaled too; a batch closes before the row that
    would make it hold more than `max_items` items or a body over `max_bytes`. A request carries the
    rows of one batch that are still pending, and nothing else.

A batch's first request carries all its rows. A row whose item was answered retryably stays with its
batch: once the backoff is over, the batch's rows still pending go again in one request of their own,
never mixed with rows of another batch. So the rows a crash leaves pending in a batch are always the
rows of a request that was sent (or of none yet): all rows of one request are committed in one journal
group, and a batch's requests follow one another. Formed again after the crash, each request has the
same items in the same order and the same Idempotency-Key, and a target that dedups by that key applies
no item twice (docs/batching.md). A split (a whole-batch 4xx bisected) is the exception: its halves
are answered one by one, and a crash between them leaves pending what no one request carried.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import anyio.abc

from bulkrelay.job.batch import BatchRenderer
from bulkrelay.job.records import Record
from bulkrelay.relay.batchsender import Batch, BatchSender, Group, PendingItem
from bulkrelay.relay.failurerate import FailureRate
from bulkrelay.relay.ratelimit import LimiterUnavailable
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.batchretries import BatchRetries
from bulkrelay.store.journal import JournalEntry, JournalWriter
from bulkrelay.store.rowset import RowSet

_IDLE_POLL_SECONDS = 0.25  # the longest an idle worker waits before it looks again (a stop, a retry due)


@dataclass(frozen=True, slots=True)
class _Journaled:
    """A row of the run the journal already holds: it takes its place in its batch, and is not sent."""

    data_length: int  # its item's bytes, which decide where its batch closes
    row_number: int
    data: bytes | None = None  # a gzip job's: its item, whose compressed bytes decide instead
    group: bytes | None = None  # a grouped job's value (job/groups.py), which closes a batch too


class BatchFormer:
    """Hands each worker its next request: a batch's pending rows due again first, then the next batch
    of the input by the fixed rule."""

    def __init__(
        self,
        batcher: BatchRenderer,
        stop: StopControl,
        journaled: RowSet | None = None,
        retries: BatchRetries | None = None,
    ) -> None:
        self._batcher = batcher
        self._stop = stop
        self._retried = retries  # the requests of the same rows sent again, durable (None: for tests)
        # The rows the journal held when the run started: they keep their places in their batches.
        # (Rows outside a retry-failed or shard selection are no rows of the run: passed over.)
        self._journaled = journaled
        self._records: Iterator[Record] = iter(())
        self._exhausted = False
        # Rows read and not yet placed, in input order: journaled ones heard of while reading the next
        # record, and the row that closed the last batch.
        self._queue: deque[PendingItem | _Journaled] = deque()
        self._retries: list[Batch] = []  # batches whose pending rows go again once due
        self._in_flight = 0
        self._changed = anyio.Event()
        # Body sizes 413s taught: batches from `from_row` on hold at most `max_bytes` (durable first, so
        # that a crash forms the same batches again); `_taught`: one learned, not yet in force.
        self._sizes: list[tuple[int, int]] = list(retries.sizes) if retries is not None else []
        self._taught: int | None = None
        self._placed = 0  # the last row placed in a batch formed from the input
        self._recording: anyio.Event | None = None  # set once a taught size being written is durable

    def feed(self, records: Iterator[Record]) -> None:
        self._records = records

    def skipped(self, record: Record) -> None:
        """A row counted as done was passed over (the records' `on_done`)."""
        if self._journaled is not None and record.row_number in self._journaled:
            request = self._batcher.item_request(record)
            data = request.body or b""
            kept = data if self._batcher.gzip else None
            group = self._batcher.group_of(record)
            self._queue.append(_Journaled(len(data), record.row_number, kept, group))

    async def next(self) -> Batch | None:
        """The next request to send; None when nothing is left (or a stop was requested)."""
        while not self._stop.requested:
            now = time.monotonic()
            batch = self._due(now)
            if batch is None and (not self._exhausted or self._queue):
                await self._put_taught_in_force()  # a size just taught is durable before it forms any
                batch = self._form()
            if batch is not None:
                self._in_flight += 1
                return await self._numbered(batch)
            if not self._retries and not self._in_flight:
                return None
            await self._wait(now)
        return None

    def learn(self, max_bytes: int) -> None:
        """A 413 taught that bodies of `max_bytes` bytes are accepted: later batches hold no more (issue
        43: one 413 per size learned, not one a batch)."""
        if max_bytes < self._max_bytes_from(self._placed + 1):
            self._taught = max_bytes if self._taught is None else min(self._taught, max_bytes)

    async def _put_taught_in_force(self) -> None:
        """Make a taught size durable, from the next batch's first row on, before any batch is formed:
        meanwhile other workers wait (no await at all in the common case, nothing taught)."""
        while self._recording is not None:
            await self._recording.wait()
        if self._taught is None:
            return
        size, self._taught, from_row = self._taught, None, self._placed + 1
        recording = self._recording = anyio.Event()
        try:
            if self._retried is not None:
                await self._retried.record_size(from_row, size)
            self._sizes.append((from_row, size))
        finally:
            self._recording = None
            recording.set()

    def _max_bytes_from(self, row: int) -> int:
        """The body size in force for a batch whose first row is `row`."""
        limit = self._batcher.max_bytes
        for from_row, max_bytes in self._sizes:
            if from_row <= row:
                limit = min(limit, max_bytes)
        return limit

    def done(self, retry: list[PendingItem], sent: Batch | None = None) -> None:
        """The request `sent` came back; `retry` are its rows to send again, together, once due. The
        very rows of `sent` again take the next number (their key must differ from the one answered);
        fewer rows make a request no one sent yet, keyed by their ids alone, as a crash forms it."""
        self._in_flight -= 1
        if retry:
            items = tuple(sorted(retry, key=lambda pending: pending.row_number))
            size = self._batcher.size(len(items), sum(len(pending.item.data) for pending in items))
            if sent is not None and len(items) == len(sent.items):
                self._retries.append(Batch(items, size, retry=(sent.retry or 0) + 1, again=True))
            else:
                self._retries.append(Batch(items, size))
        self._changed.set()
        self._changed = anyio.Event()

    async def _numbered(self, batch: Batch) -> Batch:
        """`batch` with the number its key takes: the number of requests of exactly these rows sent
        before it. A request's key so depends on its rows and the answers they got, never on which
        process sent them: the rows of a request sent again get their new number made durable now;
        rows formed from the input take an earlier process's number for the same rows (a resumed run
        sends that request again), else none (no request of these rows was ever answered)."""
        rows = [pending.row_number for pending in batch.items]
        retries = self._retried
        if batch.again:
            if retries is not None and batch.retry is not None:
                await retries.record(rows, batch.retry)
            return batch
        number = retries.earlier(rows) if retries is not None else None
        return batch if number is None else Batch(batch.items, batch.size, retry=number)

    def _due(self, now: float) -> Batch | None:
        """The first batch in input order whose pending rows may go again."""
        due = [batch for batch in self._retries if _not_before(batch) <= now]
        if not due:
            return None
        batch = min(due, key=lambda batch: batch.items[0].row_number)
        self._retries.remove(batch)
        return batch

    async def _wait(self, now: float) -> None:
        soonest = min((_not_before(batch) for batch in self._retries), default=now + _IDLE_POLL_SECONDS)
        changed = self._changed
        with anyio.move_on_after(min(max(soonest - now, 0.0), _IDLE_POLL_SECONDS)):
            await changed.wait()

    def _form(self) -> Batch | None:
        """The pending rows of the next batches of the input, up to the first that has any."""
        batcher = self._batcher
        while True:
            items: list[PendingItem] = []
            count = item_bytes = pending_bytes = 0
            limit = None
            group: bytes | None = None
            meter = batcher.meter()  # request.compression: gzip, counted by compressed bytes
            while (member := self._take()) is not None:
                length = member.data_length if isinstance(member, _Journaled) else len(member.item.data)
                if limit is None and self._sizes:
                    limit = self._max_bytes_from(member.row_number)  # a 413 taught it (learn)
                joins = (
                    member.group if isinstance(member, _Journaled) else batcher.group_of(member.item.record)
                )
                if meter is not None:
                    data = member.data if isinstance(member, _Journaled) else member.item.data
                    fits = batcher.fits_gzip(meter, count, data or b"", limit)
                else:
                    fits = batcher.fits_bytes(count, item_bytes, length, limit)
                if (count and joins != group) or not fits:
                    self._queue.appendleft(member)  # it opens the next batch
                    break
                self._placed = member.row_number
                count += 1
                group = joins
                item_bytes += length
                if isinstance(member, PendingItem):
                    items.append(member)
                    pending_bytes += length
            if items:
                size = batcher.size(len(items), pending_bytes) if meter is None else meter.size()
                return Batch(tuple(items), size)
            if count == 0:
                return None  # the input is exhausted

    def _take(self) -> PendingItem | _Journaled | None:
        """The run's next row, journaled or pending, in input order."""
        queue = self._queue
        if queue:
            return queue.popleft()
        if self._exhausted:
            return None
        record = next(self._records, None)  # the journaled rows before it join the queue first
        if record is None:
            self._exhausted = True
            return queue.popleft() if queue else None
        pending = PendingItem(self._batcher.item(record))
        if not queue:  # the common case: no journaled row before it
            return pending
        queue.append(pending)
        return queue.popleft()


def _not_before(batch: Batch) -> float:
    return max(pending.not_before for pending in batch.items)


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
            last = group.entries[0]
            self._stop.request_target_down(len(self._held), last.classification, last.error)
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
        *,
        retries: BatchRetries | None = None,
    ) -> None:
        self.sender = sender
        self.former = BatchFormer(sender.batcher, stop, journaled, retries)
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
                if result.learned is not None:
                    former.learn(result.learned)
            except LimiterUnavailable as exc:  # never a local fallback: that could exceed the shared limit
                sender.stop.request(StopReason.HALT_LIMIT_UNAVAILABLE, limiter=exc.url, cause=exc.cause)
                return
            finally:
                former.done(retry, batch)
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
