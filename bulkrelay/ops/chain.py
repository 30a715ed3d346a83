"""A chained job's input (`input.results_of: JOB`): the parent job's finished runs read from their
journals (the newest outcome of each key), filtered by `where`, joined with the parent's input fields,
and frozen into a snapshot the run keeps, as a query's is (ops/snapshot.py reuses it on resume).

`parent_outcomes` is the one way another job's results are read, here and by a lookup's `results_of`
(ops/lookups.py): each journal is checked whole first, as `export` checks it, so damage refuses the
job before it sends anything instead of leaving rows out of its records or its map."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.errors import JournalCorrupt
from bulkrelay.job.config import Job
from bulkrelay.job.inputs import InputFingerprint, InputSpec, open_records, spool_file
from bulkrelay.job.inputs.results_of import chain_record, wanted, write_frozen
from bulkrelay.ops.damage import check_committed_journal
from bulkrelay.store.results import Row, finished_runs_of, latest_outcomes
from bulkrelay.store.rundir import RunDir


def take_chain_snapshot(job: Job, runs_dir: Path, dest: Path) -> int:
    """Freeze the parent's results into `dest` (JSON Lines, 0600); the record count. A parent with no
    finished run is NOT_FOUND, one still running RUN_LOCKED, each naming it. Memory stays flat: the
    newest outcomes are gathered on disk (store/results.py) and joined with each run's input as both
    are read, in row order."""
    given = job.config.input
    assert given.results_of is not None  # a chained job
    runs, latest = parent_outcomes(runs_dir, given.results_of, spool_file(dest.parent, "latest", ".sqlite"))
    rows = (row for row in latest if wanted(bool(row[4]), given.where))
    return write_frozen(dest, _records(runs, rows))


def parent_outcomes(runs_dir: Path, parent: str, spool: Path) -> tuple[list[RunDir], Iterator[Row]]:
    """The finished runs of the job named `parent` and each key's newest outcome in them (gathered in
    the spool file `spool`). A journal of them that does not read whole (a corrupt line, a completed
    run's torn end, a summary it disagrees with) is JOURNAL_CORRUPT naming the run, the file, the line
    and the byte offset, before any row is read: a key past the damage would otherwise be missing."""
    runs = finished_runs_of(runs_dir, parent)
    for run in runs:
        _check_parent_journal(run, parent)
    return runs, latest_outcomes(runs, spool)


def _check_parent_journal(run: RunDir, parent: str) -> None:
    try:
        check_committed_journal(run, "results_of")
    except JournalCorrupt as exc:
        raise JournalCorrupt(
            f"the results of job {parent} cannot be read: run {run.run_id}: {exc.message}",
            context={**exc.context, "job": parent, "run_id": run.run_id, "run_dir": str(run.path)},
            suggestion=exc.suggestion,
        ) from None


def _records(runs: list[RunDir], rows: Iterator[Row]) -> Iterator[dict[str, Any]]:
    by_id = {run.run_id: run for run in runs}
    for run_id, of_run in groupby(rows, key=lambda row: row[3]):  # oldest run first, in row order
        run = by_id[run_id]
        fields = _input_fields(run) if _input_unchanged(run) else iter(())
        field = next(fields, None)
        for row in of_run:
            while field is not None and field[0] < row[2]:
                field = next(fields, None)
            matched = field[1] if field is not None and field[0] == row[2] else None
            captured = None if row[9] is None else orjson.loads(row[9])
            yield chain_record(matched, row[1], captured)


def _input_unchanged(run: RunDir) -> bool:
    """Whether the parent's input (a file, or the run's own snapshot) is still there with the bytes it
    relayed: only then do the records carry its fields (else key and captured only)."""
    recorded = run.plan.input
    path = Path(recorded.path)
    if not path.is_file():
        return False
    problems: list[object] = []
    with open_records(InputSpec.detect(path, recorded.format), problems.append) as stream:
        for _ in stream:
            pass
        same = stream.fingerprint() == InputFingerprint.from_dict(recorded.fingerprint())
    return same and not problems


def _input_fields(run: RunDir) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, fields) of each of the parent's input rows, in row order (read a second time: the
    first pass checked the bytes are the ones it relayed)."""
    recorded = run.plan.input
    with open_records(InputSpec.detect(Path(recorded.path), recorded.format), lambda _: None) as stream:
        for record in stream:
            yield record.row_number, record.fields
