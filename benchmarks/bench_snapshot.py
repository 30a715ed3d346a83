"""Peak RSS of a query snapshot (SQLite; PostgreSQL with --postgres URL) beside the CSV preflight's.

    uv run python benchmarks/bench_snapshot.py [--rows 1000000] [--postgres postgresql://u:pw@host/db]

Each measurement is a fresh interpreter's peak RSS (ru_maxrss): the snapshot of a 100k-row query and
of a `--rows` one (flat memory means the ratio stays near 1), and preflight of a CSV file of `--rows`
rows, the baseline a query input is compared with. Prints the figures and their ratios.
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
        print(f"({time.perf_counter() - begun:.0f} s in all)")


if __name__ == "__main__":
    main()
