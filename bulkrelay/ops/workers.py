"""One run in several worker processes (`execution.workers: N | auto`): the parent's side.

The parent preflighted the input once, holds the run's lock and is the journal's only writer. It
starts N workers (ops/relayworker.py, forked from it: ops/workerfork.py), hands each the pending
rows, of which it sends its share (ops/sharding.py `WorkerShare`), and journals their final results
as they arrive, so every promise the journal keeps for one process it keeps here: a result counts
once it is committed, in one file, by one writer; the run's resume and every reader of the journal
are those of any run. The parent is the run's one progress, checkpoint, summary, envelope and metrics
file. It judges the halt rules over every worker's results, in row order, as one process judges its
own (`_RunHalts`), so the rows a run halts at do not depend on how many workers sent them. It passes
stops on to every worker (SIGTERM, a budget, a halt) and a 429's pause from one to the others.

A worker that dies (kill -9, a crash) leaves its rows in flight unjournaled, exactly as a relay killed
alone would: the parent stops the others at a safe point, and the run ends WORKER_LOST (exit 1),
resumable. The parent is not re-run in its place within the call: a resume does that, after the
torn state is checked. A parent killed takes its workers with it (PR_SET_PDEATHSIG).

A worker that hangs (a stuck system call, a deadlocked library, a SIGSTOP) must not hold its run's
stop: once the run is asked to stop, each worker has what it legitimately needs to answer its rows in
flight (one exchange deadline, `connect + write + read`, and a margin; a forced stop, a moment) to
end; one that has not is killed (SIGKILL: a stopped process ignores everything else), as a kill -9
would kill it, and the run ends as it was asked to, naming the worker in its stop's detail.
"""

from __future__ import annotations

import math
import os
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import anyio
import orjson
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from bulkrelay.job.config import HaltConfig
from bulkrelay.job.preflight import Preflight, PreflightFacts
from bulkrelay.ops.relayworker import WorkerHandoff
from bulkrelay.ops.workerfork import ForkedProcess, fork_workers, may_fork
from bulkrelay.ops.workerwire import Kind, entries_of, frame, json_frame, receive
from bulkrelay.private import make_private_dir, open_private
from bulkrelay.relay.affinity import usable_cpus
from bulkrelay.relay.engine import StartPoint
from bulkrelay.relay.failurerate import WorkersFailureRate
from bulkrelay.relay.failurestreak import WorkersFailureStreak
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.ratelimit_workers import share_of_concurrency
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry, JournalWriter
from bulkrelay.store.rundir import RunDir

WORKERS_DIR = "workers"  # in the run directory: each worker's log (what it printed, a traceback)
_LOG_TAIL_BYTES = 2000
_EXIT_GRACE_SECONDS = 5.0  # a worker whose stream ended has this long to exit before it counts as hung
_STOP_MARGIN_SECONDS = 5.0  # past its exchange deadline, for a stopped worker's results and last word
_FORCED_GRACE_SECONDS = 2.0  # a forced worker cancels its rows in flight: it needs only to say so


def worker_count(setting: int | str, concurrency: int) -> int:
    """How many processes `execution.workers` asks for: `auto` is one per usable CPU (affinity and
    cgroup quota, at most 8); never more than `concurrency`, so that every worker has a request."""
    wanted = usable_cpus() if setting == "auto" else int(setting)
    return max(1, min(wanted, concurrency))


class _Process(Protocol):
    """A worker's process: started as an interpreter (subprocess.Popen) or forked (ForkedProcess)."""

    pid: int

    def poll(self) -> int | None: ...
    def wait(self) -> int: ...
    def kill(self) -> None: ...


@dataclass
class _Worker:
    index: int
    process: _Process
    stream: SocketStream
    log: Path
    # The same socket on a descriptor of its own, for what the parent tells the worker, written to
    # directly (a stream of its own would read the socket too): a write to a worker that has just
    # exited fails, and must not close `stream` before the parent has read the worker's last frames.
    out: socket.socket
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    last_word: dict[str, Any] | None = None
    sent: dict[str, Any] | None = None
    heard_out: bool = False  # its stream has ended: it said its last word, or died
    # What to tell it, the latest of each only (`_tell_news`): the lowest row some worker has not
    # settled (relay/runahead.py), and the end of the latest pause another worker was asked for.
    turn: float = 0
    pause_until: float = 0
    news: anyio.Event = field(default_factory=anyio.Event)

    async def tell(self, data: bytes) -> None:
        """Send the worker a message; one that has ended hears nothing, and needs to."""
        async with self.lock:
            with suppress(anyio.ClosedResourceError, OSError):
                left = memoryview(data)
                while left:
                    await anyio.wait_writable(self.out)
                    with suppress(BlockingIOError):
                        left = left[self.out.send(left) :]


class LocalWorkers:
    """The worker processes of one run on this machine (relay.engine's `WorkerPool`)."""

    def __init__(self, preflight: Preflight, run: RunDir, start: StartPoint, count: int) -> None:
        execution = preflight.job.config.execution
        facts = PreflightFacts.of(preflight)
        pending = replace(start, journal=None)  # the journal's state is the parent's alone
        self._run = run
        self._halt = preflight.job.config.halt
        timeout = execution.timeout
        self._stop_bound = timeout.connect_seconds + timeout.write_seconds + timeout.read_seconds
        self._stop_bound += _STOP_MARGIN_SECONDS
        self._forked: dict[int, tuple[ForkedProcess, socket.socket]] = {}
        self._handoffs = [
            WorkerHandoff(
                facts=facts,
                run_path=str(run.path),
                start=pending,
                index=index,
                count=count,
                concurrency=share_of_concurrency(execution.concurrency, count, index),
                pin_cpu=execution.pin_cpu,
            )
            for index in range(count)
        ]
        if may_fork():  # before the event loop and its threads start (ops/workerfork.py)
            self._forked = dict(enumerate(fork_workers([self._log_path(index) for index in range(count)])))

    async def relay(self, journal: JournalWriter, stop: StopControl, stats: RelayStats) -> None:
        workers: list[_Worker] = []
        try:
            for handoff in self._handoffs:
                workers.append(await self._start(handoff))
            halts = _RunHalts(self._halt, stop, journal, workers)
            async with anyio.create_task_group() as around:
                around.start_soon(_pass_on_stops, stop, workers, self._stop_bound)
                for worker in workers:
                    around.start_soon(_tell_news, worker)
                async with anyio.create_task_group() as serving:
                    for worker in workers:
                        serving.start_soon(partial(_serve, worker, workers, halts, stop=stop, stats=stats))
                around.cancel_scope.cancel()
            await halts.release()
        finally:
            with anyio.CancelScope(shield=True):
                for worker in workers:
                    await _ended(worker)

    def close(self) -> None:
        """End the forked workers no run took (the run failed before it started them all); the
        pool's owner calls it once the relay is over (ops/lifecycle.py `relay_locked`)."""
        forked, self._forked = self._forked, {}
        for process, sock in forked.values():
            sock.close()
            process.kill()
            process.wait()

    def _log_path(self, index: int) -> Path:
        path = self._run.path / WORKERS_DIR / f"worker-{index}.log"
        make_private_dir(path.parent)
        return path

    async def _start(self, handoff: WorkerHandoff) -> _Worker:
        log_path = self._log_path(handoff.index)
        forked = self._forked.pop(handoff.index, None)
        process, ours = self._spawn(log_path) if forked is None else forked
        telling = ours.dup()  # non-blocking, as `ours` is: they share the open file
        stream = await SocketStream.from_socket(ours)
        worker = _Worker(handoff.index, process, stream, log_path, telling)
        await worker.tell(frame(Kind.HANDOFF, pickle.dumps(handoff)))
        return worker

    @staticmethod
    def _spawn(log_path: Path) -> tuple[subprocess.Popen[bytes], socket.socket]:
        """A worker started as a new interpreter, where this process may not fork."""
        ours, theirs = socket.socketpair()
        log = open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        with theirs:
            try:
                command = [
                    sys.executable,
                    "-m",
                    "bulkrelay.ops.relayworker",
                    str(theirs.fileno()),
                    str(os.getpid()),
                ]
                process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(theirs.fileno(),)
                )
            finally:
                os.close(log)
        return process, ours


class _RunHalts:
    """The halt rules over every worker's rows, judged here as one process judges its own
    (relay/engine.py): each result passes the streak (`halt.consecutive_failures`), which holds back a
    run of failures until a row after them ends otherwise, then the journal, then the failure rate.
    Both count a row once every worker has settled the rows below it: row order over the call."""

    def __init__(
        self, halt: HaltConfig, stop: StopControl, journal: JournalWriter, workers: Sequence[_Worker]
    ) -> None:
        self._streak = WorkersFailureStreak(halt.consecutive_failures, stop)
        rule = halt.failure_rate
        self._rate = None if rule is None else WorkersFailureRate(rule, stop)
        self._journal = journal
        self._workers = workers
        self._settled: list[float] = [0] * len(workers)  # below which row each one's results are all here
        self.turn: float = 0  # the lowest of them: every row below it has its result here

    async def results(self, entries: list[JournalEntry]) -> None:
        """A frame's results, journaled as the streak admits them (one call a frame, not a row)."""
        journal, rate, admit = self._journal, self._rate, self._streak.admit
        for entry in entries:
            for admitted in admit(entry):
                if not journal.offer(admitted):
                    await journal.submit(admitted)
                if rate is not None:
                    rate.ended(admitted)

    async def settled(self, worker: int, below: float) -> None:
        """Worker `worker` has sent the result of every row below `below` it took (`math.inf`: of every
        row it will take). Judge the rows the turn passed, and tell every worker a turn that moved."""
        self._settled[worker] = max(below, self._settled[worker])
        turn = min(self._settled)
        if turn <= self.turn:
            return
        self.turn = turn
        rate = self._rate
        for released in self._streak.settled_below(turn):  # a streak's failures a breaker ended: final
            await self._journal.submit(released)
            if rate is not None:
                rate.ended(released)
        if rate is not None:  # in row order: not past a failure the streak still holds
            rate.count_below(min(turn, self._streak.held_from))
        for each in self._workers:
            each.turn = turn
            each.news.set()

    async def release(self) -> None:
        """The failures the streak still holds once every worker has ended: final, unless it declared
        the target down."""
        for admitted in self._streak.release():
            await self._journal.submit(admitted)


async def _serve(
    worker: _Worker,
    workers: Sequence[_Worker],
    halts: _RunHalts,
    *,
    stop: StopControl,
    stats: RelayStats,
) -> None:
    """Journal what `worker` sends until its stream ends (results, counters, pauses, its last word),
    then adopt how it ended."""
    await _heard(worker, workers, halts, stats)
    worker.heard_out = True
    await halts.settled(worker.index, math.inf)  # it sends no more: none of its rows waits any longer
    with anyio.move_on_after(_EXIT_GRACE_SECONDS):  # its stream ended: so does the process, or soon
        while worker.process.poll() is None:
            await anyio.sleep(0.01)
    _adopt_last_word(worker, stop, len(workers))


async def _heard(worker: _Worker, workers: Sequence[_Worker], halts: _RunHalts, stats: RelayStats) -> None:
    incoming = BufferedByteReceiveStream(worker.stream)
    with suppress(anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
        while True:
            kind, body = await receive(incoming)
            if kind is Kind.RESULTS:
                await halts.results(entries_of(body))
            elif kind is Kind.SETTLED:
                below = orjson.loads(body)["below"]  # null: every row it will take has its result
                await halts.settled(worker.index, math.inf if below is None else below)
            elif kind is Kind.SENT or kind is Kind.DONE:
                word = orjson.loads(body)
                now = word if kind is Kind.SENT else word["sent"]
                stats.add_sent(now, worker.sent)
                worker.sent = now
                if kind is Kind.DONE:
                    worker.last_word = word
            elif kind is Kind.PAUSE:
                until = orjson.loads(body)["until"]
                now_at = time.monotonic()
                stats.on_pause(max(0.0, until - now_at), now_at)
                for other in workers:
                    if other is not worker and until > other.pause_until:
                        other.pause_until = until
                        other.news.set()


async def _tell_news(worker: _Worker) -> None:
    """Tell `worker` each turn that moved and each longer pause, the latest only: a worker that does
    not read (hung, stopped) holds neither another worker's news nor the results the parent reads."""
    told_turn, told_pause = 0.0, 0.0
    while True:
        await worker.news.wait()
        worker.news = anyio.Event()
        if worker.pause_until > told_pause:
            told_pause = worker.pause_until
            await worker.tell(json_frame(Kind.PAUSE, {"until": told_pause}))
        if worker.turn > told_turn:
            told_turn = worker.turn
            await worker.tell(json_frame(Kind.TURN, {"turn": None if told_turn == math.inf else told_turn}))


async def _pass_on_stops(stop: StopControl, workers: Sequence[_Worker], bound: float) -> None:
    """The run's stop, whatever asked for it, is every worker's; so is a forced one. Each is told on
    its own, so that a worker that does not read (hung) delays no other; it is killed once `bound`
    seconds have passed since the stop (`_FORCED_GRACE_SECONDS` since a forced one)."""
    await stop.wait()
    assert stop.reason is not None
    async with anyio.create_task_group() as telling:
        telling.start_soon(_kill_the_hung, stop, workers, bound)
        for worker in workers:
            telling.start_soon(worker.tell, json_frame(Kind.STOP, {"reason": stop.reason.value}))
        await stop.wait_forced()
        for worker in workers:
            telling.start_soon(worker.tell, frame(Kind.FORCE, b""))


async def _kill_the_hung(stop: StopControl, workers: Sequence[_Worker], bound: float) -> None:
    """Kill every worker still running `bound` seconds after the stop, or soon after it is forced: a
    worker that has not ended by then never will (stuck, deadlocked, stopped). Its rows in flight
    stay unjournaled, as a kill -9 of it would leave them; the stop's detail names it."""
    asked = time.monotonic()
    with anyio.move_on_after(bound):
        await stop.wait_forced()
        await anyio.sleep(_FORCED_GRACE_SECONDS)
    waited = round(time.monotonic() - asked, 1)
    killed = []
    for worker in workers:
        if not worker.heard_out and worker.process.poll() is None:
            worker.process.kill()
            killed.append({"worker": worker.index, "pid": worker.process.pid, "log": str(worker.log)})
    if killed:
        stop.add_detail(workers_killed=killed, workers_killed_after_seconds=waited)


def _adopt_last_word(worker: _Worker, stop: StopControl, workers: int) -> None:
    """What stopped a worker stops the run: a halt of its own rows (a 401), its input changed; one
    that died is WORKER_LOST. The detail says which worker."""
    word = worker.last_word
    if word is None:
        code = worker.process.poll()
        stop.request(
            StopReason.WORKER_LOST,
            message=f"worker {worker.index} ended without its last word (exit status {code})",
            worker=worker.index,
            exit_status=code,
            log=str(worker.log),
            log_tail=_tail(worker.log),
        )
    elif word["reason"] is not None:
        stop.request(
            StopReason(word["reason"]), **{**word["detail"], "worker": worker.index, "workers": workers}
        )
        if word["forced"]:
            stop.force()


async def _ended(worker: _Worker) -> None:
    """The worker reaped; one still running (the parent failed: a full disk, a bug) is killed, so that
    no worker goes on sending what its run can no longer journal."""
    await worker.stream.aclose()
    worker.out.close()
    if worker.process.poll() is None:
        worker.process.kill()
    worker.process.wait()


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, path.stat().st_size - _LOG_TAIL_BYTES))
            return file.read().decode("utf-8", "replace")
    except OSError:
        return ""
