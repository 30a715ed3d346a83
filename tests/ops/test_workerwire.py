"""What a run's parent and its workers say to each other (ops/workerwire.py), and the parent's part in
it (ops/workers.py): results as journal entries, request counters summed, a pause passed on."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import orjson
import pytest
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from bulkrelay.job.config import ExecutionConfig
from bulkrelay.ops import workers
from bulkrelay.ops.workerwire import Kind, entries_of, frame, json_frame, receive, results_frame
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.store.journal import JournalEntry

TELLS_WITHIN_S = 30.0  # a relay that never tells fails here, not at the suite's end


def _entry(row: int, **fields: Any) -> JournalEntry:
    base: dict[str, Any] = {
        "row_number": row,
        "success": True,
        "classification": "success",
        "status_code": 200,
        "attempts": 1,
        "retryable": False,
        "error": None,
        "duration_ms": 1.5,
    }
    return JournalEntry(**{**base, **fields})


def test_results_cross_as_the_same_journal_entries() -> None:
    entries = [
        _entry(1, key=17, idempotency_key="k1", latency_ms=1.25),
        _entry(
            2,
            success=False,
            classification="http_client_error",
            status_code=422,
            error="HTTP 422",
            key="a\u00e9",
            captured={"id": "x"},
            response_body='{"e":1}',
            digest="ab",
        ),
    ]
    kind_and_body = results_frame(entries)
    assert kind_and_body[0] == Kind.RESULTS
    assert entries_of(kind_and_body[5:]) == entries


def test_the_parent_sums_what_each_worker_sent() -> None:
    worker = RelayStats()
    worker.on_attempt(200, 0.01)
    worker.on_attempt(503, 0.2)
    worker.on_retry()
    first = orjson.loads(orjson.dumps(worker.sent()))  # as it crosses: JSON
    worker.on_attempt(None, 1.0)
    second = orjson.loads(orjson.dumps(worker.sent()))
    run = RelayStats()
    run.on_attempt(200, 0.05)  # another worker's, counted already
    run.add_sent(first, None)
    run.add_sent(second, first)
    counts = run.request_counts()
    assert (counts.sent, counts.by_status, counts.retries) == (4, {"200": 2, "503": 1, "none": 1}, 1)
    assert sum(run.latency_counts) == 4
    assert run.latency_sum == pytest.approx(1.26)


def test_a_pause_one_worker_heard_is_passed_to_the_others_and_counted_once() -> None:
    async def main() -> None:
        pairs = [socket.socketpair() for _ in range(3)]
        streams = [await SocketStream.from_socket(ours) for ours, _ in pairs]
        theirs = [await SocketStream.from_socket(other) for _, other in pairs]
        pool = [
            workers._Worker(index, None, stream, None, ours.dup())  # type: ignore[arg-type]
            for index, (stream, (ours, _)) in enumerate(zip(streams, pairs, strict=True))
        ]
        stats = RelayStats()
        until = anyio.current_time() + 30
        await theirs[0].send(json_frame(Kind.PAUSE, {"until": until}))
        await theirs[0].aclose()
        async with anyio.create_task_group() as telling:
            for worker in pool:
                telling.start_soon(workers._tell_news, worker)
            await workers._heard(pool[0], pool, None, stats)  # type: ignore[arg-type]
            with anyio.fail_after(TELLS_WITHIN_S):
                for other in theirs[1:]:
                    kind, body = await receive(BufferedByteReceiveStream(other))
                    assert kind is Kind.PAUSE and orjson.loads(body) == {"until": until}
            telling.cancel_scope.cancel()
        assert stats.pauses == 1
        for stream in [*streams, *theirs[1:]]:
            await stream.aclose()
        for worker in pool:
            worker.out.close()

    anyio.run(main)


def test_auto_is_never_more_workers_than_requests_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    assert workers.worker_count("auto", 64) == 8
    assert workers.worker_count("auto", 3) == 3
    assert workers.worker_count(4, 2) == 2
    assert workers.worker_count(1, 64) == 1
    assert ExecutionConfig().workers == 1  # the default: one process, as before


def test_a_frame_too_long_to_be_ours_is_refused() -> None:
    async def main() -> None:
        ours, other = socket.socketpair()
        stream, peer = await SocketStream.from_socket(ours), await SocketStream.from_socket(other)
        await peer.send(frame(Kind.RESULTS, b"")[:1] + (2**31).to_bytes(4, "big"))
        with pytest.raises(ValueError, match="not a worker's"):
            await receive(BufferedByteReceiveStream(stream))
        await stream.aclose()
        await peer.aclose()

    anyio.run(main)
