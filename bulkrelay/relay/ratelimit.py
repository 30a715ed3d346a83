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
apply, and the sender takes each start with `try_start()`, without awaiting, while nothing holds one back.

Adaptation (`AdaptiveRate`, AIMD as in TCP congestion control): a 429 burst halves the rate (one cut per
`BURST_SECONDS`, however many 429s the burst holds), and each quiet second after it adds back
`RECOVER_SHARE` of the ceiling, never above it. The ceiling is the configured rate; with none, the rate
observed when the first 429 came (adaptation starts only then), and the limiter goes back to unlimited
once it has recovered to it. A quota header saying nothing remains (`RateLimit-Remaining: 0`) pauses
every start until its reset, like a Retry-After.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

_MAX_LAG = 0.05  # seconds of missed slots a late wakeup may still claim
_OBSERVED_STARTS = 100_000  # the starts of the last second kept to measure an unconfigured rate
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

    @property
    def paused_until(self) -> float:
        return self._paused_until

    def set_rate(self, requests_per_second: float | None) -> None:
        """Change the rate from the next slot on; the window keeps its newest starts."""
        self.rate = requests_per_second
        self.limit = max(1, math.floor(requests_per_second)) if requests_per_second else None
        self._interval = 1.0 / requests_per_second if requests_per_second else 0.0
        kept = list(self._recent)[-self.limit :] if self.limit else []
        self._recent = deque(kept, maxlen=self.limit)
        if self.limit is None:
            self._next_slot = -math.inf


class AdaptiveRate:
    """Additive-increase, multiplicative-decrease of the start rate on 429 answers."""

    DECREASE = 0.5  # a 429 burst halves the rate
    RECOVER_SHARE = 0.05  # each quiet second adds back this share of the ceiling
    BURST_SECONDS = 1.0  # 429s this close to a cut belong to the burst that caused it
    FLOOR = 0.5  # requests per second: never slower than one start every two seconds

    def __init__(self, configured: float | None) -> None:
        self.configured = configured
        self.current = configured  # None: unlimited
        self.ceiling = configured
        self.rate_limited = 0  # 429 answers seen
        self.cuts = 0
        self._last_cut = -math.inf
        self._last_429 = -math.inf
        self._last_change = -math.inf

    def on_rate_limited(self, now: float, observed_rps: float) -> bool:
        """A 429: cut the rate unless this burst already did; True when the rate changed."""
        self.rate_limited += 1
        self._last_429 = now
        if now - self._last_cut < self.BURST_SECONDS:
            return False
        if self.ceiling is None:  # no configured rate: adapt from what was really sent
            self.ceiling = max(observed_rps, self.FLOOR)
        base = self.current if self.current is not None else self.ceiling
        self.current = max(self.FLOOR, base * self.DECREASE)
        self.cuts += 1
        self._last_cut = self._last_change = now
        return True

    def recover(self, now: float) -> bool:
        """After quiet seconds, add the rate back; True when the rate changed."""
        if self.current is None or self.ceiling is None or self.current >= self.ceiling:
            return False  # nothing to recover
        quiet = now - max(self._last_429, self._last_change)
        if quiet < 1.0:
            return False
        step = self.RECOVER_SHARE * self.ceiling * math.floor(quiet)
        self.current = min(self.ceiling, self.current + step)
        self._last_change = now
        if self.current >= self.ceiling and self.configured is None:
            self.current = self.ceiling = None  # fully recovered: unlimited again
        return True


class LimiterUnavailable(Exception):
    """A limit kept outside this process could not be asked: the relay halts rather than guess."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(f"the shared rate limit at {url} is unavailable: {cause}")
        self.url = url
        self.cause = cause


@dataclass(frozen=True)
class Pace:
    """A limiter's state as `status`, the progress line and the run log show it: the configured and
    current rate; a local limiter's 429s, rate cuts, pauses and the pause in force; a shared limiter's
    Redis (`shared`, shown without credentials). `to_dict` is its JSON (a live run's checkpoint)."""

    configured_rps: float | None
    current_rps: float | None
    rate_limited_responses: int | None = None
    rate_cuts: int | None = None
    pauses: int | None = None
    paused_until: str | None = None  # UTC, while a pause is in force
    shared: str | None = None

    def to_dict(self) -> dict[str, Any]:
        rates = {"configured_rps": self.configured_rps, "current_rps": self.current_rps}
        if self.shared is not None:
            return {**rates, "shared": self.shared}
        return {
            **rates,
            "rate_limited_responses": self.rate_limited_responses,
            "rate_cuts": self.rate_cuts,
            "pauses": self.pauses,
            "paused_until": self.paused_until,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pace:
        """The pace again from its JSON (a live run's checkpoint, as `status` read it)."""
        names = ("rate_limited_responses", "rate_cuts", "pauses", "paused_until", "shared")
        return cls(data.get("configured_rps"), data.get("current_rps"), *(data.get(name) for name in names))


class Limiter(Protocol):
    """What the sender needs of a rate limit: this process's own (`RateLimiter`), or one shared by every
    shard of a job (`ratelimit_redis.SharedRateLimiter`)."""

    def try_start(self) -> bool: ...

    async def acquire(self) -> None: ...

    def pause_until(self, monotonic_deadline: float) -> None: ...

    def rate_limited(self) -> None: ...

    def state(self) -> Pace: ...

    async def aclose(self) -> None: ...


class RateLimiter:
    """Awaitable starts under a `StartSchedule`, FIFO among waiters."""

    def __init__(
        self, requests_per_second: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._schedule = StartSchedule(requests_per_second)
        self._adaptive = AdaptiveRate(requests_per_second)
        self._clock = clock
        self._waiters: deque[asyncio.Future[Start]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._starts: deque[float] = deque(maxlen=_OBSERVED_STARTS)  # for the observed rate
        self.pauses = 0

    @property
    def unlimited(self) -> bool:
        return self._schedule.rate is None

    def rate_limited(self) -> None:
        """The target answered 429: slow down (see `AdaptiveRate`)."""
        now = self._clock()
        while self._starts and now - self._starts[0] > 1.0:
            self._starts.popleft()
        if self._adaptive.on_rate_limited(now, float(len(self._starts))):
            self._schedule.set_rate(self._adaptive.current)

    def state(self) -> Pace:
        """The limiter as `status` and the progress line show it."""
        wait = self._schedule.paused_until - self._clock()
        paused = datetime.now(UTC) + timedelta(seconds=wait) if wait > 0 else None
        return Pace(
            configured_rps=self._adaptive.configured,
            current_rps=None if self._schedule.rate is None else round(self._schedule.rate, 2),
            rate_limited_responses=self._adaptive.rate_limited,
            rate_cuts=self._adaptive.cuts,
            pauses=self.pauses,
            paused_until=None if paused is None else paused.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )

    def try_start(self) -> bool:
        """Take a start without awaiting when nothing can hold one back: no rate in force (configured or
        adapted), no pause, nobody queued. Exactly what `acquire()` would do at once then, without its
        coroutine: the common case of a job with no rate limit. False: nothing was taken; await
        `acquire()`."""
        if self._schedule.rate is not None or self._waiters:
            return False
        now = self._clock()
        if now < self._schedule.paused_until:
            return False
        self._starts.append(now)  # no rate in force: this limiter is unconfigured and observes
        return True

    async def acquire(self) -> None:
        """Return when this caller may start a request."""
        now = self._clock()
        if self._adaptive.recover(now):
            self._schedule.set_rate(self._adaptive.current)
        if self._adaptive.configured is None:
            self._starts.append(now)  # only an unconfigured limiter adapts from the observed rate
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
        # Pauses that overlap (the rows in flight answered 429 together) are one pause, longer.
        if monotonic_deadline > self._schedule.paused_until and self._clock() >= self._schedule.paused_until:
            self.pauses += 1
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
