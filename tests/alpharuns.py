"""A run directory of the public alpha (SerDrozd/bulkrelay), laid out by hand as the alpha wrote it, for
the tests that BulkRelay lists it and refuses to act on it (docs/migrating.md).

    alpha = write_alpha_run(tmp_path / "runs", job)
"""

from __future__ import annotations

import json
from pathlib import Path

CSV_ROWS = 20  # the records of examples/alpha/customers.csv


def write_alpha_run(runs_dir: Path, config_path: Path) -> Path:
    """A stopped run of the alpha, laid out as its docs/resume.md and state code define it."""
    run_dir = runs_dir / "20261001T120000Z-a1b2c3d4"
    run_dir.mkdir(parents=True)
    stamp = "2026-10-01T12:00:00+00:00"
    manifest = {
        "schema_version": 1,
        "tool_version": "0.0.1",
        "run_id": run_dir.name,
        "state": "stopped",
        "created_at": stamp,
        "updated_at": stamp,
        "config_path": str(config_path),
        "input_path": str(config_path.parent / "customers.csv"),
        "input_format": "csv",
        "input_sha256": "0" * 64,
        "input_size_bytes": 1234,
        "config_sha256": "1" * 64,
        "input_total": CSV_ROWS,
        "resume_count": 0,
    }
    checkpoint = {
        "schema_version": 1,
        "updated_at": stamp,
        "processed": 2,
        "unprocessed": CSV_ROWS - 2,
        "succeeded": 1,
        "failed": 1,
        "attempts": 3,
        "retried": 1,
    }
    results = [
        {"row_number": 1, "success": True, "classification": "success", "status_code": 201,
         "attempts": 1, "retryable": False, "error": None},
        {"row_number": 2, "success": False, "classification": "http_server_error", "status_code": 503,
         "attempts": 2, "retryable": True, "error": '{"detail":"unavailable"}'},
    ]  # fmt: skip
    summary = {
        "total": 2, "succeeded": 1, "failed": 1, "attempts": 3, "retried": 1, "input_total": CSV_ROWS,
        "stopped_early": True, "forced": False, "resumed": False, "unprocessed": CSV_ROWS - 2,
        "run_directory": str(run_dir),
    }  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps(manifest, indent=2))
    (run_dir / "checkpoint.json").write_text(json.dumps(checkpoint, indent=2))
    (run_dir / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in results))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir
