"""`run --limit N` in the engine (relay/stopping.py RowLimit): the first N pending rows are sent, each of
them whole, then the run stops with StopReason.LIMIT; a later call without a limit sends the rest, none
of the first N again; with N or fewer rows pending the run simply completes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from multidict import CIMultiDict, CIMultiDictProxy

from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import PreparedRequest
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.ops.resume import recover_start
from bulkrelay.relay.engine import RelayOutcome, StartPoint, relay
from bulkrelay.relay.progress import NullReporter
from bulkrelay.relay.stopping import RowLimit, StopControl, StopReason
from bulkrelay.relay.transport.base import Response
from bulkrelay.relay.transport.mock import MockTransport
from bulkrelay.store.journal import read_journal
from bulkrelay.store.rundir import RunDir
from tests.taggedjobs import write_job

_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class _Target(MockTransport):
    """Answers 200 and counts each row id it was sent."""

    def __init__(self) -> None:
        super().__init__(self._answer)
        self.sent: Counter[bytes] = Counter()

    async def _answer(self, request: PreparedRequest) -> Response:
        self.sent[request.body or b""] += 1
        return Response(200, _HEADERS, b"{}")


def _run(tmp_path: Path, rows: int, **execution: Any) -> tuple[Any, RunDir]:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=rows, execution={"concurrency": 4, **execution})
    preflight = run_preflight(load_job(job), None)
    return preflight, RunDir.create(tmp_path / "runs", plan_for(preflight))


def _relay(preflight: Any, run: RunDir, fake: _Target, start: StartPoint, limit: int | None) -> RelayOutcome:
    # `fake`, not `target`: test_fast_lane.py reads an argument named `target` as conftest.py's
    # process-starting fixture.
    async def go() -> RelayOutcome:
        return await relay(
            preflight,
            run,
            start,
            stop=StopControl(),
            reporter=NullReporter(),
            transport_factory=lambda _settings: fake,
            limit=None if limit is None else RowLimit(limit),
        )

    return anyio.run(go)


def _journaled(run: RunDir) -> list[int]:
    return sorted(entry.row_number for entry in read_journal(run.journal_path))


def test_the_first_n_rows_are_sent_then_the_run_stops_and_continues_without_them(tmp_path: Path) -> None:
    preflight, run = _run(tmp_path, rows=30)
    target = _Target()

    canary = _relay(preflight, run, target, StartPoint(), limit=10)

    assert canary.stop_reason is StopReason.LIMIT
    assert canary.stop_detail == {"limit": 10}
    assert (canary.committed.done, canary.committed.total) == (10, 30)
    assert _journaled(run) == list(range(1, 11))
    assert target.sent.total() == 10

    with run.locked():
        start, _ = recover_start(run, preflight.record_count)
        rest = _relay(preflight, run, target, start, limit=None)

    assert rest.stop_reason is None
    assert _journaled(run) == list(range(1, 31))
    assert target.sent.total() == 30 and set(target.sent.values()) == {1}  # no row sent twice


def test_rows_held_by_the_rate_limit_are_still_sent(tmp_path: Path) -> None:
    """The stop comes after the N rows have their results: one asked for when row N+1 was read would
    end the rate limit's wait of the rows before it, leaving them unsent."""
    preflight, run = _run(tmp_path, rows=12, rate_limit={"requests_per_second": 20})
    target = _Target()

    outcome = _relay(preflight, run, target, StartPoint(), limit=6)

    assert outcome.stop_reason is StopReason.LIMIT
    assert _journaled(run) == list(range(1, 7))
    assert target.sent.total() == 6


def test_a_limit_at_or_above_the_rows_pending_completes_the_run(tmp_path: Path) -> None:
    preflight, run = _run(tmp_path, rows=8)

    outcome = _relay(preflight, run, _Target(), StartPoint(), limit=8)

    assert outcome.stop_reason is None
    assert _journaled(run) == list(range(1, 9))
