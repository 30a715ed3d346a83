"""The relay's own CPU a row: bulk-job runs (salesforce_bulk2, named_import) against a per-row run.

    uv run python benchmarks/bench_bulkjobs.py [--rows 100000] [--per-row-rows 20000] [--max-rows 10000]

Both are `bulkrelay run JOB --budget 0` as a whole process against the built-in target in its own process
(recording off): (a) the baseline, one POST a row (`--per-row-rows` rows: its CPU a row is flat in the
row count, and a per-row run of 100,000 rows against a Python target takes minutes); (b) the same rows'
columns as bulk jobs of `--max-rows` rows (`--rows` rows): render, CSV, the job records and each row's
journal line, the jobs' polls and result files parsed; (c) the same as named imports (multipart submits,
the errors list read). Printed: each run's wall time and the process's
CPU (every thread) per row, and the ratios b / a and c / a. Prints figures; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from servers import builtin_target  # benchmarks/servers.py

_CHILD_ENVIRONMENT = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _write_input(path: Path, rows: int) -> None:
    with path.open("w", buffering=1 << 20) as out:
        out.write("id,email,name\n")
        for n in range(1, rows + 1):
            out.write(f"C-{n},user{n}@example.com,Customer {n}\n")


def _per_row_job(workdir: Path, url: str, input_name: str) -> Path:
    job = workdir / "per-row.yaml"
    job.write_text(
        f"""version: 1
input: {{ file: {input_name}, key: id }}
request:
  method: POST
  url: "{url}/contacts"
  json: {{ External_Id__c: {{ from: id }}, Email: {{ from: email }}, LastName: {{ from: name }} }}
execution: {{ concurrency: 64 }}
"""
    )
    return job


def _bulk_job(workdir: Path, url: str, input_name: str, max_rows: int) -> Path:
    job = workdir / "bulk.yaml"
    job.write_text(
        f"""version: 1
input: {{ file: {input_name}, key: id }}
request:
  bulk_job:
    kind: salesforce_bulk2
    base_url: "{url}/services/data/v62.0"
    object: Contact
    operation: upsert
    external_id_field: External_Id__c
    columns: {{ External_Id__c: {{ from: id }}, Email: {{ from: email }}, LastName: {{ from: name }} }}
    max_rows: {max_rows}
    poll: {{ first_seconds: 0.05, max_seconds: 0.2 }}
"""
    )
    return job


def _import_job(workdir: Path, url: str, input_name: str, max_rows: int) -> Path:
    job = workdir / "imports.yaml"
    spec = _bulk_job(workdir, url, input_name, max_rows).read_text()
    spec = spec.replace("kind: salesforce_bulk2", "kind: named_import").replace(
        "object: Contact", 'object: "0-1"'
    )
    job.write_text(spec.replace(f"{url}/services/data/v62.0", url))
    return job


def _run(job: Path) -> tuple[float, float, int]:
    """One `bulkrelay run` process: (wall seconds, CPU seconds of every thread, rows committed)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bulkrelay", "run", str(job), "--budget", "0", "--runs-dir", "runs"],
            cwd=job.parent,
            stdout=out,
            stderr=subprocess.DEVNULL,
            env=_CHILD_ENVIRONMENT,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        out.seek(0)
        envelope = orjson.loads(out.read())
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"bulkrelay run failed: {envelope.get('error')}")
    return elapsed, usage.ru_utime + usage.ru_stime, int(envelope["data"]["progress"]["done"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--per-row-rows", type=int, default=20_000)
    parser.add_argument("--max-rows", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bulkrelay-bench-bulk-") as tmp, builtin_target() as url:
        workdir = Path(tmp)
        _write_input(workdir / "small.csv", args.per_row_rows)
        _write_input(workdir / "large.csv", args.rows)
        figures = {}
        for name, job in (
            ("per-row", _per_row_job(workdir, url, "small.csv")),
            ("bulk jobs", _bulk_job(workdir, url, "large.csv", args.max_rows)),
            ("imports", _import_job(workdir, url, "large.csv", args.max_rows)),
        ):
            elapsed, cpu, rows = _run(job)
            figures[name] = cpu / rows * 1e6
            print(f"  {name:9}: {rows:8,} rows in {elapsed:6.2f} s; relay CPU {figures[name]:6.1f} µs/row")
        for name in ("bulk jobs", "imports"):
            ratio = figures[name] / figures["per-row"]
            print(f"  {name} / per-row CPU a row: {ratio:.2f} (lower is better; the issue asks < 1)")


if __name__ == "__main__":
    main()
