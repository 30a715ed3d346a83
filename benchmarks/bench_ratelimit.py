"""Achieved rate of `RateLimiter` over 10 s at 10, 100, 1000 and 5000 starts per second.

    uv run python benchmarks/bench_ratelimit.py [--seconds 10] [--workers 64] [--rates 10,100,1000,5000]

For each rate, `workers` tasks call `acquire()` in a loop (each yields to the loop once per start, like a
request would). Prints the achieved rate, its ratio to the configured one (the target is within 3%), the
most starts seen in any one-second window (must not exceed floor(rate)), and the most in any 100 ms
window against the even-pacing expectation (smoothness). `--work-us` burns CPU per start to load the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time

from bulkrelay.relay.ratelimit import RateLimiter, most_in_window


def _busy(seconds: float) -> None:
    """Burn CPU like per-request work would, so the loop wakes late as it does under load."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _measure(rate: float, seconds: float, workers: int, work: float) -> list[float]:
    limiter = RateLimiter(rate)
    starts: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while True:
            await limiter.acquire()
            now = time.monotonic()
            if now >= deadline:
                return
            starts.append(now)
            _busy(work)
            await asyncio.sleep(0)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return starts


def _report(rate: float, starts: list[float], seconds: float) -> None:
    achieved = len(starts) / seconds
    per_second = most_in_window(starts, 1.0)
    per_tenth = most_in_window(starts, 0.1)
    limit = max(1, math.floor(rate))
    window_ok = "ok" if per_second <= limit else "VIOLATED"
    print(
        f"{rate:8.0f}/s  achieved {achieved:9.1f}/s  ratio {achieved / rate:6.3f}  "
        f"max in 1 s {per_second:5d} (limit {limit}, {window_ok})  "
        f"max in 100 ms {per_tenth:4d} (even: {math.ceil(rate / 10)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--rates", default="10,100,1000,5000")
    parser.add_argument("--work-us", type=float, default=0.0, help="CPU burned per start (simulated load)")
    args = parser.parse_args()
    for rate in (float(r) for r in args.rates.split(",")):
        starts = asyncio.run(_measure(rate, args.seconds, args.workers, args.work_us / 1e6))
        _report(rate, starts, args.seconds)


if __name__ == "__main__":
    main()
