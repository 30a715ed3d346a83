"""The global limiter on request starts (first attempts and retries alike).

Two rules decide when the next start may happen; a start waits for both:

1. Pacing. Starts are given slots one `interval = 1 / rate` apart: the next slot is the previous slot plus
   the interval, so starts spread evenly instead of bursting at the top of each second. The schedule keeps
   its own time, not the wakeup time: when the event loop wakes late, the slots that passed meanwhile are
   still owed and are handed out at once, so a late wakeup costs no rate. That debt is bounded by
   `_MAX_LAG`, and a start that finds nobody waiting restarts pacing from now: an idle spell earns no burst.
2. The hard window. A log of the last `limit = max(1, floor(rate))` start times is kept; a new start must
   come at least one second (plus `_WINDOW_MARGIN`, so a caller reading the clock just after `acquire`
   still sees the property) after the oldest of them. A start is logged at the moment its waiter
   resumes, not when it was granted. So no one-second window ever holds more than `limit` starts,
   whatever the pacing did.

`pause_until(deadline)` (a 429 with Retry-After) holds every start until the deadline; pacing resumes from
it. Waiters queue in FIFO order; one timer wakes the queue at the earliest allowed time and releases every
waiter whose turn has come in that wakeup, which matters at thousands of starts per second where the
loop's timer granularity (about 1 ms) is coarser than the interval. With no rate (`None`) only pauses
apply.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

_MAX_LAG = 0.05  # seconds of missed slots a late wakeup may still claim
_WINDOW_MARGIN = 0.01  # seconds of slack on the one-second window: arrivals jitter on the way to the target


class Start:
    """One start in the window log. `at` is corrected to when the waiter actually resumed."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


class StartSchedule:
    """The algorithm without the waiting: when may the next start happen, and take one."""

    def __init__(self, requests_per_second: float | None) -> None:
        if requests_per_second is not None and not requests_per_second > 0:
            raise ValueError(f"requests_per_second must be positive, got {requests_per_second!r}")
        self.rate = requests_per_second
        self.limit = max(1, math.floor(requests_per_second)) if requests_per_second else None
        self._interval = 1.0 / requests_per_second if requests_per_second else 0.0
        self._recent: deque[Start] = deque(maxlen=self.limit)
        self._next_slot = -math.inf
        self._paused_until = -math.inf

    def earliest(self, now: float) -> float:
        """The earliest time the next start may happen (`now` or later)."""
        ready = max(now, self._next_slot, self._paused_until)
        if self.limit is not None and len(self._recent) == self.limit:
            ready = max(ready, self._recent[0].at + 1.0 + _WINDOW_MARGIN)
        return ready

    def take(self, now: float, *, claim_missed: bool = False) -> Start:
        """Record a start at `now` (the caller checked `earliest(now) <= now`) and return its log entry.

        `claim_missed`: this start comes from a (possibly late) timer wakeup, so slots missed by up to
        `_MAX_LAG` stay owed; a start with nobody waiting restarts pacing from `now`.
        """
        start = Start(now)
        if self.limit is not None:
            self._recent.append(start)
            floor = now - _MAX_LAG if claim_missed else now
            self._next_slot = max(self._next_slot, floor) + self._interval
        return start

    def pause_until(self, deadline: float) -> None:
        self._paused_until = max(self._paused_until, deadline)
        if self.limit is not None:
            self._next_slot = max(self._next_slot, deadline)


class LimiterUnavailable(Exception):
    """A limit kept outside this process could not be asked: the relay halts rather than guess."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"the shared rate limit at {url} is unavailable: {cause}")
        self.url = url
        self.cause = cause


class Limiter(Protocol):
    """What the sender needs of a rate limit: this process's own (`RateLimiter`), or one shared by every
    shard of a job (`ratelimit_redis.SharedRateLimiter`)."""

    async def acquire(self) -> None: ...

    def pause_until(self, monotonic_deadline: float) -> None: ...

    async def aclose(self) -> None: ...


class RateLimiter:
    """Awaitable starts under a `StartSchedule`, FIFO among waiters."""

    def __init__(
        self, requests_per_second: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._schedule = StartSchedule(requests_per_second)
        self._clock = clock
        self._waiters: deque[asyncio.Future[Start]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def unlimited(self) -> bool:
        return self._schedule.rate is None

    async def acquire(self) -> None:
        """Return when this caller may start a request."""
        now = self._clock()
        if not self._waiters and self._schedule.earliest(now) <= now:
            self._schedule.take(now)
            return
        waiter: asyncio.Future[Start] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._arm(now)
        # A waiter cancelled in the queue is dropped at the next release; one cancelled just after
        # its start was granted has spent that start (the window counts it, conservatively).
        start = await waiter
        # Released waiters resume one after another, up to milliseconds after the grant on a busy loop:
        # the window must count the moment this caller really goes, or it would see more than `limit`.
        start.at = self._clock()

    def pause_until(self, monotonic_deadline: float) -> None:
        """Hold every start until `monotonic_deadline` (in this limiter's clock)."""
        # A timer already armed fires early, finds the head paused and re-arms for the deadline.
        self._schedule.pause_until(monotonic_deadline)

    async def aclose(self) -> None:
        """Nothing to let go of: the limit lives in this process."""

    def _arm(self, now: float) -> None:
        """Make sure a timer will release the queue head when its time comes."""
        if self._timer is None and self._waiters:
            delay = max(0.0, self._schedule.earliest(now) - now)
            self._timer = asyncio.get_running_loop().call_later(delay, self._release)

    def _release(self) -> None:
        """Release every waiter whose turn has come, then wait for the next one."""
        self._timer = None
        now = self._clock()
        while self._waiters:
            head = self._waiters[0]
            if head.done():  # cancelled while queued
                self._waiters.popleft()
                continue
            if self._schedule.earliest(now) > now:
                break
            self._waiters.popleft()
            head.set_result(self._schedule.take(now, claim_missed=True))
        self._arm(now)


def most_in_window(times: Sequence[float], window: float) -> int:
    """The most of `times` (in order) within any half-open interval [t, t + window): the quantity the
    limiter's window rule bounds. The target counts arrivals with it; tests and benchmarks count starts."""
    best = 0
    left = 0
    for right, t in enumerate(times):
        while t - times[left] >= window:
            left += 1
        best = max(best, right - left + 1)
    return best
