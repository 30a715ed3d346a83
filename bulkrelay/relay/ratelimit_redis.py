"""One rate limit shared by every shard of a job, kept in Redis (`execution.rate_limit.shared`).

The same two rules as the local limiter (ratelimit.py), decided atomically by one Lua script on the Redis
server, on the server's clock, so shards on different machines agree on time:

1. Pacing: one start per `1 / rate` seconds, from a shared "next slot".
2. The hard window: a sorted set holds the starts of the last second (plus a margin); a start is refused
   while it holds `limit = max(1, floor(rate))` of them.

A refused start gets back how long to wait and asks again after that. In one process one worker at a time
talks to Redis (a local lock), so a shard makes one round trip per start, not one per waiting worker.
`pause_until` (a 429 with Retry-After) pauses this shard at once and every other shard from its next
start: the pause is written to Redis too. A 429 does not lower the shared rate (AIMD is the local
limiter's: shards cannot agree on a cut without a round trip per answer); the configured rate is the
target's limit.

When Redis cannot be reached, or does not answer one question within `_ANSWER_DEADLINE_SECONDS` (a hung
or stopped server: connect, redis-py's one reconnect and the reply all count), the limiter raises
`SharedLimitUnavailable` and stays unavailable: every worker waiting behind the lock gets the same error
at once instead of asking a hung server in turn, so a shard halts within one deadline whatever its
concurrency. A shard never falls back to a local limit, which would exceed the shared one.

A Redis that restarted without its data has lost the window (the starts of the last second). Each shard
tells the script its own last start; when that start is under a window old and Redis no longer holds it,
the script holds every start until a whole window after it, rather than open a fresh window beside the
starts it forgot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import time

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from bulkrelay.job.redact import redact_url_credentials
from bulkrelay.relay.ratelimit import LimiterUnavailable, Pace

_WINDOW_MARGIN_US = 20_000  # arrivals jitter on the way to the target, more so from several machines
_MAX_LAG_US = 50_000  # missed pacing slots a late asker may still claim, as in the local limiter
_ANSWER_DEADLINE_SECONDS = 5.0  # one question to Redis, from connecting to the reply, retries included

# KEYS: starts (sorted set), next slot, pause. ARGV: limit, interval us, window us, lag us, member, this
# shard's last member and its start (0: none). Returns {wait, now}: wait 0 (go, at Redis time `now`) or
# the microseconds to wait before asking again.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
local window, lag = tonumber(ARGV[3]), tonumber(ARGV[4])
local last_start = tonumber(ARGV[7])
local paused = tonumber(redis.call('GET', KEYS[3]) or '0')
if last_start > now - window and not redis.call('ZSCORE', KEYS[1], ARGV[6]) then
  local until_ = last_start + window
  if until_ > paused then
    redis.call('SET', KEYS[3], until_, 'PX', math.ceil(window / 1000) + 1000)
    paused = until_
  end
end
if paused > now then return {paused - now, now} end
local slot = tonumber(redis.call('GET', KEYS[2]) or '0')
if slot > now then return {slot - now, now} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= limit then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {math.max(1, tonumber(oldest[2]) + window - now), now}
end
redis.call('ZADD', KEYS[1], now, ARGV[5])
local ttl = math.ceil(window / 1000) + 1000
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[2], math.max(slot, now - lag) + interval, 'PX', ttl)
return {0, now}
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
        super().__init__(redact_url_credentials(url), cause)


class SharedRateLimiter:
    """Awaitable starts under one limit kept in Redis for every process that names the same `key`."""

    def __init__(self, url: str, key: str, requests_per_second: float, *, shown: str | None = None) -> None:
        """`shown`: how messages name Redis (`${REDIS_URL}` when the URL is a secret); by default the URL
        without its credentials."""
        if not requests_per_second > 0:
            raise ValueError(f"requests_per_second must be positive, got {requests_per_second!r}")
        self._url = shown or url  # what errors name: never the secret's value
        self._url_shown = redact_url_credentials(self._url)
        self._rate = requests_per_second
        self._unavailable: SharedLimitUnavailable | None = None
        client = _client(url, self._url)
        if isinstance(client, SharedLimitUnavailable):  # the first start reports it: a halt, exit 12
            self._unavailable, client = client, aioredis.Redis()
        self._client = client
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
        self._last_start: tuple[str, int] = ("", 0)  # this shard's newest start: member, Redis time (us)
        self._turn = asyncio.Lock()
        self._local_pause_until = -math.inf
        self._pending: set[asyncio.Task[None]] = set()
        self.questions = 0  # asked of Redis, answered or not

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
                if self._unavailable is not None:  # found gone by a caller ahead: never ask again
                    raise self._unavailable
                local_wait = self._local_pause_until - time.monotonic()
                if local_wait > 0:
                    await asyncio.sleep(local_wait)
                wait_us = await self._ask()
                if wait_us == 0:
                    return
                await asyncio.sleep(wait_us / 1_000_000)

    async def _ask(self) -> int:
        member = next(self._members)
        self.questions += 1
        try:
            async with asyncio.timeout(_ANSWER_DEADLINE_SECONDS):
                wait_us, now = await self._acquire(
                    keys=self._keys, args=[*self._args, member, *self._last_start]
                )
        except TimeoutError:  # our deadline (builtin; before OSError, its base): redis's own is a RedisError
            self._unavailable = SharedLimitUnavailable(
                self._url, f"no answer within {_ANSWER_DEADLINE_SECONDS:g} s"
            )
            raise self._unavailable from None
        except (RedisError, OSError) as exc:
            self._unavailable = SharedLimitUnavailable(self._url, _cause(exc))
            raise self._unavailable from None
        except (TypeError, ValueError) as exc:  # a URL option the connection refuses (`?ssl_cert_reqs=`)
            self._unavailable = SharedLimitUnavailable(self._url, f"redis cannot use this URL: {_cause(exc)}")
            raise self._unavailable from None
        if int(wait_us) == 0:
            self._last_start = (member, int(now))
        return int(wait_us)

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
            async with asyncio.timeout(_ANSWER_DEADLINE_SECONDS):
                await self._pause(keys=[self._keys[2]], args=[micros])

    def rate_limited(self) -> None:
        """A 429: the shared rate stays as configured (AIMD is the local limiter's); the target's
        Retry-After, if any, pauses every shard through `pause_until`."""

    def state(self) -> Pace:
        """The limiter as `status` and the progress line show it."""
        return Pace(configured_rps=self._rate, current_rps=self._rate, shared=self._url_shown)

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        # Closing sends nothing, but a stopped server must not hold the end of the run either.
        with contextlib.suppress(RedisError, OSError):
            async with asyncio.timeout(_ANSWER_DEADLINE_SECONDS):
                await self._client.aclose()


def _client(url: str, shown: str) -> aioredis.Redis | SharedLimitUnavailable:
    try:
        return aioredis.Redis.from_url(
            url,
            socket_timeout=_ANSWER_DEADLINE_SECONDS,
            socket_connect_timeout=_ANSWER_DEADLINE_SECONDS,
            # One reconnect (a pooled connection Redis closed, say); the deadline bounds the whole question.
            retry=Retry(NoBackoff(), 1),
        )
    except (TypeError, ValueError) as exc:  # an option redis-py does not know (`?ssl_cert_reqs=` on redis://)
        return SharedLimitUnavailable(shown, f"redis cannot use this URL: {_cause(exc)}")


def _cause(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
