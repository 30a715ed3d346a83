"""One rate limit shared by every shard of a job, kept in Redis (`execution.rate_limit.shared`).

The same two rules as the local limiter (ratelimit.py), decided atomically by one Lua script on the Redis
server, on the server's clock, so shards on different machines agree on time:

1. Pacing: one start per `1 / rate` seconds, from a shared "next slot".
2. The hard window: a sorted set holds the starts of the last second (plus a margin); a start is refused
   while it holds `limit = max(1, floor(rate))` of them.

A refused start gets back how long to wait and asks again after that. In one process one worker at a time
talks to Redis (a local lock), so a shard makes one round trip per start, not one per waiting worker.
`pause_until` (a 429 with Retry-After) pauses this shard at once and every other shard from its next
start: the pause is written to Redis too. When Redis cannot be reached the limiter raises
`SharedLimitUnavailable`: a shard never falls back to a local limit, which would exceed the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from bulkrelay.relay.ratelimit import LimiterUnavailable

_WINDOW_MARGIN_US = 20_000  # arrivals jitter on the way to the target, more so from several machines
_MAX_LAG_US = 50_000  # missed pacing slots a late asker may still claim, as in the local limiter
_SOCKET_TIMEOUT_SECONDS = 5.0

# KEYS: starts (sorted set), next slot, pause. ARGV: limit, interval us, window us, lag us, member.
# Returns 0 (go) or the microseconds to wait before asking again.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, lag = tonumber(ARGV[3]), tonumber(ARGV[4])
local paused = tonumber(redis.call('GET', KEYS[3]) or '0')
if paused > now then return paused - now end
local slot = tonumber(redis.call('GET', KEYS[2]) or '0')
if slot > now then return slot - now end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[5])
local ttl = math.ceil(window / 1000) + 1000
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[2], math.max(slot, now - lag) + interval, 'PX', ttl)
return 0
"""

# KEYS: pause. ARGV: microseconds from now. Never shortens a pause another shard set.
_PAUSE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_ = now + tonumber(ARGV[1])
if until_ > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], until_, 'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
end
return 0
"""


class SharedLimitUnavailable(LimiterUnavailable):
    """Redis, which keeps the shared limit, could not be reached or refused the script."""

    def __init__(self, url: str, cause: str) -> None:
        super().__init__(_redacted(url), cause)


class SharedRateLimiter:
    """Awaitable starts under one limit kept in Redis for every process that names the same `key`."""

    def __init__(self, url: str, key: str, requests_per_second: float) -> None:
        if not requests_per_second > 0:
            raise ValueError(f"requests_per_second must be positive, got {requests_per_second!r}")
        self._url = url
        self._url_shown = _redacted(url)
        self._rate = requests_per_second
        self._client = aioredis.Redis.from_url(
            url, socket_timeout=_SOCKET_TIMEOUT_SECONDS, socket_connect_timeout=_SOCKET_TIMEOUT_SECONDS
        )
        self._acquire = self._client.register_script(_ACQUIRE)
        self._pause = self._client.register_script(_PAUSE)
        prefix = f"bulkrelay:limit:{key}"
        self._keys = [f"{prefix}:starts", f"{prefix}:slot", f"{prefix}:pause"]
        self._args = [
            max(1, math.floor(requests_per_second)),
            round(1_000_000 / requests_per_second),
            1_000_000 + _WINDOW_MARGIN_US,
            _MAX_LAG_US,
        ]
        self._members = (f"{os.getpid()}-{id(self)}-{n}" for n in itertools.count())
        self._turn = asyncio.Lock()
        self._local_pause_until = -math.inf
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def unlimited(self) -> bool:
        return False

    def try_start(self) -> bool:
        """Never: every start is asked of Redis (`acquire`)."""
        return False

    async def acquire(self) -> None:
        """Return when this caller may start a request; raise `SharedLimitUnavailable` without Redis."""
        async with self._turn:
            while True:
                local_wait = self._local_pause_until - time.monotonic()
                if local_wait > 0:
                    await asyncio.sleep(local_wait)
                wait_us = await self._ask()
                if wait_us == 0:
                    return
                await asyncio.sleep(wait_us / 1_000_000)

    async def _ask(self) -> int:
        try:
            return int(await self._acquire(keys=self._keys, args=[*self._args, next(self._members)]))
        except (RedisError, OSError) as exc:
            raise SharedLimitUnavailable(self._url, _cause(exc)) from None

    def pause_until(self, monotonic_deadline: float) -> None:
        """Hold this shard's starts until the deadline at once, and every shard's through Redis."""
        self._local_pause_until = max(self._local_pause_until, monotonic_deadline)
        micros = max(0, round((monotonic_deadline - time.monotonic()) * 1_000_000))
        task = asyncio.get_running_loop().create_task(self._share_pause(micros))
        self._pending.add(task)  # keep a reference until it is done
        task.add_done_callback(self._pending.discard)

    async def _share_pause(self, micros: int) -> None:
        # This shard is paused locally already; its next acquire reports Redis being gone.
        with contextlib.suppress(RedisError, OSError):
            await self._pause(keys=[self._keys[2]], args=[micros])

    def rate_limited(self) -> None:
        """A 429: the shared rate stays as configured (AIMD is the local limiter's); the target's
        Retry-After, if any, pauses every shard through `pause_until`."""

    def state(self) -> dict[str, Any]:
        """The limiter as `status` and the progress line show it."""
        return {"configured_rps": self._rate, "current_rps": self._rate, "shared": self._url_shown}

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self._client.aclose()


def _cause(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _redacted(url: str) -> str:
    """The URL without a password (redis://:secret@host/0 → redis://***@host/0)."""
    scheme, sep, rest = url.partition("://")
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}"
