"""Bulk mode's half of the pipeline: pending rows ─► jobs ─► each row's result, one journal group a job.

A job takes the run's pending rows in input order (rows an earlier job left unprocessed first) and
closes before the row that would take its CSV past `max_bytes` or its rows past `max_rows`, as a batch
does. Its life, each step journaled (store/journal/jobrecords.py) and fsynced before the next begins:

    create ─► record `created` (the target's job id, its rows and their keys) ─► upload the CSV ─►
    `uploaded` ─► close ─► `closed` ─► poll ─► `state` ─► fetch the results ─► the rows' lines ─► `results`

So the job id is durable before any byte of its data leaves, and a crash anywhere leaves a journal that
says what to do. The one exception is a generic job whose upload makes the job (no `create`, which the
job file allows only with `resubmit: safe`): `submitting` (its rows and keys) is durable before the
request and `created` after its answer, and a job lost between the two has its rows submitted again.
Before sending anything new, the driver attaches to every job the journal names whose results are not
journaled: it asks the target for the job's state (a close may have landed though its answer was lost);
a job still `Open` is aborted (its rows go in the next job formed), and one never journaled closed that
is `Aborted` already is taken as aborted the same way (an abort landed, then the process died before its
`aborted` record: the job never ran, so its rows are no failures); one closed or later is polled and its
results fetched, never submitted again. Rows count as done only when their result line is committed;
rows a job left unprocessed go in a later job, at most `retry.max_attempts` jobs in all.

A delta job's rows (`execution.sync: delta`, docs/delta.md) are the changed ones preflight chose; each
row's line carries the digest of its request (its CSV line under the job's settings), which the sync
state learns once the line is committed, as for a row sent alone. The digests are in the job's
`created` record too, so a resume's attached job gives its rows' lines theirs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Container, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from bulkrelay.job.bulkcsv import BulkCsv
from bulkrelay.job.digest import RequestDigester
from bulkrelay.job.records import Record
from bulkrelay.relay.bulkjobs.steps import (
    ABORTED,
    FAILED,
    OPEN,
    TERMINAL,
    BulkApi,
    JobForgotten,
    JobResults,
    StepRefused,
    StepStopped,
)
from bulkrelay.relay.progress import JobCounts
from bulkrelay.relay.retry import BATCH_ANSWER_INVALID, ITEM_REJECTED, SUCCESS
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry, JournalWriter, entry_of
from bulkrelay.store.journal.jobrecords import JobLedger, encode_job_record, row_ranges

BULK_JOB_FAILED = "http_client_error"  # a job Failed, Aborted or forgotten: its rows fail with its error


@dataclass(slots=True)
class BulkRow:
    """One pending row of a bulk job: its number, key (as the input holds it, and as the CSV cell
    the results name it by) and CSV line; `jobs`: the jobs of this call it went in."""

    row: int
    key: Any
    text: str
    line: bytes = b""
    jobs: int = 0
    digest: str | None = None  # a delta job's: the row's request digest (hex)


class BulkJobRelay:
    """The bulk jobs of one relay: attach to the journal's unfinished ones, then form and run new ones."""

    def __init__(
        self,
        bulk: BulkCsv,
        api: BulkApi,
        stop: StopControl,
        *,
        ledgers: dict[int, JobLedger],
        journaled: Container[int] | None,
        max_attempts: int,
        digester: RequestDigester | None = None,
    ) -> None:
        self._bulk = bulk
        self._api = api
        self._stop = stop
        self._ledgers = ledgers
        self._journaled = journaled
        self._max_attempts = max_attempts
        self._digester = digester  # a delta job's: each row's line carries its request digest
        self._next_number = max(ledgers, default=0) + 1
        self._done_now: set[int] = set()  # rows journaled by this process
        self._carried: deque[BulkRow] = deque()  # rows a job left unprocessed, for the next one
        self._phases = {number: _phase(ledger.events) for number, ledger in ledgers.items()}
        self.on_change: Callable[[], None] = _nothing  # told when a job moves on (the progress)
        self._polls = 0  # answered, this call: a job still working moves the run on (idleness)

    def counts(self) -> JobCounts:
        """The run's jobs so far, from its journal's records and this call's."""
        phases = list(self._phases.values())
        return JobCounts(
            len(phases),
            phases.count("processing"),
            phases.count("done"),
            phases.count("aborted"),
            self._polls,
        )

    async def _record(self, journal: JournalWriter, number: int, event: str, **fields: Any) -> None:
        """Commit one of job `number`'s records (fsynced before the next step begins), and say so."""
        await journal.commit_record(encode_job_record(number, event, **fields))
        self._phases[number] = _phase([self._phases.get(number, "open"), event])
        self.on_change()

    async def run(self, records: Iterator[Record], journal: JournalWriter) -> None:
        self._api.deadline = time.monotonic() + self._bulk.config.poll.max_wait
        try:
            for ledger in list(self._ledgers.values()):
                if not ledger.ended and not self._stop.requested:
                    await self._attach(ledger, journal)
            while not self._stop.requested and (rows := self._take(records)):
                await self._run_job(rows, journal)
        except StepStopped:
            if not self._stop.requested:  # the deadline: stop where a resume polls on
                wait = self._bulk.config.poll.max_wait
                why: dict[str, object] = {"limit": "request.bulk_job.poll.max_wait", "seconds": wait}
                if self._api.unreadable is not None:  # what kept it asking: an answer that could not be read
                    why["unreadable"] = self._api.unreadable
                self._stop.request(StopReason.TIMEOUT, **why)

    # ------------------------------------------------------------ forming jobs

    def _take(self, records: Iterator[Record]) -> list[BulkRow]:
        """The next job's rows: carried rows first, then the input's, up to max_rows and max_bytes."""
        config, bulk = self._bulk.config, self._bulk
        rows: list[BulkRow] = []
        size = len(bulk.header)
        while len(rows) < config.max_rows:
            row = self._carried.popleft() if self._carried else self._next_row(records)
            if row is None:
                break
            if rows and size + len(row.line) > config.max_bytes:
                self._carried.appendleft(row)  # it opens the next job
                break
            rows.append(row)
            size += len(row.line)
        return rows

    def _next_row(self, records: Iterator[Record]) -> BulkRow | None:
        key_field = self._bulk.key_field
        for record in records:
            if record.row_number in self._done_now:
                continue  # journaled while attaching to an earlier process's job
            text, line = self._bulk.line(record)
            row = BulkRow(record.row_number, record.fields.get(key_field), text, line)
            if self._digester is not None:  # as preflight digested it, to choose the row
                row.digest = self._digester.digest(self._bulk.item_request(record), record.fields).hex()
            return row
        return None

    # ------------------------------------------------------------ one job's life

    async def _run_job(self, rows: list[BulkRow], journal: JournalWriter) -> None:
        rows.sort(key=lambda row: row.row)
        body = self._bulk.body([row.line for row in rows])
        started = time.monotonic()
        for row in rows:
            row.jobs += 1
        error: StepRefused | None = None
        submit = self._api.submitter
        for _ in range(self._max_attempts):
            try:
                made = (
                    self._created(rows, journal)
                    if submit is None
                    else self._submitted(submit, rows, body, journal)
                )
                number, remote = await made
            except StepRefused as refused:
                error = refused
                if submit is not None:
                    continue  # an upload that makes the job is never sent twice to one: another job
                break
            try:
                if submit is None:
                    await self._api.upload(remote, body)
                    await self._record(journal, number, "uploaded")
                await self._api.close(remote)
            except StepRefused as refused:  # an upload is never sent twice: this job goes, another is made
                error = refused
                await self._abort(number, remote, journal)
                continue
            await self._record(journal, number, "closed")
            await self._finish(number, remote, rows, journal, started, {row.text for row in rows})
            return
        await self._fail(rows, journal, str(error), started, BULK_JOB_FAILED, error.status if error else None)

    async def _created(self, rows: list[BulkRow], journal: JournalWriter) -> tuple[int, str]:
        number = self._next_number
        remote = await self._api.create(number, [r.text for r in rows])
        self._next_number = number + 1
        # durable before any byte of the job's data leaves
        await self._record(journal, number, "created", remote=remote, **self._rows_fields(rows))
        return number, remote

    async def _submitted(
        self,
        submit: Callable[[bytes], Awaitable[str]],
        rows: list[BulkRow],
        body: bytes,
        journal: JournalWriter,
    ) -> tuple[int, str]:
        """A job whose data leaves in the request that makes it (the job file said `resubmit: safe`):
        `submitting`, its rows and keys, is durable before the request, and `created`, its id, after the
        answer. A crash between the two leaves a job that cannot be found again: resume abandons it and
        its rows are submitted again (at-least-once). A submit refused, or whose answer is lost, is
        abandoned the same way at once."""
        number = self._next_number
        self._next_number = number + 1
        fields = self._rows_fields(rows)
        await self._record(journal, number, "submitting", **fields)
        try:
            remote = await submit(body)
        except StepRefused as refused:
            await self._record(journal, number, "aborted", why=f"the submit failed: {refused}")
            raise
        await self._record(journal, number, "created", remote=remote, **fields)
        await self._record(journal, number, "uploaded")
        return number, remote

    def _rows_fields(self, rows: list[BulkRow]) -> dict[str, Any]:
        """A job's rows as its `created` (or `submitting`) record holds them: ranges, keys, digests."""
        fields: dict[str, Any] = {"rows": row_ranges([r.row for r in rows]), "keys": [r.key for r in rows]}
        if self._digester is not None:
            fields["digests"] = [r.digest for r in rows]
        return fields

    async def _abort(self, number: int, remote: str, journal: JournalWriter) -> None:
        """Abort a job never closed; one the target will not abort stays Open, so it never runs either."""
        with suppress(StepRefused):
            await self._api.abort(remote)
        await self._record(journal, number, "aborted")

    async def _attach(self, ledger: JobLedger, journal: JournalWriter) -> None:
        """An earlier process's job whose results are not journaled: asked first, never sent again."""
        done = self._journaled
        digests: list[str | None] = [*ledger.digests] if ledger.digests else [None] * len(ledger.rows)
        rows = [
            BulkRow(row, key, self._bulk.key_text(key), digest=digest)
            for row, key, digest in zip(ledger.rows, ledger.keys, digests, strict=False)
            if done is None or row not in done
        ]
        if not rows:  # its rows' lines are committed; only its last record was lost
            await self._record(journal, ledger.job, "results")
            return
        if not ledger.remote:  # `submitting`, its answer never journaled: it cannot be found again
            why = "submitted, but its id was never journaled: its rows are submitted again (resubmit: safe)"
            await self._record(journal, ledger.job, "aborted", why=why)
            return
        started = time.monotonic()
        try:
            state, _ = await self._api.state(ledger.remote)
        except JobForgotten as forgotten:
            if not ledger.closed:  # never closed: it never ran, and never will
                await self._record(journal, ledger.job, "aborted")
                return
            await self._fail(rows, journal, str(forgotten), started, BULK_JOB_FAILED, 404, ledger.job)
            return
        except StepRefused as refused:  # what became of it cannot be known: its rows fail, for retry-failed
            status = refused.status
            await self._fail(rows, journal, str(refused), started, BULK_JOB_FAILED, status, ledger.job)
            return
        if state == OPEN:
            await self._abort(ledger.job, ledger.remote, journal)  # its rows go in the next job formed
            return
        if state == ABORTED and not ledger.closed:  # our abort landed, its record did not: it never ran
            await self._record(journal, ledger.job, "aborted")  # its rows: the next job, counted aborted
            return
        sent = {self._bulk.key_text(key) for key in ledger.keys}  # its rows already journaled too
        await self._finish(ledger.job, ledger.remote, rows, journal, started, sent)

    async def _finish(  # noqa: PLR0917 (the job, its rows and the keys it was sent)
        self,
        number: int,
        remote: str,
        rows: list[BulkRow],
        journal: JournalWriter,
        started: float,
        sent: set[str],
    ) -> None:
        """Poll the closed job to its end, then journal each row's result (unprocessed rows carried)."""
        try:
            state, error = await self._polled(remote)
        except StepRefused as refused:  # forgotten (404) or refused: its rows fail with the answer
            await self._fail(rows, journal, str(refused), started, BULK_JOB_FAILED, refused.status, number)
            return
        await self._record(journal, number, "state", state=state, error=error)
        if state in (FAILED, ABORTED):
            message = f"bulk job {remote} {state}: {error or 'no errorMessage'}"
            await self._fail(rows, journal, message, started, BULK_JOB_FAILED, None, number)
            return
        try:
            results = await self._api.results(remote, sent)
        except StepRefused as refused:
            await self._fail(rows, journal, str(refused), started, BATCH_ANSWER_INVALID, None, number)
            return
        entries = self._entries(rows, results, started)
        if entries:
            await journal.submit_group(lambda first_seq: entries)
        self._done_now.update(entry.row_number for entry in entries)
        await self._record(journal, number, "results")

    async def _polled(self, remote: str) -> tuple[str, str | None]:
        delay = self._bulk.config.poll.first_seconds
        while True:
            state, error = await self._api.state(remote)
            self._polls += 1
            self.on_change()
            if state in TERMINAL:
                return state, error
            await self._api.pause(delay)
            delay = min(delay * 2, self._bulk.config.poll.max_seconds)

    def _entries(self, rows: list[BulkRow], results: JobResults, started: float) -> list[JournalEntry]:
        duration = (time.monotonic() - started) * 1000
        entries = []
        for row in rows:
            captured = results.succeeded.get(row.text)
            if captured is not None:
                entries.append(_entry(row, True, SUCCESS, None, duration, captured))
            elif (error := results.failed.get(row.text)) is not None:
                entries.append(_entry(row, False, ITEM_REJECTED, error, duration))
            elif not row.line:
                continue  # unprocessed by an earlier process's job: the input yields it again, pending
            elif row.jobs >= self._max_attempts:
                error = f"unprocessed by {row.jobs} bulk jobs"
                entries.append(_entry(row, False, ITEM_REJECTED, error, duration, retryable=True))
            else:
                self._carried.append(row)  # it goes in the next job
        return entries

    async def _fail(  # noqa: PLR0917 (the failure's parts)
        self,
        rows: list[BulkRow],
        journal: JournalWriter,
        error: str,
        started: float,
        classification: str,
        status: int | None,
        number: int | None = None,
    ) -> None:
        duration = (time.monotonic() - started) * 1000
        entries = [_entry(row, False, classification, error, duration, status=status) for row in rows]
        await journal.submit_group(lambda first_seq: entries)
        self._done_now.update(row.row for row in rows)
        if number is not None:
            await self._record(journal, number, "results")


def _phase(events: list[str]) -> str:
    """Where a job stands after these records (or phases): open, processing, done or aborted."""
    if "results" in events or "done" in events:
        return "done"
    if "aborted" in events:
        return "aborted"
    return "processing" if "closed" in events or "processing" in events else "open"


def _nothing() -> None:
    pass


def _entry(  # noqa: PLR0917
    row: BulkRow,
    success: bool,
    classification: str,
    error: str | None,
    duration_ms: float,
    captured: dict[str, Any] | None = None,
    *,
    retryable: bool = False,
    status: int | None = None,
) -> JournalEntry:
    code = status if status is not None else 200
    return entry_of(
        row.row, success, classification, code, row.jobs or 1, retryable, error, duration_ms,
        None, row.key, None, captured, None, row.digest, None,
    )  # fmt: skip
