"""Transport throughput: 20k POSTs at concurrency 64, naive aiohttp, pyreqwest and httpx loops vs both seams.

    uv run python benchmarks/bench_transport.py [--requests 20000] [--concurrency 64] [--url URL]
                                                [--loop uvloop|asyncio]

Without --url it starts the embedded target in a separate process (recording off), so the server does not
share this process's event loop; the embedded target is itself Python and is then the bottleneck, so point
--url at a fast server (nginx) to compare clients. Prints rows/s for each client, the two transports behind
the seam (reqwest and httpx) side by side, and each seam's ratio to its own client's naive loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import httpx
import uvloop
from nginx import builtin_target  # benchmarks/nginx.py
from pyreqwest.client import ClientBuilder

from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import ClientName, TransportSettings

_BODY = b'{"customer_id": "c-000123", "email": "someone@example.com", "source": "migration"}'
_HEADERS = (("Content-Type", "application/json"), ("Authorization", "Bearer not-a-secret"))


@contextlib.contextmanager
def _target_process() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp, builtin_target(Path(tmp)) as url:
        yield url


async def _drive(total: int, concurrency: int, one: Callable[[int], Awaitable[int]]) -> float:
    """Run `total` calls of `one` with `concurrency` workers; rows per second."""
    next_index = 0
    failures = 0

    async def worker() -> None:
        nonlocal next_index, failures
        while next_index < total:
            index = next_index
            next_index += 1
            if await one(index) != 200:
                failures += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{failures} requests did not answer 200")
    return total / elapsed


async def _naive_aiohttp(url: str, total: int, concurrency: int) -> float:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(index: int) -> int:
            headers = {**dict(_HEADERS), "Idempotency-Key": f"k{index}"}
            async with session.post(f"{url}/v1/items/{index}", data=_BODY, headers=headers) as resp:
                await resp.read()
                return resp.status

        return await _drive(total, concurrency, one)


async def _naive_pyreqwest(url: str, total: int, concurrency: int) -> float:
    async with ClientBuilder().max_connections(concurrency).build() as client:

        async def one(index: int) -> int:
            headers = (*_HEADERS, ("Idempotency-Key", f"k{index}"))
            request = client.post(f"{url}/v1/items/{index}").headers(headers).body_bytes(_BODY).build()
            resp = await request.send()
            await resp.bytes()
            return resp.status

        return await _drive(total, concurrency, one)


async def _seam(url: str, total: int, concurrency: int, client: ClientName = "reqwest") -> float:
    settings = TransportSettings(
        concurrency, connect_seconds=10, read_seconds=30, write_seconds=30, pool_seconds=5, client=client
    )
    transport = open_transport(settings)
    try:

        async def one(index: int) -> int:
            headers = (*_HEADERS, ("Idempotency-Key", f"k{index}"))
            request = PreparedRequest("POST", f"{url}/v1/items/{index}", headers, _BODY)
            return (await transport.send(request)).status

        return await _drive(total, concurrency, one)
    finally:
        await transport.aclose()


async def _httpx(url: str, total: int, concurrency: int) -> float:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as client:

        async def one(index: int) -> int:
            headers = {**dict(_HEADERS), "Idempotency-Key": f"k{index}"}
            resp = await client.post(f"{url}/v1/items/{index}", content=_BODY, headers=headers)
            return int(resp.status_code)

        return await _drive(total, concurrency, one)


async def _bench(url: str, total: int, concurrency: int) -> None:
    await _naive_aiohttp(url, min(total, 2000), concurrency)  # warm up both ends
    naive = await _naive_aiohttp(url, total, concurrency)
    print(f"(a) naive aiohttp loop     {naive:9.0f} rows/s")
    plain = await _naive_pyreqwest(url, total, concurrency)
    print(f"(b) naive pyreqwest loop   {plain:9.0f} rows/s")
    seam = await _seam(url, total, concurrency)
    print(f"(c) seam on reqwest        {seam:9.0f} rows/s")
    print(f"    ratio (c)/(a) {seam / naive:.2f}   ratio (c)/(b) {seam / plain:.2f}")
    slow = await _httpx(url, total, concurrency)
    print(f"(d) naive httpx loop       {slow:9.0f} rows/s")
    seam_httpx = await _seam(url, total, concurrency, "httpx")
    print(f"(e) seam on httpx          {seam_httpx:9.0f} rows/s")
    print(f"    ratio (e)/(d) {seam_httpx / slow:.2f}   ratio (c)/(e) {seam / seam_httpx:.2f}")


def _run(url: str, total: int, concurrency: int, loop: str) -> None:
    bench = _bench(url, total, concurrency)
    if loop == "uvloop":
        uvloop.run(bench)
    else:
        asyncio.run(bench)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--url", help="an HTTP server answering 200 to POST (default: the embedded target)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="uvloop: as in a run")
    args = parser.parse_args()
    print(f"{args.requests} POSTs at concurrency {args.concurrency}, {args.loop} event loop")
    if args.url:
        _run(args.url.rstrip("/"), args.requests, args.concurrency, args.loop)
        return
    with _target_process() as url:
        print(f"target: embedded, separate process, {url}")
        _run(url, args.requests, args.concurrency, args.loop)


if __name__ == "__main__":
    main()
