"""The history page of a job with 1,000 nights: its build time against one plain listing of the runs.

    uv run python benchmarks/bench_history.py [--nights 1000] [--repeat 3]

Synthesizes `--nights` finished-looking runs of one job (each a `run.json` and a `summary.json`, one
night in ten with failures) and a journal of 10,000 lines in each, which the page must not read. Then
times (a) `runs_in`, the baseline: every run's manifest read, what `bulkrelay runs` costs, and (b) the
history page of the job's last `--nights` nights written with `history`. Prints the best of `--repeat`
and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import orjson

from bulkrelay.ops.history import history
from bulkrelay.store.journal import JournalEntry, encode_batch
from bulkrelay.store.manifest import InputRecord, RunPlan, RunState
from bulkrelay.store.rundir import MANIFEST, SUMMARY, RunDir
from bulkrelay.store.runs import runs_in

ROWS = 10_000


def _night(runs: Path, plan: RunPlan, night: int, journal: bytes) -> None:
    run = RunDir.create(runs, plan)
    failed = 14 if night % 10 == 0 else 0
    start = 1_796_000_000 + night * 86_400
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(start))
    ended = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(start + 300 + night % 7))
    state = RunState.COMPLETED_WITH_FAILURES if failed else RunState.COMPLETED
    manifest = replace(run.manifest, state=state, pid=None).to_json()
    (run.path / MANIFEST).write_bytes(orjson.dumps({**manifest, "created_at": stamp, "updated_at": ended}))
    summary = {
        "rows_total": ROWS,
        "rows_done": ROWS,
        "by_outcome": {"succeeded": ROWS - failed, "failed": failed},
        "by_classification": {"success": ROWS - failed, "http_client_error": failed},
    }
    (run.path / SUMMARY).write_bytes(orjson.dumps(summary))
    run.journal_path.write_bytes(journal)


def _best(repeat: int, work: object) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        work()  # type: ignore[operator]
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nights", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        record = InputRecord(str(Path(tmp) / "data.csv"), "csv", False, "0" * 64, ROWS * 40, ROWS)
        plan = RunPlan(job_path=str(Path(tmp) / "nightly.yaml"), input=record, config_sha256="0" * 64)
        entries = [
            JournalEntry(
                row_number=row,
                success=True,
                classification="success",
                status_code=200,
                attempts=1,
                retryable=False,
                error=None,
                duration_ms=1.0,
            )
            for row in range(1, ROWS + 1)
        ]
        journal = b"".join(encode_batch(1, entries))
        for night in range(args.nights):
            _night(runs, plan, night, journal)
        listing = _best(args.repeat, lambda: runs_in(runs))
        page = _best(args.repeat, lambda: history("nightly", runs, Path(tmp) / "h.html", args.nights))
        print(f"{args.nights} nights of {ROWS} rows each")
        print(f"listing the runs (baseline): {listing:.3f} s")
        print(f"history page:                {page:.3f} s  ({page / listing:.2f}x the listing)")


if __name__ == "__main__":
    main()
