"""Batch jobs for tests: a job file for each of the four answer shapes of docs/batching.md, and a run
of one in-process, against the embedded target (started in the test's own event loop)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bulkrelay.demo.target import RunningTarget
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay.engine import RelayOutcome, StartPoint, relay
from bulkrelay.relay.progress import NullReporter
from bulkrelay.relay.stopping import StopControl
from bulkrelay.store.journal import JournalEntry, read_journal
from bulkrelay.store.rundir import RunDir

RETRY_FAST = {"initial_backoff_seconds": 0.01, "max_backoff_seconds": 0.05, "jitter_ratio": 0}

# The four shapes: the request.batch and response sections of a job for each endpoint of the target.
SHAPES: dict[str, dict[str, Any]] = {
    "hubspot": {
        "path": "/crm/v3/objects/contacts/batch/upsert",
        "batch": {
            "items_at": "/inputs",
            "envelope": {"allOrNone": {"value": False}},
            "item": {"id": {"from": "email"}, "objectWriteTraceId": {"meta": "item_id"}},
        },
        "response": {
            "success_statuses": [200, 207],
            "items": {
                "mode": "by_id",
                "results": "/results",
                "errors": "/errors",
                "id": "/objectWriteTraceId",
                "error_id": "/context/objectWriteTraceId",
                "message": "/message",
            },
        },
    },
    "elasticsearch": {
        "path": "/customers/_bulk",
        "batch": {
            "encoding": "ndjson",
            "item_lines": [
                {"index": {"_id": {"from": "id"}}},
                {"email": {"from": "email"}, "name": {"from": "name"}},
            ],
        },
        "response": {
            "items": {
                "mode": "positional",
                "results": "/items",
                "status": "/index/status",
                "message": "/index/error",
            }
        },
    },
    "braze": {
        "path": "/users/track",
        "batch": {
            "items_at": "/attributes",
            "envelope": {},
            "item": {"external_id": {"from": "id"}, "email": {"from": "email"}, "name": {"from": "name"}},
        },
        "response": {
            "items": {"mode": "by_index", "errors": "/errors", "index": "/index", "message": "/type"}
        },
    },
    "array": {
        "path": "/v1/batch/array",
        "batch": {"item": {"id": {"from": "id"}, "email": {"from": "email"}, "name": {"from": "name"}}},
        "response": {},
    },
}


def write_batch_job(
    tmp_path: Path,
    target_url: str,
    shape: str,
    names: list[str],
    *,
    max_items: int = 10,
    batch: dict[str, Any] | None = None,
    **sections: Any,
) -> Path:
    """A CSV of one row per name (id n, email `<name>@example.com`: a name holding `bogus`, `busy` or
    `poison` steers the target) and a job batching it to the target's `shape` endpoint."""
    with (tmp_path / "rows.csv").open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["id", "email", "name"])
        for n, name in enumerate(names, start=1):
            writer.writerow([n, f"{name}@example.com", name])
    spec = SHAPES[shape]
    job: dict[str, Any] = {
        "version": 1,
        "input": {"file": "rows.csv", "key": "id"},
        "request": {
            "method": "POST",
            "url": f"{target_url}{spec['path']}",
            "idempotency_key": {"header": "Idempotency-Key"},
            "batch": {"max_items": max_items, **spec["batch"], **(batch or {})},
        },
        "response": dict(spec["response"]),
        "execution": {"concurrency": 2},
        "retry": dict(RETRY_FAST),
    }
    for section, values in sections.items():
        job[section] = {**job.get(section, {}), **values}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


@dataclass
class BatchRun:
    outcome: RelayOutcome
    entries: list[JournalEntry]
    requests: list[dict[str, Any]]
    run: RunDir

    def by_row(self) -> dict[int, JournalEntry]:
        return {entry.row_number: entry for entry in self.entries}


async def run_batch_job(
    job_path: Path, target: RunningTarget, *, run: RunDir | None = None, start: StartPoint | None = None
) -> BatchRun:
    """Preflight and relay the job in-process into a new run directory (or `run`), from its start (or
    from `start`)."""
    preflight = run_preflight(load_job(job_path), None)
    run = run or RunDir.create(job_path.parent / "runs", plan_for(preflight))
    outcome = await relay(preflight, run, start or StartPoint(), stop=StopControl(), reporter=NullReporter())
    entries = list(read_journal(run.journal_path))
    return BatchRun(outcome, entries, target.state.requests(), run)
