"""Resume start-up against plain preflight, on a 1M-row run with a 1M-line journal.

    uv run python benchmarks/bench_resume.py [--rows 1000000] [--dir PATH] [--repeat 3]

Builds a CSV of `--rows` records, a job for it, and a finished-looking journal (one line per row,
written with `encode_line`, every 50th a failure) with a matching `run.json` and `checkpoint.json`
(whose journal prefix, digest and done rows, is what the writer would have kept). Then times, in
the same process, (a) a plain preflight of the input, (b) resume start-up: the same preflight plus
`recover_start` (the committed bytes checked against the checkpoint's digest, the lines after them
decoded), (c) `recover_start` alone, and (d) `recover_start` on a checkpoint without a prefix (every
line decoded and checked: runs from before prefixes, or without a checkpoint). Prints the best of
`--repeat` for each and the ratios; issue 15 asks for a resume start-up of at most 1.5x preflight.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import Preflight, run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.ops.resume import recover_start
from bulkrelay.store.checkpoint import CHECKPOINT_FILE, Checkpoint, write_checkpoint
from bulkrelay.store.journal import CommittedPrefix, JournalEntry, encode_line
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.rundir import RunDir, RunState, utc_now

_JOB = """\
version: 1
name: bench-resume
input: {file: data.csv, key: id}
request:
  method: POST
  url: "http://127.0.0.1:9/items/{id}"
  json:
    email: {from: email}
    name: {from: name}
    age: {from: age, type: integer}
  idempotency_key: {header: Idempotency-Key}
"""


def _write_input(directory: Path, rows: int) -> Path:
    with (directory / "data.csv").open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["id", "email", "name", "age"])
        for n in range(1, rows + 1):
            writer.writerow([n, f"user{n}@example.com", f"User {n}", 20 + n % 60])
    job = directory / "job.yaml"
    job.write_text(_JOB)
    return job


def _entry(seq: int) -> JournalEntry:
    ok = seq % 50 != 0
    return JournalEntry(
        row_number=seq,
        success=ok,
        classification="success" if ok else "http_server_error",
        status_code=200 if ok else 503,
        attempts=1,
        retryable=not ok,
        error=None if ok else "HTTP 503",
        duration_ms=12.5,
        latency_ms=12.1,
        key=str(seq),
        idempotency_key=f"{seq:064x}",
        captured={"remote_id": str(seq)} if ok else None,
        response_body=None if ok else "Service Unavailable",
    )


def _write_run(directory: Path, preflight: Preflight, rows: int) -> RunDir:
    run = RunDir.create(directory / "runs", plan_for(preflight))
    ok = offset = 0
    hasher = hashlib.sha256()
    with run.journal_path.open("wb") as journal:
        batch: list[bytes] = []
        for seq in range(1, rows + 1):
            entry = _entry(seq)
            ok += entry.success
            batch.append(encode_line(seq, entry))
            if len(batch) == 10_000 or seq == rows:
                data = b"".join(batch)
                hasher.update(data)
                offset += journal.write(data)
                batch = []
    done = RowSet(rows).complement().to_bytes()
    checkpoint = Checkpoint(
        seq=rows,
        offset=offset,
        rows_done=rows,
        ok=ok,
        failed=rows - ok,
        updated_at=utc_now(),
        prefix=CommittedPrefix(rows, offset, ok, hasher.hexdigest(), done),
    )
    write_checkpoint(run.path, checkpoint)
    run.mark_ended(RunState.STOPPED, None)
    return run


def _best(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to build the files (default: a temp dir)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        job = load_job(_write_input(directory, args.rows))
        run = _write_run(directory, run_preflight(job), args.rows)
        journal_mb = run.journal_path.stat().st_size / 1e6

        def recover() -> None:
            start, _ = recover_start(RunDir.open(run.path), args.rows)
            assert start.done_rows is not None and len(start.done_rows) == args.rows

        def resume_startup() -> None:
            assert run_preflight(job).record_count == args.rows
            recover()

        preflight_s = _best(args.repeat, lambda: run_preflight(job))
        resume_s = _best(args.repeat, resume_startup)
        scan_s = _best(args.repeat, recover)
        checkpoint = orjson.loads((run.path / CHECKPOINT_FILE).read_bytes())
        del checkpoint["journal_prefix"]
        (run.path / CHECKPOINT_FILE).write_bytes(orjson.dumps(checkpoint))
        full_scan_s = _best(args.repeat, recover)
    ratio = resume_s / preflight_s
    print(
        orjson.dumps(
            {
                "rows": args.rows,
                "journal_mb": round(journal_mb, 1),
                "preflight_s": round(preflight_s, 3),
                "preflight_rows_per_s": round(args.rows / preflight_s),
                "resume_startup_s": round(resume_s, 3),
                "scan_s": round(scan_s, 3),
                "scan_vs_preflight": round(scan_s / preflight_s, 2),
                "full_scan_s": round(full_scan_s, 3),
                "ratio": round(ratio, 2),
                "within_1_5x": ratio <= 1.5,
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
