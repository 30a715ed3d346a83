"""Nights of one job made on disk without sending anything: a run directory each, with the run.json
times, state and summary.json counts a finished night would have (what the report and history read)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import orjson

from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.store.journal import JournalEntry, encode_line
from bulkrelay.store.manifest import RunPlan, RunState
from bulkrelay.store.rundir import MANIFEST, SUMMARY, RunDir
from tests.jobfiles import write_job

NIGHT = 86_400.0
FIRST = 1_796_000_000.0  # a night in 2026, 02:13:20 UTC


def job_plan(tmp_path: Path, rows: int = 100) -> RunPlan:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=rows))
    return plan_for(run_preflight(job, None))


def stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{round(at % 1 * 1e6):06d}Z"


def make_night(
    runs: Path,
    plan: RunPlan,
    night: int,
    *,
    failed: int = 0,
    seconds: float = 60.0,
    state: RunState | None = None,
    stop_reason: str | None = None,
    done: int | None = None,
    requests: dict[str, object] | None = None,
) -> RunDir:
    """Night number `night` (0: the first) of the job: its rows done, `failed` of them failed."""
    run = RunDir.create(runs, plan)
    rows = plan.input.record_count
    done = rows if done is None else done
    final = state or (RunState.COMPLETED_WITH_FAILURES if failed else RunState.COMPLETED)
    start = FIRST + night * NIGHT
    manifest = replace(run.manifest, state=final, stop_reason=stop_reason, pid=None)
    data = {**manifest.to_json(), "created_at": stamp(start), "updated_at": stamp(start + seconds)}
    (run.path / MANIFEST).write_bytes(orjson.dumps(data))
    summary = {
        "rows_total": rows,
        "rows_done": done,
        "rows_pending": rows - done,
        "by_outcome": {"succeeded": done - failed, "failed": failed},
        "by_status": {"200": done - failed, **({"422": failed} if failed else {})},
        "by_classification": {"success": done - failed, **({"http_client_error": failed} if failed else {})},
        "attempts": done,
        "retries": 0,
        "latency_ms": {"p50": 1.0, "p95": 2.0, "p99": 3.0, "max": 4.0},
        "run_id": run.run_id,
        **({} if requests is None else {"requests": requests}),
    }
    (run.path / SUMMARY).write_bytes(orjson.dumps(summary))
    run.journal_path.write_bytes(
        b"".join(encode_line(row, _entry(row, row <= failed)) for row in range(1, done + 1))
    )
    return RunDir.open(run.path)


def _entry(row: int, failed: bool) -> JournalEntry:
    return JournalEntry(
        row_number=row,
        success=not failed,
        classification="http_client_error" if failed else "success",
        status_code=422 if failed else 200,
        attempts=1,
        retryable=False,
        error="HTTP 422" if failed else None,
        duration_ms=1.0,
        response_body='{"error": "invalid email"}' if failed else None,
    )
