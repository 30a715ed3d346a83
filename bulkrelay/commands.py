"""The commands that read: `validate`, `render`, `status`, `runs`. Each returns a `Result`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from bulkrelay.atomic import read_json
from bulkrelay.checkpoint import read_checkpoint
from bulkrelay.config import Job
from bulkrelay.envelope import Result
from bulkrelay.errors import InputInvalid, Problem, UsageError
from bulkrelay.fingerprint import config_fingerprint
from bulkrelay.inputs import open_records
from bulkrelay.preflight import Preflight, resolve_input, run_preflight
from bulkrelay.request import RenderError, RequestRenderer
from bulkrelay.rundir import SUMMARY, RunDir, is_locked, list_runs
from bulkrelay.selection import load_selection
from bulkrelay.sender import row_identity

_ROWS = re.compile(r"^\d+(-\d+)?$")


def preflight_data(preflight: Preflight) -> dict[str, Any]:
    fingerprint = preflight.input_fingerprint
    return {
        "job": str(preflight.job.path),
        "record_count": fingerprint.record_count,
        "format": fingerprint.format,
        "gzip": fingerprint.gzip,
        "input": {
            "path": str(preflight.input_spec.path),
            "sha256": fingerprint.sha256,
            "size": fingerprint.size,
        },
        "config_sha256": preflight.config_fingerprint,
    }


def validate(job: Job, input_path: Path | None) -> Result:
    preflight = run_preflight(job, input_path)
    return Result(data=preflight_data(preflight), kind="validate")


def parse_rows(spec: str) -> set[int]:
    """`1-5`, `7`, or a comma list of both."""
    rows: set[int] = set()
    for raw in spec.split(","):
        part = raw.strip()
        if not _ROWS.match(part):
            raise UsageError(f"--rows {spec!r}: expected numbers or ranges like 1-5,9")
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first < 1 or last < first:
            raise UsageError(f"--rows {spec!r}: ranges start at 1 and go upwards")
        rows.update(range(first, last + 1))
    return rows


def render(job: Job, input_path: Path | None, rows_spec: str) -> Result:
    """The exact requests the chosen rows would send, secrets shown as `***`. Sends nothing."""
    renderer = RequestRenderer.from_config(
        job.config.request, os.environ, sorted_json=job.config.execution.sync != "full"
    )
    wanted = parse_rows(rows_spec)
    config_sha256 = config_fingerprint(job.config)
    last = max(wanted)
    spec = resolve_input(job, input_path)
    problems: list[Problem] = []
    requests: list[dict[str, Any]] = []
    with open_records(spec, problems.append) as stream:
        for record in stream:
            if record.row_number > last:
                break
            if record.row_number not in wanted:
                continue
            try:
                request = renderer.render(record)
            except RenderError as exc:
                problems.append(
                    Problem(
                        exc.message,
                        file=str(spec.path),
                        line=record.line,
                        row=record.row_number,
                        field=exc.field,
                    )
                )
                continue
            if renderer.idempotency_header is not None:
                identity = row_identity(record, job.config.input.key)
                key = renderer.idempotency_key(config_sha256, identity, request)
                request = renderer.with_idempotency_key(request, key)
            requests.append(
                {"row_number": record.row_number, "line": record.line, **renderer.redact(request)}
            )
    problems = [p for p in problems if p.row is None or p.row in wanted]
    if problems:
        raise InputInvalid(problems, phase="render")
    return Result(data={"job": str(job.path), "requests": requests}, kind="render")


def committed_progress(run: RunDir) -> dict[str, Any]:
    """What the checkpoint says is durably done; a retry-failed run counts only its selected rows."""
    checkpoint = read_checkpoint(run.path)
    record_count = int(run.manifest["input"]["record_count"])
    selection = load_selection(run.path, record_count)
    return {
        "done": checkpoint.rows_done if checkpoint else 0,
        "total": len(selection) if selection is not None else record_count,
        "unit": "rows",
        "ok": checkpoint.ok if checkpoint else 0,
        "failed": checkpoint.failed if checkpoint else 0,
    }


def status(run_dir: Path) -> Result:
    """One run's state and counters, read without changing anything."""
    run = RunDir.open(run_dir)
    summary_path = run.path / SUMMARY
    data = {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "state": run.state,
        "live": is_locked(run.path),
        "created_at": run.manifest.get("created_at"),
        "updated_at": run.manifest.get("updated_at"),
        "parent_run": run.manifest.get("parent_run"),
        "progress": committed_progress(run),
        "summary": read_json(summary_path) if summary_path.exists() else None,
    }
    if "sync" in run.manifest:  # a delta run: its mode, rows selected and rows skipped unchanged
        data["sync"] = run.manifest["sync"]
    return Result(data=data, kind="status")


def runs(runs_dir: Path) -> Result:
    table = []
    for run in list_runs(runs_dir):
        progress = committed_progress(run)
        table.append(
            {
                "run_id": run.run_id,
                "state": run.state,
                "name": run.manifest.get("name"),
                "created_at": run.manifest.get("created_at"),
                "done": progress["done"],
                "total": progress["total"],
                "failed": progress["failed"],
                "run_dir": str(run.path),
            }
        )
    return Result(data={"runs_dir": str(runs_dir), "runs": table}, kind="runs")
