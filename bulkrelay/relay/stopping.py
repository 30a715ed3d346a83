"""Stop requests and how they reach the engine: signals, a deadline, halt rules, `job cancel`.

A stop is a request, honoured at a safe point: no new row starts (a wait for a start, held by the rate
limit or a Retry-After pause, ends at once and leaves its row pending), rows in flight finish and
their results are committed. Forcing (a second SIGINT) cancels the rows in flight too.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

_clock = time.monotonic  # the idle watchdog's clock, which tests replace


class StopReason(enum.StrEnum):
    """Why a run stopped before its end; each maps to a run state and an exit code (ops/execute).

    The values are written to run.json, the run log and envelopes: never change one."""

    INTERRUPTED = "interrupted"  # SIGINT
    TERMINATED = "terminated"  # SIGTERM or SIGHUP
    TIMEOUT = "timeout"  # --timeout or max_lifetime_seconds
    HALT_AUTH = "halt_auth"  # a status in halt.on_statuses
    HALT_UNAVAILABLE = "halt_unavailable"  # halt.consecutive_failures reached
    HALT_LIMIT_UNAVAILABLE = "halt_limit_unavailable"  # the shared rate limit (Redis) cannot be reached
    TOKEN_REFUSED = "token_refused"  # the OAuth2 token endpoint refused the client (relay/auth)
    TOKEN_UNAVAILABLE = "token_unavailable"  # no OAuth2 token could be had: the endpoint is down
    AUTH_UNUSABLE = "auth_unusable"  # request.auth cannot sign: no AWS credentials found (relay/auth)
    SIGNATURE_REFUSED = "signature_refused"  # a 403 saying the signature or the clock is wrong
    HALT_FAILURE_RATE = "halt_failure_rate"  # halt.failure_rate: too many of this call's rows failed
    CANCELLED = "cancelled"  # job cancel
    STALLED = "stalled"  # no progress for idle_timeout_seconds
    INPUT_CHANGED = "input_changed"  # the input is no longer the file preflight read
    INCOMPLETE = "incomplete"  # rows are left and nobody asked for a stop (the engine's fallback)
    LIMIT = "limit"  # `run --limit N` sent its N rows (a canary); the identical run continues
    WORKER_LOST = "worker_lost"  # a worker process of the run died (execution.workers: ops/workers.py)

    @property
    def halts(self) -> bool:
        """A halt rule fired: the target (or the shared limit) said to stop sending."""
        return self in _HALTS

    @property
    def outcome_even_when_all_rows_ended(self) -> bool:
        """The run's outcome even when every row got a result first: a halt rule fired, or the input
        changed (the rows sent were the ones preflight read, but the file is not that any more).
        Not the failure rate: a run whose every row has its result is complete, its failures counted
        (exit 3 either way)."""
        return (self.halts and self is not StopReason.HALT_FAILURE_RATE) or self is StopReason.INPUT_CHANGED


_HALTS = frozenset(
    {
        StopReason.HALT_AUTH,
        StopReason.HALT_UNAVAILABLE,
        StopReason.HALT_LIMIT_UNAVAILABLE,
        StopReason.TOKEN_REFUSED,
        StopReason.TOKEN_UNAVAILABLE,
        StopReason.AUTH_UNUSABLE,
        StopReason.SIGNATURE_REFUSED,
        StopReason.HALT_FAILURE_RATE,
    }
)


@dataclass
class StopControl:
    """The one place where anyone asks the engine to stop; the first reason wins."""

    reason: StopReason | None = None
    detail: dict[str, object] = field(default_factory=dict)
    forced: bool = False
    _event: anyio.Event = field(default_factory=anyio.Event)
    _forced_event: anyio.Event = field(default_factory=anyio.Event)
    _waits: set[anyio.CancelScope] = field(default_factory=set)

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: StopReason, **detail: object) -> None:
        if self.reason is None:
            self.reason = reason
            self.detail = dict(detail)
            self._event.set()
            for scope in self._waits:
                scope.cancel()

    def add_detail(self, **detail: object) -> None:
        """What happened after the stop was asked for that its report must say (a worker killed)."""
        self.detail.update(detail)

    def request_target_down(self, failures: int, classification: str, error: str | None) -> None:
        """halt.consecutive_failures reached (per row or per batch request): the detail names the
        last failure, which the halt's error quotes ("HTTP 503", a refused connection, a certificate)."""
        self.request(
            StopReason.HALT_UNAVAILABLE,
            consecutive_failures=failures,
            last_classification=classification,
            message=error or classification,
        )

    @contextlib.contextmanager
    def ends_on_request(self) -> Iterator[anyio.CancelScope]:
        """A scope that a stop request cancels: for waits that must not outlive it (a start held by the
        rate limit or a Retry-After pause). Check `cancelled_caught` after it."""
        with anyio.CancelScope() as scope:
            if self.requested:
                scope.cancel()
            self._waits.add(scope)
            try:
                yield scope
            finally:
                self._waits.discard(scope)

    def force(self) -> None:
        self.forced = True
        self._forced_event.set()

    async def wait(self) -> None:
        await self._event.wait()

    async def wait_forced(self) -> None:
        await self._forced_event.wait()


async def watch_signals(stop: StopControl, *, sigint_forces_any_stop: bool = True) -> None:
    """SIGINT, SIGTERM and SIGHUP (handled like SIGTERM) request a stop; a SIGINT once the run is
    stopping forces it. In a worker of the run (`sigint_forces_any_stop=False`) only its own second
    SIGINT does: a terminal's Ctrl+C reaches the parent and every worker once each, and the parent's
    word of it (a stop) may reach the worker before the worker's own SIGINT, which is the same Ctrl+C."""
    interrupted = False
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGINT:
                if interrupted or (stop.requested and sigint_forces_any_stop):
                    stop.force()
                interrupted = True
                stop.request(StopReason.INTERRUPTED)
            else:
                stop.request(StopReason.TERMINATED, signal=signal.Signals(signum).name)


async def stop_at(stop: StopControl, delay_seconds: float, reason: StopReason, **detail: object) -> None:
    """Request a stop once `delay_seconds` have passed (a `--timeout`, a budget)."""
    await anyio.sleep(max(0.0, delay_seconds))
    stop.request(reason, **detail)


# Once a run is declared stalled, rows still in flight get this long to finish; then they are cancelled.
STALL_GRACE_SECONDS = 2.0
_IDLE_POLL_SECONDS = 0.1


class IdleWatchdog:
    """Requests STALLED when committed progress has not moved for `idle_seconds` (a bulk job's poll
    answered moves it too: the target is alive, the job working).

    A stall means the rows in flight are likely stuck too (a target that holds responses), so
    waiting for them would let the run outlive its idle timeout by up to a read timeout each:
    they get STALL_GRACE_SECONDS to finish, then the stop is forced and they are cancelled
    (never journaled, so the next run sends them again)."""

    def __init__(self, idle_seconds: float) -> None:
        self._idle = idle_seconds
        self._done: object = None
        self._changed_at = _clock()

    def progressed(self, done: object) -> None:
        """`done`: the run's measure of moving on (`Snapshot.movement`); a change is progress."""
        if done != self._done:
            self._done = done
            self._changed_at = _clock()

    def idle_for(self) -> float:
        """Seconds since the run last moved on."""
        return _clock() - self._changed_at

    async def watch(self, stop: StopControl) -> None:
        self._changed_at = _clock()  # idleness counts from the first send, not from preflight
        while not stop.requested:
            if self.idle_for() >= self._idle:
                stop.request(
                    StopReason.STALLED, idle_timeout_seconds=self._idle, grace_seconds=STALL_GRACE_SECONDS
                )
            await anyio.sleep(min(_IDLE_POLL_SECONDS, self._idle))
        if stop.reason is StopReason.STALLED:
            await anyio.sleep(STALL_GRACE_SECONDS)
            stop.force()


_Row = TypeVar("_Row")


@dataclass
class RowLimit:
    """`run --limit N`: the first N pending rows, then the end of the rows. The stop is asked for only
    once they have their results (`reached`), so that no wait of those N rows is cut short by it."""

    rows: int
    reached: bool = False  # a pending row beyond the first N exists

    def first_rows(self, records: Generator[_Row, None, None]) -> Generator[_Row, None, None]:
        try:
            for taken, record in enumerate(records):
                if taken == self.rows:
                    self.reached = True
                    return
                yield record
        finally:
            records.close()

    def stop_if_reached(self, stop: StopControl) -> None:
        if self.reached:
            stop.request(StopReason.LIMIT, limit=self.rows)
