"""A chained job's input (`input.results_of: JOB`): the parent job's finished runs read from their
journals (the newest outcome of each key), filtered by `where`, joined with the parent's input fields,
and frozen into a snapshot the run keeps, as a query's is (ops/snapshot.py reuses it on resume)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.job.config import Job
from bulkrelay.job.inputs import InputFingerprint, InputSpec, open_records
from bulkrelay.job.inputs.results_of import chain_record, wanted, write_frozen
from bulkrelay.store.results import Row, finished_runs_of, latest_outcomes
from bulkrelay.store.rundir import RunDir


def take_chain_snapshot(job: Job, runs_dir: Path, dest: Path) -> int:
    """Freeze the parent's results into `dest` (JSON Lines, 0600); the record count. A parent with no
    finished run is NOT_FOUND, one still running RUN_LOCKED, each naming it."""
    given = job.config.input
    assert given.results_of is not None  # a chained job
    runs = finished_runs_of(runs_dir, given.results_of)
    by_run: dict[str, list[Row]] = {}
    for row in latest_outcomes(runs).values():
        if wanted(bool(row[4]), given.where):
            by_run.setdefault(row[3], []).append(row)
    return write_frozen(dest, _records(runs, by_run))


def _records(runs: list[RunDir], by_run: dict[str, list[Row]]) -> Iterator[dict[str, Any]]:
    for run in runs:  # oldest first, each run's rows in row order
        rows = sorted(by_run.get(run.run_id, ()), key=lambda row: row[2])
        if not rows:
            continue
        fields = _input_fields(run, {row[2] for row in rows})
        for row in rows:
            captured = None if row[9] is None else orjson.loads(row[9])
            yield chain_record(fields.get(row[2]), row[1], captured)


def _input_fields(run: RunDir, numbers: set[int]) -> dict[int, dict[str, Any]]:
    """The fields of the parent's rows `numbers`, when its input (a file, or the run's own snapshot)
    is still there with the bytes it relayed; else none (the records carry key and captured only)."""
    recorded = run.plan.input
    path = Path(recorded.path)
    if not path.is_file():
        return {}
    spec = InputSpec.detect(path, recorded.format)
    fields: dict[int, dict[str, Any]] = {}
    problems: list[object] = []
    with open_records(spec, problems.append) as stream:
        for record in stream:
            if record.row_number in numbers:
                fields[record.row_number] = record.fields
        same = stream.fingerprint() == InputFingerprint.from_dict(recorded.fingerprint())
    return fields if same and not problems else {}
