"""The rate limit of a run in several worker processes (`execution.workers`), kept without Redis.

Each of N workers paces its own starts at `rate / N` (its local `RateLimiter`), so the run's starts in
any second stay within the rate, with no round trip a request: the workers' rows are shared out evenly
(ops/sharding.py `WorkerShare`), so each has about a Nth of them. A worker that ends early leaves its
share unused, which makes the run's tail slower, never faster than the rate. What a target says to one
worker it says to all: a 429's pause (`Retry-After`, a quota's reset) is told to the run's parent, which
tells every other worker, and each holds its starts until the same deadline (the monotonic clock is the
machine's, one for every process). A limit shared through Redis (`rate_limit.shared`) is kept there
instead, whole: the workers are then simply more of its clients.
"""

from __future__ import annotations

from collections.abc import Callable

from bulkrelay.relay.ratelimit import Limiter, Pace


class WorkerLimiter:
    """A worker's limiter: `inner` (its share of the rate, or the shared limit) that tells `tell` of
    each pause it is asked to make, and makes the pauses its siblings were asked to (`heard_pause`)."""

    def __init__(self, inner: Limiter, tell: Callable[[float], None]) -> None:
        self._inner = inner
        self._tell = tell
        self.try_start = inner.try_start  # the hot path: no call through this object
        self.acquire = inner.acquire
        self.rate_limited = inner.rate_limited
        self.state: Callable[[], Pace] = inner.state

    def pause_until(self, monotonic_deadline: float) -> None:
        self._inner.pause_until(monotonic_deadline)
        self._tell(monotonic_deadline)

    def heard_pause(self, monotonic_deadline: float) -> None:
        """Another worker of the run was told to pause until then: so does this one."""
        self._inner.pause_until(monotonic_deadline)

    async def aclose(self) -> None:
        await self._inner.aclose()


def share_of_rate(requests_per_second: float | None, workers: int) -> float | None:
    """Each worker's rate: an even share of the run's (None: unlimited)."""
    return None if requests_per_second is None else requests_per_second / workers


def share_of_concurrency(concurrency: int, workers: int, index: int) -> int:
    """Worker `index`'s requests in flight at most: the run's `concurrency` shared out, the first
    workers taking one more when it does not divide, so that the shares add up to it exactly."""
    return concurrency // workers + (1 if index < concurrency % workers else 0)
