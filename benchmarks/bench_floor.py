"""The floor of a relay that journals every row: the naive pyreqwest loop against the same loop doing
only what BulkRelay's promises need at least, in one script against the same loopback nginx.

    uv run python benchmarks/bench_floor.py [--rows 200000] [--repeats 3]

  naive      bench_run.py's baseline (a): split each CSV line, orjson.dumps it, POST it;
  journaled  the same, plus the csv module's parsing, a SHA-256 key of each body, and a journal entry
             a row encoded with orjson and written and fsynced by a writer thread every 10 ms;
  threaded   `journaled` on pyreqwest's multithreaded Tokio runtime.
No preflight, retries, limiter, metrics, checksums or checkpoints: what `bulkrelay run` does beyond
these only adds. So `journaled / naive` is an upper bound for issue 29's item 1 in one Python process
(docs/performance.md). Runs alternate; best of --repeats each; CPU per row for the process and its
main thread. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import hashlib
import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson
import uvloop
from bench_run import _naive_reqwest, _write_input
from nginx import loopback_target  # benchmarks/nginx.py
from pyreqwest.client import ClientBuilder
from pyreqwest.http import Url

_COMMIT_SECONDS = 0.01


class _Journal:
    """Entries queued by the event loop, encoded, written and fsynced by one thread every 10 ms."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._pending: list[dict[str, Any]] = []
        self._closing = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def offer(self, entry: dict[str, Any]) -> None:
        self._pending.append(entry)

    def _run(self) -> None:
        while True:
            time.sleep(_COMMIT_SECONDS)
            batch, self._pending = self._pending, []
            if batch:
                os.write(self._fd, b"".join(orjson.dumps(entry) + b"\n" for entry in batch))
                os.fsync(self._fd)
            elif self._closing:
                return

    def close(self) -> None:
        self._closing = True
        self._thread.join()
        os.close(self._fd)


async def _journaled(
    url: str, path: Path, concurrency: int, journal_path: Path, threaded: bool
) -> tuple[int, float]:
    client = ClientBuilder().max_connections(concurrency).runtime_multithreaded(threaded).build()
    target = Url(f"{url}/v1/customers")
    journal = _Journal(journal_path)
    sent = 0
    with path.open(newline="") as lines:
        reader = csv.reader(lines)
        next(reader)
        rows = enumerate(reader, 1)

        async def worker() -> None:
            nonlocal sent
            for number, row in rows:  # one iterator shared by every worker
                body = orjson.dumps({"id": int(row[0]), "email": row[1], "name": row[2]})
                key = hashlib.sha256(body).hexdigest()[:32]
                started = time.monotonic()
                request = client.request("POST", target).header("Content-Type", "application/json")
                async with request.body_bytes(body).build_streamed() as response:
                    await response.bytes()
                    status = response.status
                milliseconds = int((time.monotonic() - started) * 1_000_000) / 1000
                journal.offer(
                    {"row_number": number, "success": status == 200, "status_code": status, "attempts": 1,
                     "duration_ms": milliseconds, "latency_ms": milliseconds, "key": row[0],
                     "idempotency_key": key}
                )  # fmt: skip
                sent += 1

        begun = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - begun
    journal.close()
    await client.close()
    return sent, elapsed


def _measured(name: str, run: Callable[[], Coroutine[Any, Any, tuple[int, float]]]) -> float:
    before, thread = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    sent, elapsed = uvloop.run(run())
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / sent * 1e6
    main = (time.thread_time() - thread) / sent * 1e6
    print(f"    {name:9} {sent / elapsed:9,.0f} rows/s  (CPU {cpu:5.1f} µs/row, main thread {main:5.1f})")
    return sent / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, loopback_target(Path(tmp)) as (url, shown):
        workdir = Path(tmp)
        path = workdir / "rows.csv"
        _write_input(path, args.rows)
        load = os.getloadavg()[0]
        print(f"target: {shown}; {args.rows:,} rows, concurrency {args.concurrency}; load {load:.2f}")
        sides: dict[str, Callable[[], Coroutine[Any, Any, tuple[int, float]]]] = {
            "naive": lambda: _naive_reqwest(url, path, args.concurrency),
            "journaled": lambda: _journaled(url, path, args.concurrency, workdir / "j1.jsonl", False),
            "threaded": lambda: _journaled(url, path, args.concurrency, workdir / "j2.jsonl", True),
        }
        best = dict.fromkeys(sides, 0.0)
        for attempt in range(args.repeats):
            print(f"round {attempt + 1}")
            for name, run in sides.items():
                best[name] = max(best[name], _measured(name, run))
        ratios = ", ".join(
            f"{name} {rate / best['naive']:.2f}" for name, rate in best.items() if name != "naive"
        )
        print(f"==> best of {args.repeats}, against the naive loop: {ratios}")


if __name__ == "__main__":
    main()
