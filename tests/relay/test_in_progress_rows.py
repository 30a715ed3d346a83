"""A single row's 409 to its key still in progress (the IETF Idempotency-Key draft, Stripe), at the
embedded loopback target keeping keys: waited out under the same key, never a failed row."""

from __future__ import annotations

from pathlib import Path

import anyio
import orjson
import pytest

from bulkrelay.demo.target import RunningTarget, start_target
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import Preflight, run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay.engine import StartPoint, relay
from bulkrelay.relay.progress import NullReporter
from bulkrelay.relay.stopping import StopControl
from bulkrelay.store.journal import read_journal
from bulkrelay.store.rundir import RunDir
from tests.taggedjobs import write_job
from tests.waiting import until

pytestmark = pytest.mark.anyio

HELD_MS = 600_000  # the held sends are answered when the test releases them, never on a timer


async def test_a_rows_409_after_its_key_was_sent_is_waited_out_under_the_same_key(tmp_path: Path) -> None:
    """Each row's first send outlasts read_seconds; its second meets the key in progress (409), and the
    target answers the first sends only once it has, so the 409 is met however slow the machine."""
    plan = {
        "dedup": True,
        "in_progress_status": 409,
        "rules": [{"match": {"method": "POST"}, "delay_ms": HELD_MS}],
    }
    target = await start_target(plan)
    try:
        job = write_job(
            tmp_path,
            target.url,
            rows=3,
            request={"idempotency_key": {"header": "Idempotency-Key"}},
            retry={"max_attempts": 3, "initial_backoff_seconds": 0.3, "max_backoff_seconds": 0.6},
            execution={"concurrency": 3, "timeout": {"read_seconds": 0.4}},
        )
        preflight = run_preflight(load_job(job), None)
        run = RunDir.create(tmp_path / "runs", plan_for(preflight))
        async with anyio.create_task_group() as call:
            call.start_soon(_relayed, preflight, run, StartPoint())
            await _release_after_a_409(target)
        stats = target.state.stats()
        requests = target.state.requests()
    finally:
        await target.stop()
    entries = list(read_journal(run.journal_path))
    assert 409 in {r["status"] for r in requests}
    assert stats["effects"] == 3  # each row applied once
    assert sorted(e.row_number for e in entries) == [1, 2, 3]
    assert all(e.success and e.status_code == 200 for e in entries), entries


@pytest.mark.parametrize("continued", [True, False])
async def test_a_409_to_a_rows_first_send_is_waited_out_only_in_a_call_that_continues_a_run(
    tmp_path: Path, continued: bool
) -> None:
    """Row 2's key is still being answered for an earlier call (one cancelled while the target held it,
    as a kill -9 leaves it). Continuing the run, the 409 to its first send in this call is that earlier
    send: waited out. In a new run the key cannot have been sent before: the 409 is row 2's result."""
    held = {"match": {"body_field": "tag", "equals": "held"}, "delay_ms": HELD_MS}
    target = await start_target({"dedup": True, "in_progress_status": 409, "rules": [held]})
    try:
        job = write_job(
            tmp_path,
            target.url,
            rows=3,
            tags={2: "held"},
            request={"idempotency_key": {"header": "Idempotency-Key"}},
            retry={"max_attempts": 2, "initial_backoff_seconds": 0.3, "max_backoff_seconds": 0.8},
        )
        preflight = run_preflight(load_job(job), None)
        earlier = RunDir.create(tmp_path / "earlier", plan_for(preflight))
        async with anyio.create_task_group() as calls:
            calls.start_soon(_relayed, preflight, earlier, StartPoint())
            await until(lambda: target.state.stats()["requests"] == 3, "row 2's first send held")
            calls.cancel_scope.cancel()  # the earlier call ends with row 2 in flight
        start = StartPoint(journaled_through=0) if continued else StartPoint()
        run = RunDir.create(tmp_path / "runs", plan_for(preflight))
        async with anyio.create_task_group() as call:
            call.start_soon(_relayed, preflight, run, start)
            await _release_after_a_409(target)  # row 2's earlier send ends once this call met it
        stats = target.state.stats()
    finally:
        await target.stop()
    statuses = {e.row_number: e.status_code for e in read_journal(run.journal_path)}
    assert stats["by_status"].get("409", 0) >= 1  # this call did meet row 2's key in progress
    assert stats["effects"] == 3  # each row applied once, whatever its journal line says
    assert statuses == ({1: 200, 2: 200, 3: 200} if continued else {1: 200, 2: 409, 3: 200})


async def _relayed(preflight: Preflight, run: RunDir, start: StartPoint) -> None:
    await relay(preflight, run, start, stop=StopControl(), reporter=NullReporter())


async def _release_after_a_409(server: RunningTarget) -> None:
    """Once the target answered a key in progress, the held sends are answered (POST /_control/release)."""
    await until(lambda: server.state.stats()["by_status"].get("409"), "a 409 to a key in progress")
    server.state.release()


async def test_a_rows_gzip_body_is_inflated_by_the_target(tmp_path: Path) -> None:
    target = await start_target()
    try:
        job = write_job(tmp_path, target.url, rows=3, request={"compression": "gzip"})
        preflight = run_preflight(load_job(job), None)
        run = RunDir.create(tmp_path / "runs", plan_for(preflight))
        await relay(preflight, run, StartPoint(), stop=StopControl(), reporter=NullReporter())
        requests = target.state.requests()
    finally:
        await target.stop()
    assert all(e.success for e in read_journal(run.journal_path))
    assert sorted(orjson.loads(r["body"])["id"] for r in requests) == [1, 2, 3]
    assert all(r["headers"].get("Content-Encoding") == "gzip" for r in requests)
