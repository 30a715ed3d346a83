"""Delta sync: which rows changed since their last successful delivery.

A row's digest covers what the request means, not its bytes: the method, the URL, the headers as
the job file writes them (a `${NAME}` stays `${NAME}`, so rotating a token sends nothing; the
idempotency header is left out) and the body, a JSON body in canonical form (sorted keys). A row is
sent when the sync state holds no digest for its key, or a different one (docs/delta.md).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from bulkrelay._version import __version__
from bulkrelay.job.config import Job, JobConfig, config_semantic_dict
from bulkrelay.job.digest import DIGEST_SIZE, RequestDigester, key_text
from bulkrelay.job.fingerprint import canonical_bytes
from bulkrelay.job.inputs import InputFingerprint, InputSpec, changed_values, input_changed
from bulkrelay.job.positions import RowPositions, request_token
from bulkrelay.job.preflight import RowWatch
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.store.manifest import SyncRecord
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.rundir import RunDir
from bulkrelay.sync.linescan import LINE_DIGEST_SIZE, LineScan, LineScanFailed
from bulkrelay.sync.state import (
    LOOKUP_BATCH,
    SyncState,
    catch_up,
    job_identity,
    job_runs,
    manifest_identity,
)

_IN_FLIGHT = 4  # batches handed to the look-up thread and not answered yet
_LINE_SCHEME = "bulkrelay-delta-line-v1"


def line_salt(job: Job, spec: InputSpec, target: bytes = b"") -> bytes:
    """What a row's request depends on besides its record's bytes, for the line scan: the job as
    resume compares it (the input's path left out, its format and delimiter in), the input's format,
    the BulkRelay version (a new version may render a line differently) and, when a variable names
    it, the target (`RequestDigester.target`). A CSV's header line is added by the scan, which reads it."""
    parts: list[object] = [
        _LINE_SCHEME,
        __version__,
        spec.format,
        spec.gzip,
        spec.delimiter,
        config_semantic_dict(job.config),
    ]
    if target:
        parts.append(target.hex())
    return hashlib.sha256(canonical_bytes(parts)).digest()[:LINE_DIGEST_SIZE]


class _Batch(NamedTuple):
    """Up to `LOOKUP_BATCH` rows: their keys, digests (`DIGEST_SIZE` bytes each, in order; empty
    under `--full`), row numbers, lines, and the digests of their lines (`LINE_DIGEST_SIZE` each;
    empty without a line scan)."""

    keys: list[str]
    digests: bytes
    rows: array[int]
    lines: array[int]
    line_digests: bytes
    records: list[Record | None]  # with a line scan, the rows' records, kept while the changed are few


class DeltaSelector:
    """Fed every rendered record by preflight; collects the rows whose digest differs from the state.

    Keys are looked up `LOOKUP_BATCH` at a time, and the changed rows are kept as bits, so memory
    stays flat however long the input is. The look-ups run on a thread of their own, at most
    `_IN_FLIGHT` batches behind preflight: each is one SQLite step, during which the thread lets go
    of the GIL, so the B-tree work overlaps preflight's parsing. Call `close` when done.

    With a `salt` (`line_salt`; a delta run, not `--full`, not mirror), a line scan
    (sync/linescan.py) runs beside preflight and names the lines whose bytes the state knows as
    delivered: their rows are settled, unchanged without a render, a digest or a look-up. The other
    rows go the full way, and what preflight finds of them teaches the state their lines
    (`SyncState.learn_lines`, `keep_lines`), for the next night."""

    def __init__(
        self,
        state: SyncState,
        key_field: str,
        *,
        select: bool,
        remember_keys: bool,
        salt: Callable[[InputSpec, bytes], bytes] | None,
    ) -> None:
        self._state = state
        self._key_field = key_field
        self.selects = select  # False under --full: every row is sent
        self._remember_keys = remember_keys  # sync: mirror: tonight's keys, to find the ones gone
        self._salt = salt if select and not remember_keys else None
        self._scan: LineScan | None = None
        self._spec: InputSpec | None = None
        self._keys: list[str] = []  # the pending batch, as `_Batch` holds it
        self._digests = bytearray()
        self._rows = array("q")
        self._lines = array("q")
        self._line_digests = bytearray()
        self._records: list[Record | None] = []
        self._bits = bytearray(1)
        self.changed = 0
        # the changed rows, while they are few; with a line scan their records too (few are read)
        self.positions = RowPositions(by_request=True, keep_records=self._salt is not None)
        self._lookups = ThreadPoolExecutor(1, thread_name_prefix="delta-lookup")  # one: in order
        self._in_flight: deque[tuple[_Batch, Future[list[int]]]] = deque()

    def watch(self, digester: RequestDigester, spec: InputSpec) -> RowWatch:
        """What preflight tells the selector of each record. What it keeps of a row holds no object
        the garbage collector tracks (no record, no request): keeping each row's (record, request)
        until its batch was answered set off 3,668 collections, 31 of them full, in 1M rows (0.6 s).
        With a line scan, a row whose line the state knows is settled: not rendered, not kept."""
        keys, key_field, digest, selects = self._keys, self._key_field, digester.digest, self.selects
        add_key, add_digest, add_row, add_line = (
            keys.append,
            self._digests.extend,
            self._rows.append,
            self._lines.append,
        )

        def observe(record: Record, request: PreparedRequest) -> None:
            row, line, fields = record
            key = fields.get(key_field)
            add_key(key if type(key) is str else key_text(key))
            add_row(row)
            add_line(line)
            if selects:
                add_digest(digest(request, fields))
            if len(keys) >= LOOKUP_BATCH:
                self._flush()

        if self._salt is None or digester.target_varies:  # a field in the host: no line stands alone
            return RowWatch(observe)
        self._spec = spec
        salt = self._salt(spec, digester.target)
        scan = self._scan = LineScan(spec, self._key_field, salt=salt, state=self._state.path)
        add_line_digest, add_record, size = self._line_digests.extend, self._records.append, LINE_DIGEST_SIZE
        positions = self.positions

        def settled(record: Record) -> bool:
            line = record[1]
            if line >= scan.end:
                scan.advance(line)
            return scan.marks[line - scan.start] == 1  # records come in line order: never before the window

        def observe_unsettled(record: Record, request: PreparedRequest) -> None:
            at = record[1] - scan.start  # `settled` has just moved the window to this line
            add_line_digest(scan.digests[at * size : (at + 1) * size])
            add_record(record if positions.records is not None else None)
            observe(record, request)

        return RowWatch(observe_unsettled, settled)

    def _flush(self) -> None:
        """Hand the pending batch to the look-up thread; take in the answers more than
        `_IN_FLIGHT` batches old (memory stays bounded when the thread falls behind)."""
        if not self._keys:
            return
        batch = _Batch(
            self._keys.copy(),
            bytes(self._digests),
            self._rows[:],
            self._lines[:],
            bytes(self._line_digests),
            self._records.copy(),
        )
        self._keys.clear()  # emptied, not replaced: the observer holds them
        self._digests.clear()
        self._line_digests.clear()
        self._records.clear()
        del self._rows[:], self._lines[:]
        self._in_flight.append((batch, self._lookups.submit(self._look_up, batch)))
        while len(self._in_flight) > _IN_FLIGHT:
            self._take_answer()

    def _look_up(self, batch: _Batch) -> list[int]:
        """On the look-up thread: the positions of the changed keys in one batch."""
        if self._remember_keys:
            self._state.remember_seen(batch.keys)
        if not self.selects:
            return []
        if batch.line_digests:
            self._state.learn_lines(batch.keys, batch.digests, batch.line_digests)
        return self._state.changed_among(batch.keys, batch.digests)

    def _take_answer(self) -> None:
        batch, answer = self._in_flight.popleft()
        self._mark_changed(batch, answer.result())  # a look-up's error is raised here

    def _mark_changed(self, batch: _Batch, changed: list[int]) -> None:
        bits, positions = self._bits, self.positions
        for at in changed:
            row = batch.rows[at]
            index = row >> 3
            if index >= len(bits):
                bits.extend(bytes(index + 1 - len(bits)))
            bits[index] |= 1 << (row & 7)
            self.changed += 1
            digest = batch.digests[at * DIGEST_SIZE : (at + 1) * DIGEST_SIZE]
            record = batch.records[at] if batch.records else None
            positions.add(row, batch.lines[at], request_token(batch.keys[at], digest), record)

    def selection(self, fingerprint: InputFingerprint) -> RowSet:
        """The changed rows among the input's records, once preflight has read it (`fingerprint`)."""
        self._flush()
        while self._in_flight:
            self._take_answer()
        if self._scan is not None:
            self._check_scan(self._scan, fingerprint)
        size = fingerprint.record_count
        length = size // 8 + 1
        data = bytes(self._bits[:length]).ljust(length, b"\0")
        return RowSet.from_bytes(size, data)

    def _check_scan(self, scan: LineScan, fingerprint: InputFingerprint) -> None:
        """Keep the choice only if the scan read the bytes preflight read; then the lines learned
        are true of this input, and go into the state."""
        assert self._spec is not None
        try:
            size, _, sha256 = scan.finish()
        except LineScanFailed:
            if scan.marked:  # rows were taken as unchanged on its word: choose again without it
                raise
            return  # every row went the full way: the choice stands, nothing is learned
        was = {"size": fingerprint.size, "sha256": fingerprint.sha256}
        changed = changed_values(was, {"size": size, "sha256": sha256})
        if changed:
            raise input_changed(self._spec.display_name, "while preflight read it", changed)
        self._state.keep_lines()

    def close(self) -> None:
        """Stop the look-up thread (before the state it reads is closed) and the line scan."""
        self._lookups.shutdown(wait=True, cancel_futures=True)
        self._in_flight.clear()
        if self._scan is not None:
            self._scan.close()


class DeltaStart:
    """A delta job's state, caught up with every journal no process holds, and (unless `--full`) the
    selector that preflight feeds. Close it once the selection is made."""

    def __init__(self, job: Job, runs_dir: Path, *, full: bool, scan_lines: bool = True) -> None:
        identity = job_identity(job.config.name, job.path)
        self.state = SyncState.for_job(runs_dir, identity)
        catch_up(self.state, job_runs(runs_dir, identity))
        key_field = job.config.input.key
        assert key_field is not None  # the config refuses a delta job without input.key
        self.full = full
        self.mirror = job.config.mirror
        self.selector: DeltaSelector | None = None
        if not full or self.mirror is not None:
            self.selector = DeltaSelector(
                self.state,
                key_field,
                select=not full,
                remember_keys=self.mirror is not None,
                salt=(lambda spec, target: line_salt(job, spec, target)) if scan_lines else None,
            )

    def selection(self, fingerprint: InputFingerprint) -> RowSet | None:
        """The rows to send (None: all of them, under `--full`)."""
        if self.selector is None:
            return None
        rows = self.selector.selection(fingerprint)  # also the last batch of keys, seen or looked up
        return None if self.full else rows

    def close(self) -> None:
        if self.selector is not None:
            self.selector.close()
        self.state.close()


def shared_slot(config: JobConfig) -> str | None:
    """What a job's live slot is keyed by besides its file (store/liverun.py): a delta or mirror job
    with a `name` keeps its sync state under that name, which other job files may share; they must
    not relay together (each would send every changed row), so they share one slot too."""
    if config.execution.sync == "full" or not config.name:
        return None
    return job_identity(config.name, "")


def open_delta(job: Job, runs_dir: Path, *, full: bool, scan_lines: bool = True) -> DeltaStart | None:
    if job.config.execution.sync == "full":
        return None
    return DeltaStart(job, runs_dir, full=full, scan_lines=scan_lines)


def sync_manifest(job: Job, changed: RowSet | None, sent: RowSet | None, rows_for: int) -> SyncRecord:
    """What the run manifest records of a delta run: its mode and how many rows it skipped.
    `changed`: the changed rows (None under `--full`); `sent`: the rows this run sends (a shard's
    changed rows); `rows_for`: the rows this run is for (a shard's own, else every record)."""
    selected = rows_for if changed is None or sent is None else len(sent)
    return SyncRecord(
        mode=job.config.execution.sync,
        full=changed is None,
        selected=selected,
        skipped_unchanged=rows_for - selected,
    )


def record_deliveries(run: RunDir) -> None:
    """After a delta run's relay: its committed successes go into the sync state."""
    identity = manifest_identity(run.plan)
    with SyncState.for_job(run.path.parent, identity) as state:
        state.apply_run(run)
