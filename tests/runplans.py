"""A run plan, and delivered journal entries, for tests that make a run directory by hand, without a job
file or a preflight."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bulkrelay.store.journal import JournalEntry
from bulkrelay.store.manifest import InputRecord, RunPlan

NO_INPUT = InputRecord("/jobs/input.csv", format="csv", gzip=False, sha256="0" * 64, size=0, record_count=0)


def run_plan(job_path: str = "/jobs/job.yaml", **changes: Any) -> RunPlan:
    """A plan naming `job_path` and an empty input; `changes` replace any other field."""
    return replace(RunPlan(job_path=job_path, input=NO_INPUT, config_sha256="0" * 64), **changes)


def delivered_entry(row_number: int, **changes: Any) -> JournalEntry:
    """The journal entry of a row delivered at the first attempt (200); `changes` set other fields
    (a delta job's `key` and `digest`)."""
    entry = JournalEntry(
        row_number=row_number,
        success=True,
        classification="success",
        status_code=200,
        attempts=1,
        retryable=False,
        error=None,
        duration_ms=1.0,
    )
    return replace(entry, **changes) if changes else entry
