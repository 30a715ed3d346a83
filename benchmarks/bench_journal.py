"""Journal throughput: group-commit writes, then a full validating scan.

    uv run python benchmarks/bench_journal.py [--rows 1000000] [--dir PATH]

Writes `--rows` entries through `JournalWriter` (real fsyncs, on the disk holding `--dir`; the CPU
time is printed too, and how much of it the event loop's thread spent: the batches are encoded in
the writer's thread), then times `scan_journal` against a bare loop of `orjson.loads` over the same
file's lines, the baseline measured in the same run: once line by line (no prefix, as for a run
without one) and once with the committed prefix the writer kept (what a resume does). Prints rates
and the scan/baseline ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio
import orjson

from bulkrelay.store.journal import CommittedPrefix, JournalEntry, JournalState, JournalWriter, scan_journal
from bulkrelay.store.storage import Storage


class _CountingStorage(Storage):
    def __init__(self) -> None:
        super().__init__()
        self.fsyncs = 0

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        super().fsync(fd)


def _entry(row: int) -> JournalEntry:
    ok = row % 50 != 0
    return JournalEntry(
        row_number=row,
        success=ok,
        classification="ok" if ok else "http_server_error",
        status_code=201 if ok else 503,
        attempts=1 if ok else 3,
        retryable=not ok,
        error=None if ok else "HTTP 503 Service Unavailable",
        duration_ms=12.5 + row % 97,
        latency_ms=12.5 + row % 89,
        key=f"customer-{row}",
        idempotency_key=f"{row:032x}",
        captured={"remote_id": f"r{row}"},
    )


async def _write(path: Path, rows: int, storage: Storage) -> tuple[int, CommittedPrefix | None, float]:
    """(batches, the writer's prefix, CPU seconds of the event loop's thread)."""
    batches = 0

    def on_commit(entries: list[JournalEntry], end_offset: int) -> None:
        nonlocal batches
        batches += 1

    writer = JournalWriter(path, storage, next_seq=1, on_commit=on_commit, state=JournalState.empty(rows))
    loop_started = time.thread_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for row in range(1, rows + 1):
            await writer.submit(_entry(row))
        await writer.close()
    return batches, writer.prefix(), time.thread_time() - loop_started


def _bare_loads(path: Path) -> None:
    with path.open("rb") as stream:
        for line in stream:
            orjson.loads(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: system temp dir)")
    args = parser.parse_args()
    rows: int = args.rows
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "results.jsonl"
        storage = _CountingStorage()
        started, cpu_started = time.perf_counter(), time.process_time()
        batches, prefix, loop_cpu_s = anyio.run(_write, path, rows, storage)
        write_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        size = path.stat().st_size
        print(
            f"write: {rows} rows, {size / 1e6:.1f} MB, {batches} batches, {storage.fsyncs} fsyncs, "
            f"{write_s:.2f} s = {rows / write_s:,.0f} rows/s; CPU {cpu_s / rows * 1e6:.2f} us/row "
            f"(building the entries included), {loop_cpu_s / rows * 1e6:.2f} of it on the event loop"
        )

        started = time.perf_counter()
        _bare_loads(path)
        base_s = time.perf_counter() - started
        started = time.perf_counter()
        scan = scan_journal(path, committed_seq=rows, committed_offset=size, row_count=rows)
        scan_s = time.perf_counter() - started
        assert scan.last_seq == rows and scan.torn_tail is None
        print(f"baseline orjson.loads loop: {rows / base_s:,.0f} lines/s ({base_s:.2f} s)")
        print(f"scan_journal (validating):  {rows / scan_s:,.0f} lines/s ({scan_s:.2f} s)")
        print(f"ratio scan/baseline time: {scan_s / base_s:.2f}x")
        started = time.perf_counter()
        fast = scan_journal(path, committed_seq=rows, committed_offset=size, row_count=rows, prefix=prefix)
        fast_s = time.perf_counter() - started
        assert fast.last_seq == rows and fast.done.to_bytes() == scan.done.to_bytes()
        print(f"scan_journal with the prefix: {rows / fast_s:,.0f} lines/s ({fast_s:.2f} s)")
        print(f"ratio prefix scan/baseline time: {fast_s / base_s:.2f}x")


if __name__ == "__main__":
    main()
