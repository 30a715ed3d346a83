"""Micro-benchmark of the input readers against bare csv.reader / orjson loops, plus a peak-RSS check.

    uv run python benchmarks/bench_inputs.py [--rows 300000]

Prints rows per second for each reader and its ratio to the baseline measured in the same run, then
the peak RSS of a child process reading 100k and 600k rows (streaming means the ratio stays near 1).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from bulkrelay.errors import Problem
from bulkrelay.job.inputs import InputSpec, open_records


def _write_csv(path: Path, rows: int) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as out:
        out.write("id,email,name,city,age\n")
        for i in range(rows):
            out.write(f"{i},user{i}@example.com,Name {i},City{i % 100},{18 + i % 70}\n")
    return path


def _write_jsonl(path: Path, rows: int) -> Path:
    with open(path, "wb") as out:
        for i in range(rows):
            out.write(orjson.dumps({"id": i, "email": f"user{i}@example.com", "age": 18 + i % 70}) + b"\n")
    return path


def _bare_csv(path: Path) -> int:
    with open(path, encoding="utf-8", newline="") as text:
        return sum(1 for _ in csv.reader(text)) - 1


def _bare_csv_dicts(path: Path) -> int:
    count = 0
    with open(path, encoding="utf-8", newline="") as text:
        reader = csv.reader(text)
        headers = next(reader)
        for row in reader:
            dict(zip(headers, row, strict=False))
            count += 1
    return count


def _bare_jsonl(path: Path) -> int:
    with open(path, "rb") as lines:
        return sum(1 for line in lines if orjson.loads(line))


def _ours(path: Path) -> int:
    problems: list[Problem] = []
    with open_records(InputSpec.detect(path), problems.append) as stream:
        count = sum(1 for _ in stream)
        stream.fingerprint()
    assert not problems, problems[:3]
    return count


def _rate(read: Callable[[Path], int], path: Path) -> float:
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        rows = read(path)
        best = max(best, rows / (time.perf_counter() - start))
    return best


def _peak_rss_kib(path: Path) -> int:
    """Peak RSS of a fresh interpreter that reads the whole file through open_records."""
    code = (
        "import resource, sys\nfrom pathlib import Path\n"
        "from bulkrelay.job.inputs import InputSpec, open_records\n"
        "with open_records(InputSpec.detect(Path(sys.argv[1])), lambda p: None) as s:\n"
        "    n = sum(1 for _ in s); s.fingerprint()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True)
    return int(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=300_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        csv_path = _write_csv(folder / "bench.csv", args.rows)
        jsonl_path = _write_jsonl(folder / "bench.jsonl", args.rows)
        bare, bare_dicts, ours = (_rate(f, csv_path) for f in (_bare_csv, _bare_csv_dicts, _ours))
        print(f"csv   bare csv.reader        {bare:>12,.0f} rows/s")
        print(f"csv   csv.reader + dict(zip) {bare_dicts:>12,.0f} rows/s")
        ratios = f"{ours / bare:.2f} vs bare, {ours / bare_dicts:.2f} vs bare + dict"
        print(f"csv   open_records           {ours:>12,.0f} rows/s  ratio {ratios}")
        bare_json, ours_json = _rate(_bare_jsonl, jsonl_path), _rate(_ours, jsonl_path)
        print(f"jsonl bare orjson loop       {bare_json:>12,.0f} rows/s")
        print(f"jsonl open_records           {ours_json:>12,.0f} rows/s  ratio {ours_json / bare_json:.2f}")
        small = _peak_rss_kib(_write_csv(folder / "small.csv", 100_000))
        large = _peak_rss_kib(_write_csv(folder / "large.csv", 600_000))
        print(f"peak RSS 100k rows {small} KiB, 600k rows {large} KiB, ratio {large / small:.2f}")


if __name__ == "__main__":
    main()
