"""Write a job file and its CSV input into a test's directory.

    job = write_job(tmp_path, target.url, rows=100, retry={"max_attempts": 3})

The job POSTs each row's `id`, `email` and `name` as JSON to `<target_url>/items/{id}`. Keyword
overrides are merged into the job's top-level sections (dicts merge key by key, a `None` value
removes a key), so a test states only what it cares about.
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from typing import Any

import yaml

FIELDS = ("id", "email", "name")


def write_gzip_bomb(path: Path, head: bytes, filler: int, tail: bytes) -> Path:
    """A gzip file of `head`, `filler` bytes of `a` (a whole number of MiB) and `tail`: a few hundred
    KB on disk that inflate to one line as long as the filler (the input limits' hostile case)."""
    block = b"a" * (1 << 20)
    with gzip.open(path, "wb", compresslevel=6) as out:
        out.write(head)
        for _ in range(filler // len(block)):
            out.write(block)
        out.write(tail)
    return path


def make_rows(count: int, *, start: int = 1, tag: str = "") -> list[dict[str, str]]:
    """`count` distinct rows; `tag` changes every row's content (not its id)."""
    return [
        {"id": str(n), "email": f"user{n}{tag}@example.com", "name": f"User {n}{tag}"}
        for n in range(start, start + count)
    ]


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    fields = list(rows[0]) if rows else list(FIELDS)
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def base_job(target_url: str, input_name: str) -> dict[str, Any]:
    return {
        "version": 1,
        "name": "test-job",
        "input": {"file": input_name},
        "request": {
            "method": "POST",
            "url": f"{target_url}/items/{{id}}",
            "json": {"email": {"from": "email"}, "name": {"from": "name"}},
        },
        "execution": {"concurrency": 4},
    }


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in: nested dicts merge, `None` removes the key."""
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_job(
    tmp_path: Path,
    target_url: str,
    rows: int | list[dict[str, str]] = 10,
    *,
    job_name: str = "job.yaml",
    input_name: str = "data.csv",
    **overrides: Any,
) -> Path:
    """Write `input_name` (the rows, or that many made-up rows) and `job_name` into `tmp_path`."""
    records = make_rows(rows) if isinstance(rows, int) else rows
    write_csv(tmp_path / input_name, records)
    job = merge(base_job(target_url, input_name), overrides)
    path = tmp_path / job_name
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path
