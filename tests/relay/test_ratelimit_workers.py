"""The rate limit and concurrency of a run in worker processes (relay/ratelimit_workers.py), and the
count `execution.workers: auto` takes (relay/affinity.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from bulkrelay.relay import affinity
from bulkrelay.relay.ratelimit import RateLimiter
from bulkrelay.relay.ratelimit_workers import WorkerLimiter, share_of_concurrency, share_of_rate


@pytest.mark.parametrize(("concurrency", "workers"), [(8, 4), (7, 3), (64, 8), (3, 3), (10, 4)])
def test_the_shares_of_concurrency_add_up_to_the_run_and_differ_by_one_at_most(
    concurrency: int, workers: int
) -> None:
    shares = [share_of_concurrency(concurrency, workers, index) for index in range(workers)]
    assert sum(shares) == concurrency
    assert max(shares) - min(shares) <= 1 and min(shares) >= 1


def test_each_worker_paces_at_an_even_share_of_the_rate() -> None:
    assert share_of_rate(500, 4) == 125
    assert share_of_rate(None, 4) is None


def test_a_pause_asked_of_one_worker_is_told_and_a_pause_heard_is_kept() -> None:
    told: list[float] = []

    async def main() -> None:
        inner = RateLimiter(100)
        limiter = WorkerLimiter(inner, told.append)
        now = time.monotonic()
        limiter.pause_until(now + 5)
        assert told == [now + 5]
        assert inner.state().paused_until is not None
        other = WorkerLimiter(RateLimiter(100), told.append)
        other.heard_pause(now + 5)  # a sibling's pause: kept, not told again
        assert told == [now + 5]
        assert not other.try_start()  # held: no start before the deadline

    anyio.run(main)


def test_auto_takes_the_cpus_of_the_affinity_the_cgroup_quota_and_at_most_eight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(affinity, "_CGROUP_CPU_MAX", cpu_max)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert affinity.usable_cpus() == 8  # no cgroup file: the affinity, capped
    cpu_max.write_text("max 100000\n")
    assert affinity.usable_cpus() == 8  # no quota
    cpu_max.write_text("150000 100000\n")
    assert affinity.usable_cpus() == 2  # 1.5 CPUs: two processes
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert affinity.usable_cpus() == 1
