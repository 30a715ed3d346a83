"""The engine in-process, with fake transports and storage: the window, the end state, storage failure."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from bulkrelay.errors import StorageFailed
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import PreparedRequest
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay.engine import (
    RelayOutcome,
    StartPoint,
    relay,
    target_origin,
    transport_settings,
)
from bulkrelay.relay.failurestreak import FailureStreak
from bulkrelay.relay.progress import NullReporter, Snapshot
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.relay.transport.base import Response, TransportSettings
from bulkrelay.relay.transport.mock import MockTransport
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.journal import JournalEntry, decode_line, is_commit_marker, read_journal
from bulkrelay.store.rundir import RunDir
from tests.taggedjobs import write_job

_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class _CountingTransport(MockTransport):
    """Answers 200 after a short sleep and remembers the most requests it ever had in flight."""

    def __init__(self, delay: float = 0.002) -> None:
        super().__init__(self._answer)
        self.delay = delay
        self.in_flight = 0
        self.most_in_flight = 0
        self.sent = 0

    async def _answer(self, request: PreparedRequest) -> Response:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await anyio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        self.sent += 1
        return Response(200, _HEADERS, b'{"id":"x"}')


class _Recorder:
    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    def update(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    def close(self) -> None:
        pass


def _setup(tmp_path: Path, rows: int, concurrency: int) -> tuple[Any, RunDir]:
    job_path = write_job(tmp_path, "http://127.0.0.1:9", rows=rows, execution={"concurrency": concurrency})
    preflight = run_preflight(load_job(job_path), None)
    run = RunDir.create(tmp_path / "runs", plan_for(preflight))
    return preflight, run


async def _relay(preflight: Any, run: RunDir, transport: _CountingTransport, **kw: Any) -> RelayOutcome:
    def factory(settings: TransportSettings) -> _CountingTransport:
        assert settings.concurrency == preflight.job.config.execution.concurrency
        return transport

    return await relay(
        preflight,
        run,
        StartPoint(),
        stop=kw.pop("stop", None) or StopControl(),
        reporter=kw.pop("reporter", NullReporter()),
        transport_factory=factory,
    )


@pytest.mark.parametrize(("headers", "decompress"), [({}, False), ({"accept-ENCODING": "gzip"}, True)])
def test_answers_are_decompressed_only_when_the_job_sends_accept_encoding(
    tmp_path: Path, headers: dict[str, str], decompress: bool
) -> None:
    job_path = write_job(
        tmp_path,
        "http://127.0.0.1:9",
        request={"headers": headers},
        execution={"concurrency": 3, "http2": True, "timeout": {"read_seconds": 7}},
    )
    settings = transport_settings(run_preflight(load_job(job_path), None))
    assert (settings.decompress, settings.http2, settings.concurrency) == (decompress, True, 3)
    assert settings.read_seconds == 7


@pytest.mark.anyio
async def test_at_most_concurrency_rows_in_flight_and_every_row_committed(tmp_path: Path) -> None:
    preflight, run = _setup(tmp_path, rows=500, concurrency=7)
    transport = _CountingTransport()
    reporter = _Recorder()
    outcome = await _relay(preflight, run, transport, reporter=reporter)
    assert outcome.stop_reason is None
    assert transport.most_in_flight == 7
    assert transport.sent == 500
    lines = run.journal_path.read_bytes().splitlines(keepends=True)
    assert [decode_line(line)[0] for line in lines if not is_commit_marker(line)] == list(range(1, 501))
    assert sorted(e.row_number for e in read_journal(run.journal_path)) == list(range(1, 501))
    checkpoint = read_checkpoint(run.path)
    assert checkpoint is not None
    assert (checkpoint.seq, checkpoint.rows_done, checkpoint.ok) == (500, 500, 500)
    assert checkpoint.offset == run.journal_path.stat().st_size
    # progress only ever moves forward, and ends at the committed total
    done = [s.done for s in reporter.snapshots]
    assert done == sorted(done) and done[-1] == 500


@pytest.mark.anyio
async def test_a_stop_request_lets_in_flight_rows_finish(tmp_path: Path) -> None:
    preflight, run = _setup(tmp_path, rows=1000, concurrency=4)
    transport = _CountingTransport(delay=0.01)
    stop = StopControl()

    async def stop_soon() -> None:
        await anyio.sleep(0.1)
        stop.request(StopReason.INTERRUPTED)

    async with anyio.create_task_group() as group:
        group.start_soon(stop_soon)
        outcome = await _relay(preflight, run, transport, stop=stop)
    assert outcome.stop_reason == "interrupted" and not outcome.forced
    assert transport.in_flight == 0
    assert len(list(read_journal(run.journal_path))) == transport.sent == outcome.committed.done
    assert 0 < outcome.committed.done < 1000


def test_a_failed_journal_fsync_ends_the_run_without_advancing_the_checkpoint(tmp_path: Path) -> None:
    preflight, run = _setup(tmp_path, rows=5000, concurrency=8)
    storage = FaultyStorage(only="results.jsonl", fail_fsync_after_s=1.3)
    run.storage = storage
    transport = _CountingTransport(delay=0.004)
    with pytest.raises(StorageFailed) as caught:  # the error itself, not a task group wrapping it
        anyio.run(_relay, preflight, run, transport)
    assert caught.value.context["operation"] == "fsync"
    checkpoint = read_checkpoint(run.path)
    assert checkpoint is not None  # written once a second while the disk was fine
    assert 0 < checkpoint.offset <= storage.synced_sizes[-1] < run.journal_path.stat().st_size
    committed = run.journal_path.read_bytes()[: checkpoint.offset].splitlines(keepends=True)
    assert is_commit_marker(committed[-1])  # the frontier is a group's end
    assert checkpoint.rows_done == len([line for line in committed if not is_commit_marker(line)])
    assert checkpoint.rows_done < 5000


def _finished(row: int, classification: str) -> JournalEntry:
    success = classification == "success"
    return JournalEntry(
        row_number=row,
        success=success,
        classification=classification,
        status_code=200 if success else None,
        attempts=1,
        retryable=not success,
        error=None if success else classification,
        duration_ms=1.0,
    )


def _window_shuffles(rows: list[int], window: int, count: int) -> list[list[int]]:
    """`count` completion orders of `rows`, each row finishing at most `window` places from its start."""
    rng = random.Random(11)
    orders = []
    for _ in range(count):
        keyed = sorted(rows, key=lambda row: rows.index(row) + rng.uniform(0, window))
        orders.append(keyed)
    return orders


@pytest.mark.anyio
async def test_the_failure_streak_counts_in_row_order_whatever_the_completion_order() -> None:
    # Rows 1-10 succeed, rows 11-30 answer 503; with four rows in flight they complete in any order.
    # However late row 10's success arrives, it precedes the streak: the run halts and no 503 is final.
    outcomes = {row: "success" if row <= 10 else "http_server_error" for row in range(1, 31)}
    for order in _window_shuffles(list(outcomes), window=4, count=300):
        stop = StopControl()
        streak = FailureStreak(5, stop)
        admitted = [kept for row in order for kept in streak.admit(_finished(row, outcomes[row]))]
        admitted += streak.release()
        assert stop.reason == StopReason.HALT_UNAVAILABLE, order
        assert all(entry.success for entry in admitted), order
        assert stop.detail["consecutive_failures"] == 5


@pytest.mark.anyio
async def test_a_failure_followed_in_row_order_by_another_outcome_is_final() -> None:
    stop = StopControl()
    streak = FailureStreak(3, stop)
    assert streak.admit(_finished(2, "http_server_error")) == []  # may start a streak: held
    assert [e.row_number for e in streak.admit(_finished(3, "success"))] == [2, 3]  # row 3 ended it
    assert [e.row_number for e in streak.admit(_finished(1, "timeout_error"))] == [1]  # before row 3
    assert streak.admit(_finished(4, "connect_error")) == []
    assert streak.admit(_finished(5, "http_server_error")) == []
    assert [e.row_number for e in streak.release()] == [4, 5]  # no halt: they are real results
    assert stop.reason is None


def test_the_default_key_of_a_shared_limit_is_the_targets_origin_without_credentials(tmp_path: Path) -> None:
    job_path = write_job(tmp_path, "http://app:s3cret@127.0.0.1:9")
    assert target_origin(load_job(job_path).config) == "http://127.0.0.1:9"
