"""Our own Python a row: the relay's work with the network taken out, against the naive loop's.

    uv run python benchmarks/bench_ownwork.py [--rows 200000] [--repeats 3]

Against a fast target, a row's CPU is pyreqwest's (the same for every client) plus the caller's own
Python; what separates `bulkrelay run` from the naive loop of bench_run.py is the second part, and it is
what issue 44's CPU-a-row figures hinge on (docs/performance.md). Here both sides run in this process
against an instant in-process answer (a 200 after one event-loop checkpoint, `MockTransport`), so the CPU
they spend is their own work and the event loop's, with no socket, no Tokio thread and no GIL hand-over:

  naive    bench_run.py's loop without its client: 64 workers on uvloop split each CSV line, `orjson.dumps`
           it and await the answer;
  relay    `run_preflight` (every row read, validated and rendered once), then the engine's `relay` over a
           new run directory: the second read and render of each row, the sender, the window, the
           journal (written and fsynced on its thread), the checkpoint and the summary;
  batched  the same with `request.batch` of 100 items (bench_run.py's (f)).

CPU is the process's (`time.process_time`: every thread, the journal's writer too) per row. Runs
alternate; best of --repeats each. It moves far less with the machine's load than rows/s over loopback:
steer by it. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import uvloop
from bench_run import _csv_rows, _write_batch_job, _write_input, _write_job
from multidict import CIMultiDict, CIMultiDictProxy

from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import PreparedRequest
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay.engine import StartPoint, relay
from bulkrelay.relay.heap import relay_collections
from bulkrelay.relay.progress import NullReporter
from bulkrelay.relay.stopping import StopControl
from bulkrelay.relay.transport.base import Response
from bulkrelay.relay.transport.mock import MockTransport
from bulkrelay.store.rundir import RunDir

_UNREACHED = "http://127.0.0.1:9"  # never contacted: every request is answered in process
_HEADERS = CIMultiDictProxy(CIMultiDict({"content-type": "application/json", "content-length": "11"}))
_CONCURRENCY = 64


async def _answer(request: PreparedRequest) -> Response:
    await anyio.lowlevel.checkpoint()  # one trip through the event loop, as a real answer takes
    return Response(200, _HEADERS, b'{"ok":true}')


def _naive(path: Path) -> tuple[float, int]:
    """(CPU seconds, rows) of the naive loop's own work."""
    bodies = _csv_rows(path)
    sent = 0

    async def answered(body: bytes) -> int:
        await asyncio.sleep(0)
        return len(body)

    async def worker() -> None:
        nonlocal sent
        for body in bodies:
            await answered(body)
            sent += 1

    async def main() -> None:
        await asyncio.gather(*(worker() for _ in range(_CONCURRENCY)))

    started = time.process_time()
    uvloop.run(main())
    return time.process_time() - started, sent


def _relay(job: Path, runs: Path) -> tuple[float, float, int]:
    """(preflight's CPU seconds, the relay's, rows) of one in-process run against the instant answer."""
    started = time.process_time()
    preflight = run_preflight(load_job(job), None)
    preflight_cpu = time.process_time() - started
    shutil.rmtree(runs, ignore_errors=True)
    run = RunDir.create(runs, plan_for(preflight))
    started = time.process_time()
    with relay_collections():  # as `bulkrelay run` relays
        anyio.run(
            lambda: relay(
                preflight,
                run,
                StartPoint(),
                stop=StopControl(),
                reporter=NullReporter(),
                transport_factory=lambda _settings: MockTransport(_answer),
            ),
            backend_options={"use_uvloop": True},
        )
    rows = preflight.input_fingerprint.record_count
    return preflight_cpu, time.process_time() - started, rows


def _alternate(runs: list[Callable[[], None]], repeats: int) -> None:
    for _ in range(repeats):
        for run in runs:
            run()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        workdir = Path(tmp)
        path = workdir / "rows.csv"
        _write_input(path, args.rows)
        per_row = _write_job(workdir, _UNREACHED, path.name, _CONCURRENCY)
        batched = _write_batch_job(workdir, _UNREACHED, path.name, 8, 100)
        naive: list[float] = []
        relays: dict[str, list[tuple[float, float]]] = {"relay": [], "batched": []}

        def one_naive() -> None:
            cpu, rows = _naive(path)
            naive.append(cpu / rows * 1e6)
            print(f"naive      {naive[-1]:6.2f} µs a row", flush=True)

        def one_relay(name: str, job: Path) -> Callable[[], None]:
            def run() -> None:
                preflight_cpu, relay_cpu, rows = _relay(job, workdir / f"runs-{name}")
                relays[name].append((preflight_cpu / rows * 1e6, relay_cpu / rows * 1e6))
                pre, rel = relays[name][-1]
                print(
                    f"{name:10} {pre + rel:6.2f} µs a row (preflight {pre:.2f}, relay {rel:.2f})", flush=True
                )

            return run

        _alternate([one_naive, one_relay("relay", per_row), one_relay("batched", batched)], args.repeats)
        best_naive = min(naive)
        print(f"==> {args.rows:,} rows, best of {args.repeats}, CPU a row of our own Python (no network):")
        print(f"    naive loop {best_naive:.2f} µs")
        for name, measured in relays.items():
            pre, rel = min(measured, key=sum)
            print(
                f"    {name:10} {pre + rel:.2f} µs (preflight {pre:.2f}, relay {rel:.2f}): "
                f"{pre + rel - best_naive:+.2f} µs against the naive loop"
            )


if __name__ == "__main__":
    main()
