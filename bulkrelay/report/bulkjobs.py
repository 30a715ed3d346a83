"""A bulk run's jobs as the report's table shows them: each job's id, state, rows and durations, read
from its records in the journal (store/journal/jobrecords.py; each carries its time `t`).

    uploading: from `created` to `closed` (or to `aborted`);  processing: from `closed` to the last
    `state`;  total: from `created` to `results` (or `aborted`), else to its last record so far
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bulkrelay.store.journal.jobrecords import read_job_records, rows_of


@dataclass(slots=True)
class BulkJobRow:
    """One job of the table; times are epoch seconds of its records."""

    number: int
    remote: str
    rows: int
    state: str = "created"
    error: str | None = None
    journaled: bool = False  # its rows' results are in the journal
    times: dict[str, float] = field(default_factory=dict)  # each event's last time

    def seconds(self, start: str, *ends: str) -> float | None:
        """From the `start` record to the first of `ends` that the job has, or None."""
        end = next((self.times[e] for e in ends if e in self.times), None)
        return None if start not in self.times or end is None else end - self.times[start]

    @property
    def uploading(self) -> float | None:
        return self.seconds("created", "closed", "aborted")

    @property
    def processing(self) -> float | None:
        return self.seconds("closed", "state")

    @property
    def total(self) -> float | None:
        last = max(self.times, key=self.times.__getitem__, default="created")
        return self.seconds("created", "results", "aborted", last)


def bulk_job_rows(journal: Path) -> tuple[BulkJobRow, ...]:
    """The run's bulk jobs in order; empty for a run that sent none."""
    jobs: dict[int, BulkJobRow] = {}
    for record in read_job_records(journal):
        number, event = record["bulk_job"], record["event"]
        if event in ("created", "submitting"):  # submitting: a job whose data goes with its making
            rows = len(rows_of(record.get("rows", [])))
            jobs[number] = BulkJobRow(number, str(record.get("remote", "")), rows)
        job = jobs.get(number)
        if job is not None:
            _fold(job, event, record)
    return tuple(jobs.values())


def _fold(job: BulkJobRow, event: str, record: dict[str, Any]) -> None:
    if isinstance(record.get("t"), (int, float)):
        job.times[event] = float(record["t"])
    if event == "state":
        job.state, job.error = str(record.get("state")), record.get("error")
    elif event == "aborted":
        job.state = "aborted by the relay"
    elif event in ("uploaded", "closed") and job.state in ("created", "uploaded"):
        job.state = event
    elif event == "results":
        job.journaled = True
