"""One worker process of a run (`execution.workers`): forked from the run's process (ops/workerfork.py)
or, where that process may not fork, started as `python -m bulkrelay.ops.relayworker FD PPID`.

The parent (ops/workers.py) preflighted the input once and holds the run and its journal. Over the
socket `FD` it hands this process what preflight found and which rows are pending; the worker's own
are those `WorkerShare` gives it (ops/sharding.py). The worker compiles the job again without
validating a row, reads the input through (every byte still checked against what preflight read),
sends its own rows through its share of the concurrency and the rate, and hands each final result
back; it writes nothing to the run itself. It dies with its parent (PR_SET_PDEATHSIG), so no worker
goes on sending after its run's process is gone.
"""

from __future__ import annotations

import math
import os
import pickle
import socket
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from bulkrelay.job.preflight import Preflight, PreflightFacts
from bulkrelay.ops.lookups import frozen_lookups
from bulkrelay.ops.sharding import WorkerShare
from bulkrelay.ops.workerwire import Kind, json_frame, receive, results_frame
from bulkrelay.private import die_with_parent, no_core_dumps
from bulkrelay.relay.affinity import relay_cpu
from bulkrelay.relay.engine import StartPoint, open_limiter, relay_share
from bulkrelay.relay.heap import relay_collections
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.ratelimit import Limiter, RateLimiter
from bulkrelay.relay.ratelimit_workers import WorkerLimiter, share_of_rate
from bulkrelay.relay.runahead import RunAhead, run_ahead_rows
from bulkrelay.relay.stopping import StopControl, StopReason, watch_signals
from bulkrelay.store.journal import JournalEntry
from bulkrelay.store.rundir import RunDir

FLUSH_SECONDS = 0.005  # a worker's results go to the parent at most this long after they end
SENT_EVERY_SECONDS = 0.5  # and its request counters (the metrics file) this often
MAX_PENDING = 4096  # results not yet sent before the window waits (the parent is behind)


@dataclass(frozen=True)
class WorkerHandoff:
    """What the parent hands worker `index` of `count`."""

    facts: PreflightFacts
    run_path: str
    start: StartPoint  # the run's pending rows (without the journal's state: the parent holds it)
    index: int
    count: int
    concurrency: int  # this worker's share
    pin_cpu: bool


class SocketOutbox:
    """The worker's final results, sent to the parent in frames of a few milliseconds' worth."""

    def __init__(self, stream: SocketStream, stats: RelayStats, rows: RunAhead) -> None:
        self._stream = stream
        self._stats = stats
        self._rows = rows  # below which row it has settled: told with the results it covers
        self._told_settled: float = 0
        self._pending: list[JournalEntry] = []
        self._notes: list[bytes] = []  # other frames to send with the next results (pauses)
        self._ready = anyio.Event()
        self._lock = anyio.Lock()
        self._sent_at = time.monotonic()

    def offer(self, entry: JournalEntry) -> bool:
        if len(self._pending) >= MAX_PENDING:
            return False
        self._pending.append(entry)
        self._ready.set()
        return True

    async def submit(self, entry: JournalEntry) -> None:
        while not self.offer(entry):
            await anyio.sleep(FLUSH_SECONDS)

    def wake(self) -> None:
        """Flush soon though no result is due: where this worker stands has changed."""
        self._ready.set()

    def tell_pause(self, deadline: float) -> None:
        self._notes.append(json_frame(Kind.PAUSE, {"until": deadline}))
        self._ready.set()

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            await anyio.sleep(FLUSH_SECONDS)
            await self.flush()

    async def flush(self, last: bytes = b"") -> None:
        async with self._lock:
            self._ready = anyio.Event()
            pending, self._pending = self._pending, []
            notes, self._notes = self._notes, []
            data = b"".join(notes) + (results_frame(pending) if pending else b"")
            settled = self._rows.settled  # read with `pending`: no await between
            if settled != self._told_settled:
                self._told_settled = settled
                below = None if settled == math.inf else settled  # JSON has no infinity: null
                data += json_frame(Kind.SETTLED, {"below": below})
            if time.monotonic() - self._sent_at >= SENT_EVERY_SECONDS:
                self._sent_at = time.monotonic()
                data += json_frame(Kind.SENT, self._stats.sent())
            if data or last:
                await self._stream.send(data + last)


def main(argv: list[str]) -> int:
    fd, parent = int(argv[1]), int(argv[2])
    return serve(socket.socket(fileno=fd), parent)


def serve(sock: socket.socket, parent: int) -> int:
    """Be worker of the run whose process is `parent`, which speaks at the other end of `sock`; the
    exit status. Started as an interpreter (`main`) or forked from the parent (ops/workerfork.py)."""
    if not die_with_parent(parent):
        return 1  # the run ended before this worker started: nothing it sent could be journaled
    no_core_dumps()
    return anyio.run(_work, sock, backend_options={"use_uvloop": True})


async def _work(sock: socket.socket) -> int:
    stream = await SocketStream.from_socket(sock)
    incoming = BufferedByteReceiveStream(stream)
    kind, body = await receive(incoming)
    if kind is not Kind.HANDOFF:
        return 1
    handoff: WorkerHandoff = pickle.loads(body)
    run = RunDir.open(Path(handoff.run_path))
    preflight = _preflight(handoff, run)
    stop, stats = StopControl(), RelayStats()
    # a waiting slot wakes the outbox, which tells where this worker stands (made next: hence the lambda)
    bound = run_ahead_rows(preflight.job.config.execution.concurrency)
    ahead = RunAhead(bound, lambda: outbox.wake())  # noqa: PLW0108
    outbox = SocketOutbox(stream, stats, ahead)
    limiter = WorkerLimiter(_share_limiter(preflight, handoff.count), outbox.tell_pause)
    share = _share(handoff, run)
    rows = preflight.input_fingerprint.record_count
    chunks = share.chunks(preflight.expected_input, rows, handoff.start, bound)
    owns = share.of_rows(preflight.job.config.input.key, chunks)
    async with anyio.create_task_group() as talk:
        talk.start_soon(partial(watch_signals, stop, sigint_forces_any_stop=False))  # Ctrl+C: 1 to each
        talk.start_soon(_listen, incoming, stop, limiter, ahead)
        talk.start_soon(outbox.run)
        try:
            with relay_collections(), relay_cpu(handoff.pin_cpu):
                await relay_share(
                    preflight,
                    run,
                    handoff.start,
                    owns=owns,
                    share=chunks,
                    concurrency=handoff.concurrency,
                    ahead=ahead,
                    stop=stop,
                    outbox=outbox,
                    limiter=limiter,
                    stats=stats,
                )
        finally:
            with anyio.CancelScope(shield=True):
                await limiter.aclose()
        await outbox.flush(last=json_frame(Kind.DONE, _last_word(stop, stats)))
        talk.cancel_scope.cancel()
    return 0


def _preflight(handoff: WorkerHandoff, run: RunDir) -> Preflight:
    job = handoff.facts.job
    lookups = frozen_lookups(job, run) if job.config.lookups else {}
    return handoff.facts.preflight(lookups, os.environ)


def _share_limiter(preflight: Preflight, workers: int) -> Limiter:
    """This worker's even share of the run's rate; a limit kept in Redis is shared whole."""
    config = preflight.job.config
    if preflight.shared_limit is not None:
        return open_limiter(config, preflight.shared_limit)
    rate = config.execution.rate_limit
    return RateLimiter(share_of_rate(None if rate is None else rate.requests_per_second, workers))


def _share(handoff: WorkerHandoff, run: RunDir) -> WorkerShare:
    """This worker's share of the run's rows (of its shard's, with `--shard`)."""
    shards = 1 if run.plan.shard is None else run.plan.shard.count
    return WorkerShare(handoff.index, handoff.count, shards)


async def _listen(
    incoming: BufferedByteReceiveStream, stop: StopControl, limiter: WorkerLimiter, ahead: RunAhead
) -> None:
    """The parent's word: stops, the pauses of other workers, the turn. Its end is the parent's: nothing this
    worker sends from then on could be journaled, so it ends at once, as a kill -9 would end it."""
    try:
        while True:
            kind, body = await receive(incoming)
            if kind is Kind.PAUSE:
                limiter.heard_pause(orjson.loads(body)["until"])
            elif kind is Kind.TURN:
                ahead.heard(orjson.loads(body)["turn"])
            elif kind is Kind.STOP:
                stop.request(StopReason(orjson.loads(body)["reason"]), by="parent")
            elif kind is Kind.FORCE:  # after the STOP it forces, on the same stream
                stop.force()
    except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError, OSError):
        os._exit(1)


def _last_word(stop: StopControl, stats: RelayStats) -> dict[str, Any]:
    reason = None if stop.reason is None else stop.reason.value
    return {"reason": reason, "detail": stop.detail, "forced": stop.forced, "sent": stats.sent()}


if __name__ == "__main__":
    sys.exit(main(sys.argv))
