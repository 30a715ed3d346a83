"""The shared rate limit against a real redis-server: several limiters (as shards would) share one limit."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from bulkrelay.relay.ratelimit import most_in_window
from bulkrelay.relay.ratelimit_redis import SharedLimitUnavailable, SharedRateLimiter
from tests.redisproc import RedisProcess
from tests.waiting import HANG_S

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: real processes, outside the fast lane


async def _starts(limiter: SharedRateLimiter, workers: int, until: float, starts: list[float]) -> None:
    async def worker() -> None:
        while time.monotonic() < until:
            await limiter.acquire()
            starts.append(time.monotonic())

    await asyncio.gather(*(worker() for _ in range(workers)))


async def _shared_pause(url: str, key: str) -> int:
    """The end of the pause shared under `key` (Redis microseconds), once some shard has written it."""
    client = aioredis.Redis.from_url(url)

    async def written() -> int:
        while (paused := await client.get(f"bulkrelay:limit:{key}:pause")) is None:
            await asyncio.sleep(0.01)  # the shard writes it in a task of its own, as soon as it runs
        return int(paused)

    try:
        return await asyncio.wait_for(written(), HANG_S)
    finally:
        await client.aclose()


async def _server_time(url: str) -> int:
    """Now on Redis's clock, in microseconds: the clock the shared limit decides by."""
    client = aioredis.Redis.from_url(url)
    try:
        seconds, micros = await client.time()
        return seconds * 1_000_000 + micros
    finally:
        await client.aclose()


async def test_four_limiters_on_one_key_keep_one_limit_together() -> None:
    rate = 40
    with RedisProcess() as url:
        shards = [SharedRateLimiter(url, "one-target", rate) for _ in range(4)]
        starts: list[float] = []
        until = time.monotonic() + 2.5
        await asyncio.gather(*(_starts(shard, 8, until, starts) for shard in shards))
        for shard in shards:
            await shard.aclose()
    starts.sort()
    # The limit holds for all four together. Redis grants by its own clock; these times are taken when each
    # caller resumes, which a busy machine delays, so the window is read a little short and one start over
    # is allowed (the issue's ±3%). And they are not starved: close to 2.5 s at the rate.
    assert most_in_window(starts, 0.95) <= rate + 1
    assert len(starts) >= rate * 2


async def test_other_keys_have_limits_of_their_own() -> None:
    with RedisProcess() as url:
        first, second = SharedRateLimiter(url, "a", 20), SharedRateLimiter(url, "b", 20)
        a: list[float] = []
        b: list[float] = []
        until = time.monotonic() + 1.5
        await asyncio.gather(_starts(first, 4, until, a), _starts(second, 4, until, b))
        await first.aclose()
        await second.aclose()
    assert len(a) >= 20 and len(b) >= 20  # neither took the other's share


async def test_a_pause_in_one_shard_holds_every_shard() -> None:
    with RedisProcess() as url:
        pausing, other = SharedRateLimiter(url, "t", 100), SharedRateLimiter(url, "t", 100)
        await pausing.acquire()
        pausing.pause_until(time.monotonic() + 0.8)
        paused_until = await _shared_pause(url, "t")  # on Redis's clock, once the pause has reached it
        await other.acquire()
        released_at = await _server_time(url)
        await pausing.aclose()
        await other.aclose()
    # Held by the pause the other shard shared (not only by pacing, 10 ms): it started after the pause
    # ended on Redis's clock, which no load on this machine moves.
    assert released_at >= paused_until


async def test_unreachable_redis_is_an_error_not_a_local_fallback() -> None:
    server = RedisProcess()
    url = server.__enter__()
    limiter = SharedRateLimiter(url, "t", 10)
    await limiter.acquire()
    server.kill()
    with pytest.raises(SharedLimitUnavailable) as caught:
        await limiter.acquire()
    await limiter.aclose()
    server.__exit__(None, None, None)
    assert "unavailable" in str(caught.value)


def test_a_password_never_appears_in_the_error() -> None:
    error = SharedLimitUnavailable("redis://:hunter2secret@127.0.0.1:1/0", "refused")
    assert "hunter2secret" not in str(error)
    assert error.url == "redis://***@127.0.0.1:1/0"


async def test_a_hung_redis_is_asked_once_and_every_waiting_worker_fails_with_it() -> None:
    """SIGSTOP: the kernel still accepts, nothing answers. The first question runs out of its deadline and
    the 23 workers queued behind it get the same error without asking again (issue 22.10: they used to
    ask one after another, each for a socket timeout and redis-py's retries)."""
    server = RedisProcess()
    url = server.__enter__()
    limiter = SharedRateLimiter(url, "t", 50)
    try:
        await limiter.acquire()
        asked = limiter.questions
        server.hang()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(limiter.acquire() for _ in range(24)), return_exceptions=True), HANG_S
        )
        await asyncio.wait_for(limiter.aclose(), HANG_S)  # a stopped server does not hold the end either
    finally:
        server.wake()
        server.__exit__(None, None, None)
    assert all(isinstance(outcome, SharedLimitUnavailable) for outcome in outcomes), outcomes
    assert limiter.questions - asked == 1
    assert "no answer within" in str(outcomes[0])


async def test_a_redis_that_lost_its_window_holds_every_start_for_a_whole_window() -> None:
    """A Redis restarted without its data forgets the last second's starts: starting at once would put
    them beside a fresh window (81 in a window of 80). FLUSHALL is what such a restart leaves."""
    with RedisProcess() as url:
        limiter = SharedRateLimiter(url, "t", 100)
        other = SharedRateLimiter(url, "t", 100)  # another shard, which never started
        for _ in range(3):
            await limiter.acquire()
        before_last = await _server_time(url)
        await limiter.acquire()
        client = aioredis.Redis.from_url(url)
        await client.flushall()
        await client.aclose()
        await limiter.acquire()  # this shard notices the loss, and holds every shard
        released = await _server_time(url)
        await other.acquire()
        other_released = await _server_time(url)
        await limiter.aclose()
        await other.aclose()
    # The last start was at or after `before_last`; nothing starts until a whole window after it.
    assert released - before_last >= 1_000_000
    assert other_released - before_last >= 1_000_000
