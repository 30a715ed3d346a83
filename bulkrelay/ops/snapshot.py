"""A query job's input: the snapshot of its query, taken into the spool (a run then keeps it as its
`input.jsonl`), or the unfinished run's own snapshot, which its identical re-run reads again instead of
querying. `validate` and `render` take one that lives only as long as the command."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from bulkrelay.errors import UsageError
from bulkrelay.job.config import Job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.inputs.query import QuerySpec, RowsRead, database_of, snapshot_into
from bulkrelay.job.preflight import query_source
from bulkrelay.private import make_private_dir
from bulkrelay.store.rundir import RunDir


def is_query_job(job: Job) -> bool:
    return job.config.input.query is not None


def query_spec(job: Job, env: Mapping[str, str] | None = None) -> QuerySpec:
    """What the job's query runs: its text, its params and its database (`${...}` resolved)."""
    given = job.config.input
    assert given.query is not None and given.database is not None  # a query job (config checks both)
    return QuerySpec(
        query=given.query,
        params=dict(given.params),
        database=database_of(given.database, os.environ if env is None else env, job.base_dir),
        job_file=str(job.path),
        query_line=job.lines.line(("input", "query")),
    )


def refuse_input_override(job: Job, input_arg: str | None) -> None:
    if input_arg is not None and is_query_job(job):
        raise UsageError(
            "this job reads its records from input.query: --input does not go with it",
            context={"input": input_arg},
            suggestion="drop --input, or use a job whose input is a file",
        )


def take_snapshot(job: Job, spool_dir: Path, on_rows: RowsRead | None = None) -> Path:
    """Run the job's query once into a new private `.jsonl` file in `spool_dir` (fsynced)."""
    spec = query_spec(job)
    make_private_dir(spool_dir)
    dest = spool_dir / f"query-{os.getpid()}-{time.time_ns()}.jsonl"
    snapshot_into(spec, dest, on_rows)
    return dest


@contextmanager
def passing_snapshot(job: Job, spool_dir: Path) -> Iterator[Path]:
    """A snapshot for `validate` or `render`: removed when the command ends, however it ends."""
    path = take_snapshot(job, spool_dir)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def reusable_snapshot(job: Job, previous: RunDir | None) -> Path | None:
    """The snapshot of the identical invocation's unfinished run, when it is still what this job would
    query: the same configuration (query text, params) and the same database. Else None: query afresh."""
    if previous is None or previous.plan.input.source is None:
        return None
    kept = Path(previous.plan.input.path)
    if not kept.is_file() or previous.plan.config_sha256 != config_fingerprint(job.config):
        return None
    if previous.plan.input.source != query_source(job, os.environ):
        return None
    return kept
