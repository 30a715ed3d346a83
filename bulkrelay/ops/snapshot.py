"""A query job's input: the snapshot of its query, taken into the spool (a run then keeps it as its
`input.jsonl`), or the unfinished run's own snapshot, which its identical re-run reads again instead of
querying. `validate` and `render` take one that lives only as long as the command."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from bulkrelay.errors import UsageError
from bulkrelay.job.config import Job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.inputs import abandoned_spools, detect_format, let_go_of_spool, spool_file
from bulkrelay.job.inputs.parquet import parquet_into, parquet_source
from bulkrelay.job.inputs.query import QuerySpec, RowsRead, database_of, snapshot_into
from bulkrelay.job.preflight import query_source
from bulkrelay.ops.chain import take_chain_snapshot
from bulkrelay.store.rundir import RunDir


def is_query_job(job: Job) -> bool:
    """Whether the job's records are a snapshot taken when it runs: of a query, or of another job's
    results (`input.results_of`, ops/chain.py)."""
    return job.config.input.query is not None or job.config.input.results_of is not None


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


def parquet_input(job: Job, input_path: Path | None) -> Path | None:
    """The Parquet file a job reads (`--input`, else input.file), or None: not a Parquet input."""
    path = input_path if input_path is not None else job.input_path
    if path is None or is_query_job(job):
        return None
    return path if detect_format(path.name, job.config.input.format)[0] == "parquet" else None


def _spool_name(spool_dir: Path, kind: str) -> Path:
    """A new snapshot's file; the snapshots of runs killed while taking theirs are removed first."""
    abandoned_spools(spool_dir, remove=True)
    return spool_file(spool_dir, kind, ".jsonl")


def take_snapshot(job: Job, spool_dir: Path, on_rows: RowsRead | None = None) -> Path:
    """Run the job's query once (or read its parent's results) into a new private `.jsonl` file in
    `spool_dir` (fsynced). The spool is in the runs directory, where a parent's runs are."""
    if job.config.input.results_of is not None:
        dest = _spool_name(spool_dir, "results-of")
        take_chain_snapshot(job, spool_dir.parent, dest)
        return dest
    dest = _spool_name(spool_dir, "query")
    snapshot_into(query_spec(job), dest, on_rows)
    return dest


def take_parquet(parquet: Path, spool_dir: Path, on_rows: RowsRead | None = None) -> tuple[Path, str]:
    """The rows of a Parquet file in a new private `.jsonl` file in `spool_dir`, and its source."""
    dest = _spool_name(spool_dir, "parquet")
    return dest, parquet_into(parquet, dest, on_rows)[1]


@contextmanager
def passing_snapshot(job: Job, spool_dir: Path, parquet: Path | None = None) -> Iterator[Path]:
    """A snapshot (of the query, or of the Parquet file) for `validate` or `render`: removed when the
    command ends, however it ends."""
    path = take_snapshot(job, spool_dir) if parquet is None else take_parquet(parquet, spool_dir)[0]
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        let_go_of_spool(spool_dir)


def reusable_parquet(job: Job, previous: RunDir | None, parquet: Path) -> tuple[Path | None, str]:
    """The unfinished run's snapshot of this Parquet file when its bytes are still the ones it read
    (else None), and the file's source as it is now."""
    source = parquet_source(parquet)
    if previous is None or previous.plan.input.source != source:
        return None, source
    kept = Path(previous.plan.input.path)
    if not kept.is_file() or previous.plan.config_sha256 != config_fingerprint(job.config):
        return None, source
    return kept, source


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
