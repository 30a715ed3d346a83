"""The relay engine, the only place that wires the pipeline:

    records ─► window (N workers) ─► rate limiter ─► transport ─► retry policy ─► journal ─► checkpoint

A fixed pool of `concurrency` workers pulls records from one shared stream, so at most
`concurrency` rows are in flight and no task is made per row. A row is done only when its
journal batch has been fsynced; only then does it count in the progress and the checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import urlsplit

import anyio
from anyio.abc import TaskGroup

from bulkrelay.errors import InputChanged, NotFound, Problem, sole_error
from bulkrelay.job.config import BULK_ANSWER_BYTES, MAX_BODY_BYTES, Job, JobConfig
from bulkrelay.job.inputs import open_records
from bulkrelay.job.inputs.rowstarts import ChunkShare
from bulkrelay.job.positions import RowPositions, open_selected
from bulkrelay.job.preflight import Preflight
from bulkrelay.job.records import Record
from bulkrelay.relay.auth import Authenticator, open_authenticator
from bulkrelay.relay.batches import BatchRelay
from bulkrelay.relay.batchsender import BatchSender
from bulkrelay.relay.bulkjobs import open_bulk_relay
from bulkrelay.relay.earliersends import EarlierSends
from bulkrelay.relay.failurerate import FailureRate, RowOrder
from bulkrelay.relay.failurestreak import FailureStreak, Streak, Unjudged
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.progress import JobCounts, Reporter, Snapshot
from bulkrelay.relay.ratelimit import Limiter, LimiterUnavailable, Pace, RateLimiter
from bulkrelay.relay.retry import RetryPolicy
from bulkrelay.relay.runahead import RunAhead, run_ahead_rows
from bulkrelay.relay.sender import RowSender
from bulkrelay.relay.stopping import RowLimit, StopControl, StopReason
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import ClientCertificate, Transport, TransportSettings
from bulkrelay.store.batchretries import RETRIES_FILE, BatchRetries
from bulkrelay.store.checkpoint import Checkpoint, write_checkpoint
from bulkrelay.store.journal import (
    MOST_UNCOMMITTED_ROWS,
    CommittedPrefix,
    JournalEntry,
    JournalState,
    JournalWriter,
)
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.rundir import RunDir, utc_now
from bulkrelay.store.summary import RequestCounts, SummaryCounts

# What a window's slots judge a row by: the streak, the row order (a failure rate, a worker's settled
# rows) and, in a worker process, its bound on running ahead of the others.
RowHalts = tuple[Streak, RowOrder | None, RunAhead | None]

CHECKPOINT_INTERVAL_SECONDS = 1.0
# The first checkpoint comes sooner: a process killed soon after it starts (again and again, say)
# has still moved the frontier, which also covers the lines a crashed predecessor left after it.
FIRST_CHECKPOINT_SECONDS = 0.1


@dataclass
class StartPoint:
    """Where the journal stands before this process sends anything (all zeros for a new run)."""

    next_seq: int = 1
    offset: int = 0
    ok: int = 0
    failed: int = 0
    done_rows: RowSet | None = None
    total: int | None = None  # rows this run is for; None: every record of the input
    journal: JournalState | None = None  # the journal's digest and rows so far (None: a new journal)
    positions: RowPositions | None = None  # the rows to send, by line (a sparse selection)
    # The journal's highest row when this call continues a run (resume, the identical re-run), which
    # the worker processes keep too: rows an earlier call may have sent are judged by it (_earlier_sends).
    journaled_through: int | None = None


@dataclass
class Committed:
    """Counters of committed results; advanced only by the journal's commit callback."""

    total: int
    seq: int
    offset: int
    ok: int
    failed: int
    committed_this_run: int = 0
    started: float = field(default_factory=time.monotonic)
    pace: Callable[[], Pace] | None = None  # the limiter's state, for the live checkpoint
    prefix: Callable[[], CommittedPrefix | None] | None = None  # the journal's, for the checkpoint
    jobs: Callable[[], JobCounts] | None = None  # a bulk run's jobs, for the progress
    # The summary's counts of every committed line, kept while the journal was written from its start:
    # the run's summary then needs no second read of the journal (None after a resume).
    counts: SummaryCounts | None = None
    heard_by: Callable[[list[JournalEntry], int], None] | None = None  # each committed group (results sink)

    @classmethod
    def at(
        cls,
        start: StartPoint,
        record_count: int,
        heard_by: Callable[[list[JournalEntry], int], None] | None = None,
    ) -> Committed:
        """The counters where the journal stands before this process sends anything."""
        total = start.total if start.total is not None else record_count
        counts = SummaryCounts() if start.offset == 0 else None
        return cls(
            total=total,
            seq=start.next_seq - 1,
            offset=start.offset,
            ok=start.ok,
            failed=start.failed,
            counts=counts,
            heard_by=heard_by,
        )

    @property
    def done(self) -> int:
        return self.ok + self.failed

    def on_commit(self, entries: list[JournalEntry], end_offset: int) -> None:
        ok = [entry.success for entry in entries].count(True)  # no branch per entry
        self.ok += ok
        self.failed += len(entries) - ok
        self.committed_this_run += len(entries)
        self.seq += len(entries)  # the writer numbers lines without gaps
        self.offset = end_offset
        if self.counts is not None:
            self.counts.add_all(entries)
        if self.heard_by is not None:
            self.heard_by(entries, end_offset)

    def snapshot(self) -> Snapshot:
        pace = self.pace() if self.pace is not None else None
        jobs = self.jobs() if self.jobs is not None else None
        return Snapshot(
            total=self.total, done=self.done, ok=self.ok, failed=self.failed, pace=pace, jobs=jobs
        )

    def checkpoint(self, *, live: bool = False) -> Checkpoint:
        """The counters; `live`: with this call's pace, for `status` while the run goes on."""
        prefix = self.prefix() if self.prefix is not None else None
        if prefix is not None and (prefix.seq, prefix.offset, prefix.ok) != (self.seq, self.offset, self.ok):
            prefix = None  # not these counters' frontier: the resume checks every line instead
        return Checkpoint(
            seq=self.seq,
            offset=self.offset,
            rows_done=self.done,
            ok=self.ok,
            failed=self.failed,
            updated_at=utc_now(),
            live=self.live_pace() if live else None,
            prefix=prefix,
        )

    def live_pace(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        pace = {"rows_per_second": round(self.committed_this_run / elapsed, 1)}
        return {**pace, **(self.pace().to_dict() if self.pace is not None else {})}


class Outbox(Protocol):
    """Where a window's final results go: the journal's writer, or a worker process's link to the
    process that journals them (ops/workers.py)."""

    def offer(self, entry: JournalEntry) -> bool: ...

    async def submit(self, entry: JournalEntry) -> None: ...


class WorkerPool(Protocol):
    """Worker processes that send a run's rows between them, each final result into `journal`; it
    ends once every worker has, and asks `stop` for what stopped any of them."""

    async def relay(self, journal: JournalWriter, stop: StopControl, stats: RelayStats) -> None: ...


@dataclass
class RelayOutcome:
    stop_reason: StopReason | None  # None: every row has a committed final result
    committed: Committed
    elapsed_seconds: float
    stop_detail: dict[str, object] = field(default_factory=dict)
    forced: bool = False
    requests: RequestCounts | None = None  # what this call sent (the summary's `requests`)


def _pending_records(
    preflight: Preflight,
    start: StartPoint,
    stop: StopControl,
    on_done: Callable[[Record], None] | None = None,
    share: ChunkShare | None = None,
) -> Generator[Record, None, None]:
    """The records without a committed result, read from exactly the bytes preflight validated. If the
    input changed (or went), the records end there and the run stops at a safe point, resumable.

    With the positions of a sparse selection, just those rows are parsed (job/positions.py), or taken
    as preflight kept them; otherwise every record is. Every byte read is checked against what
    preflight read. `on_done` hears each row passed over because its result is committed already."""
    file = preflight.input_spec.display_name
    done, expected = start.done_rows, preflight.expected_input

    def on_problem(problem: Problem) -> None:  # preflight proved these bytes clean: they changed
        raise InputChanged(
            f"{file} changed during the run: {problem.describe()}",
            context={"file": file, "problem": problem.to_dict()},
        )

    positions = start.positions
    try:
        with (
            open_selected(preflight, expected, positions)
            if positions is not None and (expected is not None or positions.records is not None)
            else open_records(preflight.input_spec, on_problem, expected, share)
        ) as records:
            if done is None:  # a new run: every record (one generator less to pass through per row)
                yield from records
                return
            for record in records:
                if record.row_number not in done:
                    yield record
                elif on_done is not None:
                    on_done(record)
    except (InputChanged, NotFound) as changed:
        stop.request(StopReason.INPUT_CHANGED, message=changed.message, **changed.context)


def transport_settings(preflight: Preflight) -> TransportSettings:
    """The relay's client settings: the job's, reading a batch's whole answer (`answer_bytes`), and a
    bulk job's result sets whole (up to BULK_ANSWER_BYTES: a larger one is refused, never cut)."""
    settings = job_transport_settings(preflight.job)
    if preflight.bulk is not None:
        return replace(settings, max_body_bytes=BULK_ANSWER_BYTES)
    if preflight.batcher is None:
        return settings
    return replace(settings, max_body_bytes=preflight.batcher.answer_bytes)


def job_transport_settings(job: Job) -> TransportSettings:
    """The job's client settings (timeouts, HTTP/2, proxy, TLS identity): its relay's, a lookup's GET's."""
    execution = job.config.execution
    timeout = execution.timeout
    header_names = {name.lower() for name in job.config.request.headers}
    return TransportSettings(
        concurrency=execution.concurrency,
        connect_seconds=timeout.connect_seconds,
        read_seconds=timeout.read_seconds,
        write_seconds=timeout.write_seconds,
        pool_seconds=timeout.pool_seconds,
        max_body_bytes=MAX_BODY_BYTES,
        http2=execution.http2,
        decompress="accept-encoding" in header_names,
        client=execution.client,
        proxy=execution.proxy,
        client_certificate=_client_certificate(job),
    )


def _client_certificate(job: Job) -> ClientCertificate | None:
    tls = job.config.execution.tls
    if tls is None:
        return None
    base = job.base_dir
    key = None if tls.client_key is None else base / tls.client_key
    return ClientCertificate(base / tls.client_cert, key)


async def relay(  # noqa: PLR0915 (the one place that wires the pipeline: rows, batches or jobs)
    preflight: Preflight,
    run: RunDir,
    start: StartPoint,
    *,
    stop: StopControl,
    reporter: Reporter,
    transport_factory: Callable[[TransportSettings], Transport] = open_transport,
    stats: RelayStats | None = None,
    on_tick: Callable[[Snapshot], None] | None = None,
    on_committed: Callable[[list[JournalEntry], int], None] | None = None,
    limit: RowLimit | None = None,
    pool: WorkerPool | None = None,
) -> RelayOutcome:
    """Send every pending row (the first `limit.rows` of them: `run --limit`), commit every final
    result, and say why it ended.

    `stats` counts what goes on the wire; `on_tick` hears the committed progress about once a second
    (the metrics file and the run log), whether or not rows were committed meanwhile; `on_committed`
    hears each committed group (the results sink), and must not block. With a `pool`, worker
    processes send the rows (ops/workers.py) and this process journals their results."""
    config = preflight.job.config
    committed = Committed.at(start, preflight.record_count, on_committed)
    started = time.monotonic()
    storage = run.storage

    def on_commit(entries: list[JournalEntry], end_offset: int) -> None:
        committed.on_commit(entries, end_offset)
        reporter.update(committed.snapshot())

    state = start.journal or JournalState.empty(preflight.record_count)
    journal = JournalWriter(
        run.journal_path, storage, next_seq=start.next_seq, on_commit=on_commit, state=state
    )
    committed.prefix = journal.prefix
    stats = stats or RelayStats()
    if pool is not None:
        reporter.update(committed.snapshot())

        async def by_workers(background: TaskGroup) -> None:
            await pool.relay(journal, stop, stats)

        await _journaled(run, journal, committed, on_tick, by_workers)
        return _ended(run, committed, stop, reporter, stats=stats, started=started)
    transport = transport_factory(transport_settings(preflight))
    auth = open_authenticator(preflight, transport_factory, transport_settings(preflight), stop)
    limiter = open_limiter(config, preflight.shared_limit)
    sender = _row_sender(preflight, run, start, transport, limiter, stop=stop, stats=stats, auth=auth)
    committed.pace = limiter.state
    streak = FailureStreak(config.halt.consecutive_failures, stop)
    rate = None if config.halt.failure_rate is None else FailureRate(config.halt.failure_rate, stop)
    batches = _batch_relay(
        preflight,
        transport,
        limiter,
        stop,
        stats,
        start=start,
        auth=auth,
        rate=rate,
        run=run,
    )
    records = _pending_records(preflight, start, stop, None if batches is None else batches.former.skipped)
    if limit is not None:
        records = limit.first_rows(records)
    journaled = start.journal.done if start.journal is not None else None  # for request.bulk_job's jobs
    bulk = open_bulk_relay(
        preflight,
        transport,
        limiter,
        stop,
        journal=run.journal_path,
        journaled=journaled,
        stats=stats,
        auth=auth,
    )

    if bulk is not None:  # its jobs in the progress, told as each of them moves on
        committed.jobs = bulk.counts
        bulk.on_change = lambda: reporter.update(committed.snapshot())
    reporter.update(committed.snapshot())

    async def send(background: TaskGroup) -> None:
        if bulk is None and batches is None:
            window = (sender, (streak, rate, None), config.execution.concurrency)
            await _one_request_a_row(records, window, journal, background)
        else:
            async with anyio.create_task_group() as workers:
                background.start_soon(_cancel_when_forced, stop, workers.cancel_scope)
                if bulk is not None:  # request.bulk_job: many rows a job (relay/bulkjobs/)
                    workers.start_soon(bulk.run, records, journal)
                elif batches is not None:  # request.batch: many rows a request (relay/batches.py)
                    batches.start(workers, records, journal, config.execution.concurrency)
        if limit is not None:
            limit.stop_if_reached(stop)
        if batches is not None:
            await batches.release(journal)

    try:
        await _journaled(run, journal, committed, on_tick, send)
    finally:
        records.close()
        with anyio.CancelScope(shield=True):
            await transport.aclose()
            await limiter.aclose()
            if auth is not None:
                await auth.aclose()
    return _ended(run, committed, stop, reporter, stats=stats, started=started)


async def _journaled(
    run: RunDir,
    journal: JournalWriter,
    committed: Committed,
    on_tick: Callable[[Snapshot], None] | None,
    send: Callable[[TaskGroup], Awaitable[None]],
) -> None:
    """`send` the rows while the journal commits their results and the checkpoint follows them."""
    try:
        async with anyio.create_task_group() as background:
            background.start_soon(journal.run)
            background.start_soon(_checkpointer, run, committed, on_tick or _no_tick)
            await send(background)
            await journal.close()
            background.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None


def _ended(
    run: RunDir,
    committed: Committed,
    stop: StopControl,
    reporter: Reporter,
    *,
    stats: RelayStats,
    started: float,
) -> RelayOutcome:
    """The run's last checkpoint and progress, and its outcome."""
    write_checkpoint(run.path, committed.checkpoint(), run.storage)
    reporter.update(committed.snapshot())
    return replace(_outcome(committed, stop, time.monotonic() - started), requests=stats.request_counts())


def _outcome(committed: Committed, stop: StopControl, elapsed: float) -> RelayOutcome:
    finished_all = committed.done == committed.total
    return RelayOutcome(
        stop_reason=None
        if finished_all and not _reported_anyway(stop)
        else stop.reason or StopReason.INCOMPLETE,
        committed=committed,
        elapsed_seconds=elapsed,
        stop_detail=dict(stop.detail),
        forced=stop.forced,
    )


def open_limiter(config: JobConfig, shared_url: str | None) -> Limiter:
    """The job's rate limit: shared by every shard through Redis (`rate_limit.shared`, resolved by
    preflight as `shared_url`), else our own."""
    rate = config.execution.rate_limit
    if rate is None or shared_url is None:
        return RateLimiter(rate.requests_per_second if rate else None)
    from bulkrelay.relay.ratelimit_redis import SharedRateLimiter  # redis loads only for a shared limit

    key = rate.shared_key or target_origin(config)
    shown = rate.shared if rate.shared != shared_url else None  # a ${NAME} secret is named, never shown
    return SharedRateLimiter(shared_url, key, rate.requests_per_second, shown=shown)


def target_origin(config: JobConfig) -> str:
    """scheme://host:port of the request URL: the default key of a shared limit (one target, one limit).
    Credentials in the URL are left out: the key is written to Redis."""
    parts = urlsplit(config.request.url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}" if "{" not in parts.netloc else config.request.url


def _delivery(preflight: Preflight, run: RunDir) -> str | None:
    """The scope of a delta or mirror run's idempotency keys: the run that delivers its rows. A delta
    job sends a row again only when its content differs from the last delivery's, which may be a
    content the target answered before under its content-only key (a revert A → B → A); a full job
    keeps the content-only key (docs/resume.md)."""
    if preflight.digester is None and not run.plan.mirror_deletes:
        return None
    return run.plan.delivery(run.run_id)


def _batch_scope(run: RunDir, delivery: str | None) -> str | None:
    """The scope of a batch run's request keys: its delivery's, and for a `retry-failed` run its own as
    well. A batch's rows fail inside an answer the target gave with a success status (an item 429, an
    item rejected, an answer that does not fit), which a target that keeps keys stores: under the
    parent's keys the child's requests of the same rows would be answered from that memory and never
    reach it again. The items keep their ids, so a target that dedups by item id applies none twice."""
    if run.plan.parent_run is None:
        return delivery
    return f"{delivery or ''} retry-failed {run.run_id}"  # a run id holds no space: no clash


def _row_sender(
    preflight: Preflight,
    run: RunDir,
    start: StartPoint,
    transport: Transport,
    limiter: Limiter,
    *,
    stop: StopControl,
    stats: RelayStats,
    auth: Authenticator | None,
) -> RowSender:
    config = preflight.job.config
    return RowSender(
        preflight=preflight,
        transport=transport,
        limiter=limiter,
        policy=RetryPolicy.from_config(config.retry, config.response, config.halt),
        stop=stop,
        stats=stats,
        auth=auth,
        delivery=_delivery(preflight, run),
        earlier=_earlier_sends(start, config),
    )


def _earlier_sends(start: StartPoint, config: JobConfig) -> EarlierSends | None:
    """The rows an earlier call of this run may have sent unjournaled (relay/earliersends.py); None for
    a call that starts its journal (a new run, a retry-failed run's first call)."""
    if start.journaled_through is None:
        return None
    batch = config.request.batch
    in_flight = config.execution.concurrency * (batch.max_items if batch is not None else 1)
    # An earlier call with workers may have run up to run_ahead_rows past its slowest worker's rows.
    ahead = run_ahead_rows(config.execution.concurrency)
    window = in_flight + MOST_UNCOMMITTED_ROWS + config.halt.consecutive_failures + ahead
    return EarlierSends(highest=start.journaled_through, window=window)


def _batch_relay(
    preflight: Preflight,
    transport: Transport,
    limiter: Limiter,
    stop: StopControl,
    stats: RelayStats,
    *,
    start: StartPoint,
    auth: Authenticator | None,
    rate: FailureRate | None,
    run: RunDir,
) -> BatchRelay | None:
    """A batch job's workers (request.batch); None for a job sending one row per request."""
    if preflight.batcher is None:
        return None
    config = preflight.job.config
    policy = RetryPolicy.from_config(config.retry, config.response, config.halt)
    sender = BatchSender(
        preflight,
        transport,
        limiter,
        policy,
        stop,
        stats=stats,
        auth=auth,
        delivery=_batch_scope(run, _delivery(preflight, run)),
        earlier=_earlier_sends(start, config),
    )
    journaled = start.journal.done if start.journal is not None else None
    retries = BatchRetries(run.path / RETRIES_FILE, run.storage)
    return BatchRelay(sender, stop, config.halt.consecutive_failures, journaled, rate, retries=retries)


async def relay_share(
    preflight: Preflight,
    run: RunDir,
    start: StartPoint,
    *,
    owns: Callable[[Record], bool],
    share: ChunkShare | None = None,
    concurrency: int,
    ahead: RunAhead,
    stop: StopControl,
    outbox: Outbox,
    limiter: Limiter,
    stats: RelayStats,
    transport_factory: Callable[[TransportSettings], Transport] = open_transport,
) -> None:
    """A worker process's share of a run (ops/relayworker.py): its pending rows, those it `owns`, sent
    one request each through `concurrency` slots of its own, each final result handed to `outbox`;
    with `share` (the input's chunks of rows that are this worker's) the reader yields only those,
    stepping over the other rows unparsed, and `owns` is not asked. The halt rules are judged by
    the run's process over every worker's rows (ops/workers.py): here `ahead` holds the rows its
    slots hold, for the row below which it has settled and the bound on how far it runs ahead of
    the slowest (relay/runahead.py)."""
    settings = transport_settings(preflight)
    transport = transport_factory(settings)
    auth = open_authenticator(preflight, transport_factory, settings, stop)
    sender = _row_sender(preflight, run, start, transport, limiter, stop=stop, stats=stats, auth=auth)
    pending = _pending_records(preflight, start, stop, share=share)
    records = pending if share is not None else (record for record in pending if owns(record))
    try:
        async with anyio.create_task_group() as background:
            window = (sender, (Unjudged(), None, ahead), concurrency)
            await _one_request_a_row(records, window, outbox, background)
            background.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise sole_error(group) from None
    finally:
        pending.close()
        with anyio.CancelScope(shield=True):
            await transport.aclose()
            if auth is not None:
                await auth.aclose()


async def _one_request_a_row(
    records: Iterator[Record],
    window: tuple[RowSender, RowHalts, int],
    outbox: Outbox,
    background: TaskGroup,
) -> None:
    """The window of a job sending one request a row: `concurrency` slots taking the records in turn
    (a forced stop cancels them, from `background`), then the failures the streak still holds, which
    are final unless it declared the target down."""
    sender, halts, concurrency = window
    async with anyio.create_task_group() as slots:
        background.start_soon(_cancel_when_forced, sender.stop, slots.cancel_scope)
        ahead = halts[2]
        for _ in range(concurrency):  # every slot's row held before any slot takes one
            cell = None if ahead is None else ahead.slot()
            slots.start_soon(_worker, records, sender, halts, outbox, cell)
    for admitted in halts[0].release():
        await outbox.submit(admitted)


async def _worker(
    records: Iterator[Record],
    sender: RowSender,
    halts: RowHalts,
    journal: Outbox,
    cell: list[float] | None,
) -> None:
    """One slot of the window: take the next pending record, see it to its end, hand over its result.
    In a worker process `cell` holds the slot's row (`row` in flight, `row + 1` once handed over), for
    the run-ahead bound and the row below which the worker has settled (relay/runahead.py)."""
    streak, rate, ahead = halts
    while not sender.stop.requested:
        record = next(records, None)
        if record is None:
            if cell is not None:
                cell[0] = math.inf  # this slot holds no row again: it holds back no turn
            return
        row = record.row_number
        if rate is not None:  # taken in row order: nothing awaits between next() and this
            rate.taken(row)
        if cell is not None and ahead is not None:
            cell[0] = row
            if not ahead.allows(row) and not await ahead.wait_for(row, sender.stop):
                return
        try:
            entry = await sender.send(record)
        except LimiterUnavailable as exc:  # never a local fallback: that could exceed the shared limit
            sender.stop.request(StopReason.HALT_LIMIT_UNAVAILABLE, limiter=exc.url, cause=exc.cause)
            return
        if entry is not None:
            for admitted in streak.admit(entry):
                if not journal.offer(admitted):  # queued at once, as nearly always: no await
                    await journal.submit(admitted)
                if rate is not None:
                    rate.ended(admitted)
            if cell is not None:
                cell[0] = row + 1  # after the hand-over: what the worker tells covers only results sent


def _no_tick(snapshot: Snapshot) -> None:
    pass


async def _checkpointer(run: RunDir, committed: Committed, on_tick: Callable[[Snapshot], None]) -> None:
    """Replace `checkpoint.json` soon after the first commit, then at most once a second."""
    last = (committed.seq, committed.offset)
    interval = FIRST_CHECKPOINT_SECONDS
    while True:
        on_tick(committed.snapshot())  # at once, then each second; observers keep their own cadence (10 s)
        await anyio.sleep(interval)
        if (committed.seq, committed.offset) != last:
            interval = CHECKPOINT_INTERVAL_SECONDS
            last = (committed.seq, committed.offset)
            live = committed.checkpoint(live=True)
            await anyio.to_thread.run_sync(write_checkpoint, run.path, live, run.storage)


def _reported_anyway(stop: StopControl) -> bool:
    """Stops that are the run's outcome even when every row got a result first (StopReason)."""
    return stop.reason is not None and stop.reason.outcome_even_when_all_rows_ended


async def _cancel_when_forced(stop: StopControl, scope: anyio.CancelScope) -> None:
    await stop.wait_forced()
    scope.cancel()
