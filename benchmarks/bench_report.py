"""The run report of a 1M-row run: its build time against one plain read of the journal, and its peak RSS.

    uv run python benchmarks/bench_report.py [--rows 1000000] [--dir PATH] [--repeat 3]

Synthesizes a finished-looking run: `run.json`, a journal of `--rows` lines written with `encode_batch`
(every 50th row a 422 with a body, every 20th retried once, latencies spread over four decades), a
`summary.json`, and a `run.log` with the interval lines a run at 2,000 rows/s writes (one each 2 s,
a 429 pause every 100 intervals, a stop and a resume half way). Then, each in a fresh process so its
peak RSS is its own: (a) `summarize` (the baseline: one streamed read of the journal, what `summary.json`
costs), (b) `build_report` on the same run, and (c) `build_report` on a run of a tenth of the rows, so
the two peaks show memory flat with the rows. Prints the best time of `--repeat`, peak RSS, and ratios.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from bulkrelay.store.atomic import write_json_atomic
from bulkrelay.store.journal import JournalEntry, encode_batch
from bulkrelay.store.manifest import InputRecord, RunPlan
from bulkrelay.store.rundir import SUMMARY, RunDir, RunState
from bulkrelay.store.summary import summarize

_BATCH = 10_000
_RATE = 2000  # rows per second of the synthesized run


def _entry(row: int) -> JournalEntry:
    failed = row % 50 == 0
    return JournalEntry(
        row_number=row,
        success=not failed,
        classification="http_client_error" if failed else "success",
        status_code=422 if failed else 200,
        attempts=2 if row % 20 == 0 else 1,
        retryable=False,
        error="HTTP 422" if failed else None,
        duration_ms=1.0 + (row * 7919) % 4000 / 10,
        latency_ms=0.5 + (row * 104729) % 40000 / 10,
        key=f"c-{row}",
        response_body='{"error":"invalid email","field":"email"}' if failed else None,
    )


def _journal(path: Path, rows: int) -> None:
    with path.open("wb") as out:
        for first in range(1, rows + 1, _BATCH):
            entries = [_entry(row) for row in range(first, min(first + _BATCH, rows + 1))]
            out.write(b"".join(encode_batch(first, entries)))


def _log(path: Path, rows: int, started: float) -> None:
    def line(at: float, event: str, **fields: object) -> bytes:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"
        return orjson.dumps({"ts": ts, "event": event, "pid": 1, **fields}) + b"\n"

    per = _RATE * 2
    intervals = max(1, rows // per)
    with path.open("wb") as out:
        out.write(line(started, "start", command="run") + line(started, "preflight_done"))
        for i in range(intervals):
            at = started + 2 * (i + 1) + (60 if i >= intervals // 2 else 0)
            if i == intervals // 2:
                out.write(line(at - 62, "stop_requested", reason="interrupted") + line(at - 61, "stop"))
                out.write(line(at - 3, "start", command="resume") + line(at - 2, "preflight_done"))
            if i % 100 == 50:
                out.write(line(at - 1, "pause_429", seconds=1.0))
            responses = {"2xx": per - per // 50, "4xx": per // 50}
            fields = {"seconds": 2.0, "committed": per, "ok": per - per // 50, "failed": per // 50}
            out.write(
                line(at, "interval", **fields, responses=responses, retries=per // 20, current_rps=None)
            )
        out.write(line(started + 2 * intervals + 61, "stop", state="completed_with_failures"))
        out.write(line(started + 2 * intervals + 61, "exit", exit_code=3))


def synthesize(directory: Path, rows: int) -> Path:
    record = InputRecord(str(directory / "data.csv"), "csv", False, "0" * 64, rows * 40, rows)
    run = RunDir.create(
        directory, RunPlan(job_path=str(directory / "job.yaml"), input=record, config_sha256="0" * 64)
    )
    _journal(run.journal_path, rows)
    _log(run.path / "run.log", rows, time.time() - 3600)
    write_json_atomic(run.path / SUMMARY, summarize(run.journal_path, total_rows=rows))
    run.mark_ended(RunState.COMPLETED_WITH_FAILURES, None)
    return run.path


def _measure(what: str, run_dir: Path, repeat: int) -> tuple[float, float, float]:
    """Best wall seconds, best CPU seconds and peak RSS (MiB) of `what` in a fresh process (the machine
    may be shared: CPU time is what the work itself costs)."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", what, str(run_dir), "--repeat", str(repeat)],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split()
    return float(out[0]), float(out[1]), float(out[2])


def _child(what: str, run_dir: Path, repeat: int) -> None:
    from bulkrelay.ops.report import build_report

    best = best_cpu = float("inf")
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        if what == "summarize":
            summarize(run_dir / "results.jsonl", total_rows=0)
        else:
            build_report(RunDir.open(run_dir))
        best = min(best, time.perf_counter() - started)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{best:.3f} {best_cpu:.3f} {peak:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], Path(args.child[1]), args.repeat)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        big = synthesize(Path(tmp) / "big", args.rows)
        small = synthesize(Path(tmp) / "small", args.rows // 10)
        base = _measure("summarize", big, args.repeat)
        big_report = _measure("report", big, args.repeat)
        small_report = _measure("report", small, args.repeat)
    for what, (wall, cpu, rss) in (
        (f"summarize {args.rows:,} rows (one read of the journal)", base),
        (f"report of {args.rows:,} rows", big_report),
        (f"report of {args.rows // 10:,} rows", small_report),
    ):
        print(f"{what}: {wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss:.0f} MiB")
    report_rss, small_rss = big_report[2], small_report[2]
    print(f"report / summarize, CPU time: {big_report[1] / base[1]:.2f}x")
    print(f"peak RSS, 10x the rows: {report_rss / small_rss:.2f}x (flat memory: close to 1)")


if __name__ == "__main__":
    main()
