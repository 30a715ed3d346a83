"""Peak RSS of a query snapshot (SQLite; PostgreSQL with --postgres URL) and of a Parquet file's,
beside the CSV preflight's.

    uv run python benchmarks/bench_snapshot.py [--rows 1000000] [--postgres postgresql://u:pw@host/db]

Each measurement is a fresh interpreter's peak RSS (ru_maxrss): the snapshot of a 100k-row query and
of a `--rows` one (flat memory means the ratio stays near 1), and preflight of a CSV file of `--rows`
rows, the baseline a query input is compared with. The Parquet case snapshots the same rows from files
written with 10k-row groups (100k rows and `--rows` rows: the ratio stays near 1 when memory is bounded
by the row group) and from one file of `--rows` rows in a single row group (pyarrow's default row group
is 1,048,576 rows, so an ordinary 1M-row export is one group). The files are written by a child too,
so the parent stays small (ru_maxrss carries the parent's high-water mark across fork and exec).
Prints the figures and their ratios.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SNAPSHOT = """
import resource, sys, time
from pathlib import Path
from bulkrelay.job.inputs.query import QuerySpec, database_of, snapshot_into
spec = QuerySpec(sys.argv[2], {"n": int(sys.argv[3])}, database_of(sys.argv[1], {}, Path(".")), "bench")
start = time.perf_counter()
count = snapshot_into(spec, Path(sys.argv[4]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, count, time.perf_counter() - start)
"""

_PREFLIGHT = """
import resource, sys, time
from pathlib import Path
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
start = time.perf_counter()
count = run_preflight(load_job(Path(sys.argv[1]))).record_count
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, count, time.perf_counter() - start)
"""

_PARQUET = """
import resource, sys, time
from pathlib import Path
from bulkrelay.job.inputs.parquet import parquet_into
start = time.perf_counter()
count, _ = parquet_into(Path(sys.argv[1]), Path(sys.argv[2]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, count, time.perf_counter() - start)
"""

_IMPORTS = """
import resource
import pyarrow.parquet
import bulkrelay.job.inputs.parquet
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 0, 0.0)
"""

_WRITE_PARQUET = """
import sys
import pyarrow as pa, pyarrow.parquet as pq
rows, group = int(sys.argv[2]), int(sys.argv[3])
ids = pa.array(range(1, rows + 1), pa.int64())
table = pa.table({
    "id": ids,
    "email": pa.array([f"user{i}@example.com" for i in range(1, rows + 1)]),
    "name": pa.array([f"Name {i}" for i in range(1, rows + 1)]),
    "city": pa.array([f"City{i % 100}" for i in range(1, rows + 1)]),
    "age": pa.array([18 + i % 70 for i in range(1, rows + 1)], pa.int64()),
})
pq.write_table(table, sys.argv[1], row_group_size=group)
print(pq.ParquetFile(sys.argv[1]).num_row_groups)
"""

_QUERY = "SELECT id, email, name, city, age FROM people WHERE id <= :n"


def _child(code: str, *args: str) -> tuple[int, int, float]:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    rss, count, seconds = out.stdout.split()
    return int(rss), int(count), float(seconds)


def _sqlite(path: Path, rows: int) -> str:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE people (id INTEGER PRIMARY KEY, email TEXT, name TEXT, city TEXT, age INT)"
        )
        conn.executemany(
            "INSERT INTO people VALUES (?, ?, ?, ?, ?)",
            (
                (i, f"user{i}@example.com", f"Name {i}", f"City{i % 100}", 18 + i % 70)
                for i in range(1, rows + 1)
            ),
        )
    conn.close()
    return f"sqlite:///{path}"


def _postgres(url: str, rows: int) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS people")
        conn.execute(
            "CREATE TABLE people AS SELECT i AS id, 'user' || i || '@example.com' AS email,"
            " 'Name ' || i AS name, 'City' || (i %% 100) AS city, 18 + i %% 70 AS age"
            " FROM generate_series(1, %s) AS i",
            (rows,),
        )
    return url


def _csv_job(folder: Path, rows: int) -> Path:
    with open(folder / "people.csv", "w", encoding="utf-8") as out:
        out.write("id,email,name,city,age\n")
        for i in range(1, rows + 1):
            out.write(f"{i},user{i}@example.com,Name {i},City{i % 100},{18 + i % 70}\n")
    job = folder / "job.yaml"
    job.write_text(
        "version: 1\ninput: {file: people.csv, key: id}\n"
        "request: {method: PUT, url: 'http://127.0.0.1:9/p/{id}', json: {email: {from: email}}}\n"
    )
    return job


def _measure(name: str, url: str, rows: int, folder: Path) -> int:
    small = _child(_SNAPSHOT, url, _QUERY, "100000", str(folder / f"{name}-small.jsonl"))
    large = _child(_SNAPSHOT, url, _QUERY, str(rows), str(folder / f"{name}-large.jsonl"))
    print(f"{name:10} snapshot 100k rows {small[0]:>8} KiB ({small[2]:.1f} s)")
    rate = f"{large[1] / large[2]:,.0f} rows/s"
    print(f"{name:10} snapshot {rows:,} rows {large[0]:>8} KiB ({large[2]:.1f} s, {rate})")
    print(f"{name:10} ratio {large[0] / small[0]:.2f} (flat memory: near 1)")
    return large[0]


def _parquet_file(path: Path, rows: int, group: int) -> Path:
    subprocess.run(
        [sys.executable, "-c", _WRITE_PARQUET, str(path), str(rows), str(group)],
        check=True,
        capture_output=True,
    )
    return path


def _measure_parquet(rows: int, folder: Path, preflight: int) -> None:
    cases = [("100k rows, 10k-row groups", 100_000, 10_000), (f"{rows:,} rows, 10k-row groups", rows, 10_000)]
    cases.append((f"{rows:,} rows, one row group", rows, rows))
    imports = _child(_IMPORTS)[0]
    print(f"parquet    imports alone (pyarrow) {imports:>8} KiB")
    peaks = []
    for n, (label, count, group) in enumerate(cases):
        path = _parquet_file(folder / f"p{n}.parquet", count, group)
        peak, read, seconds = _child(_PARQUET, str(path), str(folder / f"p{n}.jsonl"))
        assert read == count, (read, count)
        rate = f"{read / seconds:,.0f} rows/s"
        print(f"parquet    snapshot {label} {peak:>8} KiB ({seconds:.1f} s, {rate})")
        peaks.append(peak)
    print(f"parquet    ratio {peaks[1] / peaks[0]:.2f} (10k-row groups, {rows:,} / 100k rows: near 1)")
    print(f"parquet    ratio {peaks[2] / peaks[0]:.2f} (one row group of {rows:,} / 100k rows, 10k groups)")
    print(f"parquet snapshot / csv preflight peak RSS: 10k-row groups {peaks[1] / preflight:.2f},", end=" ")
    print(f"one row group {peaks[2] / preflight:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--postgres", help="a PostgreSQL URL whose `people` table may be replaced")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        begun = time.perf_counter()
        preflight = _child(_PREFLIGHT, str(_csv_job(folder, args.rows)))
        print(f"csv        preflight {args.rows:,} rows {preflight[0]:>8} KiB ({preflight[2]:.1f} s)")
        peaks = {"sqlite": _measure("sqlite", _sqlite(folder / "people.db", args.rows), args.rows, folder)}
        if args.postgres:
            url = _postgres(args.postgres, args.rows)
            peaks["postgresql"] = _measure("postgresql", url, args.rows, folder)
        for name, peak in peaks.items():
            print(f"{name} snapshot / csv preflight peak RSS: {peak / preflight[0]:.2f}")
        _measure_parquet(args.rows, folder, preflight[0])
        print(f"({time.perf_counter() - begun:.0f} s in all)")


if __name__ == "__main__":
    main()
