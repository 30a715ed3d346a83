"""Shards on one machine: aggregate rows/s of 1, 2 and 4 `run --shard K/N` processes, and the shared
limiter's cost per start against the local one.

    uv run python benchmarks/bench_shards.py [--rows 40000] [--concurrency 32]

The target is loopback nginx when installed (Debian nginx-light), else the built-in target in its own
process (then the target, not BulkRelay, is the bottleneck). No rate limit, so the shards go as fast as
the machine lets them; on two cores they saturate it, and the ratio to one shard says so. The limiter
part times `acquire()` at a rate far above what it can grant, against a real redis-server started here.
Prints figures and ratios; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_run import _write_input, _write_job
from nginx import loopback_target
from servers import redis_server

from bulkrelay.relay.ratelimit import RateLimiter
from bulkrelay.relay.ratelimit_redis import SharedRateLimiter


def _relay_with_shards(workdir: Path, job: Path, shards: int) -> float:
    """Rows/s of `shards` processes relaying the whole input together, start-up included."""
    runs = workdir / f"runs-{shards}-{time.monotonic_ns()}"
    base = [sys.executable, "-m", "bulkrelay", "run", str(job), "--budget", "0", "--json"]
    commands = [[*base, "--shard", f"{k}/{shards}", "--runs-dir", str(runs / str(k))] for k in range(shards)]
    started = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=workdir, stdout=subprocess.DEVNULL) for c in commands]
    codes = [proc.wait() for proc in procs]
    elapsed = time.perf_counter() - started
    if any(codes):
        raise RuntimeError(f"a shard failed: exit codes {codes}")
    return elapsed


async def _per_start(limiter: RateLimiter | SharedRateLimiter, starts: int) -> float:
    began = time.perf_counter()
    for _ in range(starts):
        await limiter.acquire()
    await limiter.aclose()
    return (time.perf_counter() - began) / starts


def _limiter_overhead(starts: int) -> None:
    fast = 1e9  # a rate no loop reaches: what is left is the limiter's own cost
    local = asyncio.run(_per_start(RateLimiter(fast), starts))
    with redis_server() as url:
        shared = asyncio.run(_per_start(SharedRateLimiter(url, "bench", fast), starts))
    print(f"limiter per start: local {local * 1e6:8.1f} µs   shared (Redis, loopback) {shared * 1e6:8.1f} µs")
    print(
        f"    shared / local {shared / local:.0f}x; one shard asks at most {1 / shared:,.0f} times a second"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--starts", type=int, default=5_000, help="acquire() calls timed per limiter")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        _write_input(workdir / "in.csv", args.rows)
        with loopback_target(workdir) as (url, description):
            print(f"{args.rows} rows, concurrency {args.concurrency} per shard, target: {description}")
            job = _write_job(workdir, url, "in.csv", args.concurrency)
            base = args.rows / _relay_with_shards(workdir, job, 1)
            print(f"1 shard   {base:9.0f} rows/s")
            for shards in (2, 4):
                rate = args.rows / _relay_with_shards(workdir, job, shards)
                print(f"{shards} shards  {rate:9.0f} rows/s   ratio to 1 shard {rate / base:.2f}")
    _limiter_overhead(args.starts)


if __name__ == "__main__":
    main()
