"""A run's `lookups:` maps: built before preflight (another job's results from its journals, a query
read once), frozen into the run directory (one JSON Lines file a lookup, named after it, in its
`lookups` folder, 0600), and read back from there by `resume` and by the identical re-run of a run
that did not complete, which never build them again."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.errors import InputChanged, NotFound
from bulkrelay.job.config import Job, LookupConfig, pointer_tokens
from bulkrelay.job.fingerprint import file_sha256
from bulkrelay.job.inputs import spool_file
from bulkrelay.job.inputs.lookups import LookupMap, build_map, freeze, read_frozen
from bulkrelay.job.inputs.query import QuerySpec, database_of, snapshot_into
from bulkrelay.ops.chain import parent_outcomes
from bulkrelay.ops.lookupget import get_pairs
from bulkrelay.private import make_private_dir
from bulkrelay.store.rundir import RunDir

FROZEN_DIR = "lookups"  # in the run directory: one NAME.jsonl a lookup
_ABSENT = object()


def built_lookups(job: Job, runs_dir: Path) -> dict[str, LookupMap]:
    """Every map of the job, built now from its source."""
    return {name: _built(job, name, given, runs_dir) for name, given in job.config.lookups.items()}


def with_lookups(job: Job, maps: Mapping[str, Mapping[str, Any]]) -> Job:
    return replace(job, lookups=maps)


def freeze_all(maps: Mapping[str, Mapping[str, Any]], spool_dir: Path) -> Path:
    """The maps frozen into a new private directory in `spool_dir` (moved into the run it starts)."""
    frozen = spool_file(spool_dir, "lookups", "")  # named under this process's owner lock there
    make_private_dir(frozen)
    for name, table in maps.items():
        freeze(frozen / f"{name}.jsonl", table)
    return frozen


def keep_frozen(frozen: Path, run: RunDir) -> None:
    """Move this call's frozen maps into the run being built (same runs directory: a rename)."""
    os.replace(frozen, run.path / FROZEN_DIR)
    run.storage.fsync_dir(run.path)


def discard_frozen(frozen: Path | None) -> None:
    if frozen is not None:
        shutil.rmtree(frozen, ignore_errors=True)


def frozen_lookups(job: Job, run: RunDir) -> dict[str, LookupMap]:
    """The maps `run` froze when it started: what its resume and identical re-run read. A frozen file
    whose digest is not the one the run's plan recorded is INPUT_CHANGED naming it: the run's rows
    were sent with the map it held, and never with another."""
    maps = {}
    for name in job.config.lookups:
        path = run.path / FROZEN_DIR / f"{name}.jsonl"
        if not path.is_file():
            raise NotFound(
                f"run {run.run_id} has no frozen map of lookup {name} ({path})",
                context={"run_dir": str(run.path), "lookup": name},
                suggestion="run the job afresh (its lookups are then built again)",
            )
        _check_digest(run, name, path)
        maps[name] = read_frozen(path)
    return maps


def has_frozen(run: RunDir) -> bool:
    """Whether `run` froze lookup maps (a run made before their digests were recorded: its folder)."""
    return bool(run.plan.lookups) or (run.path / FROZEN_DIR).is_dir()


def _check_digest(run: RunDir, name: str, path: Path) -> None:
    recorded = (run.plan.lookups or {}).get(name)
    if recorded is None:
        return  # a run made before the digests were recorded
    now = file_sha256(path)
    if now != recorded.get("sha256"):
        raise InputChanged(
            f"the frozen map of lookup {name} changed since run {run.run_id} started "
            f"(sha256 {str(recorded.get('sha256'))[:12]} -> {now[:12]}): {path}",
            context={"run_dir": str(run.path), "lookup": name, "path": str(path)},
            suggestion="restore the file, or set the run aside and run the job afresh (its maps built anew)",
        )


def _built(job: Job, name: str, given: LookupConfig, runs_dir: Path) -> LookupMap:
    if given.results_of is not None:
        assert given.value is not None  # the config requires it
        pairs = _results_pairs(given.results_of, given.value, runs_dir)
        return build_map(name, pairs, f"the results of job {given.results_of}")
    if given.get is not None:
        return build_map(name, get_pairs(job, name, given, os.environ), f"{job.path}: lookups.{name}.get")
    return build_map(name, _query_pairs(job, name, given, runs_dir / ".spool"), f"{job.path}: lookups.{name}")


def _results_pairs(parent: str, pointer: str, runs_dir: Path) -> Iterator[tuple[str, Any]]:
    """(key, the value the pointer names) of the parent job's rows that succeeded; a row whose outcome
    holds nothing there gives no pair (its key is a miss). A parent journal that does not read whole
    refuses the job (ops/chain.py), as it refuses `export`: never a map short of the keys past it."""
    tokens = pointer_tokens(pointer)
    _, outcomes = parent_outcomes(runs_dir, parent, spool_file(runs_dir / ".spool", "latest", ".sqlite"))
    for row in outcomes:
        if not row[4]:
            continue
        node: Any = {"key": row[1], "row_number": row[2], "captured": orjson.loads(row[9] or "{}")}
        for token in tokens:
            node = node.get(token, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            yield row[1], node


def _query_pairs(job: Job, name: str, given: LookupConfig, spool_dir: Path) -> Iterator[tuple[Any, Any]]:
    """(first column, second column) of each row of the lookup's query, read once through a spool; a
    query of other than two columns is refused naming it. A row whose key is NULL gives no pair: as
    in SQL, NULL equals nothing, so no record's key (not even the text `null`) finds its value."""
    assert given.query is not None and given.database is not None  # a query lookup
    spec = QuerySpec(
        query=given.query,
        params={},
        database=database_of(given.database, os.environ, job.base_dir),
        job_file=str(job.path),
        query_line=job.lines.line(("lookups", name, "query")),
        field=f"lookups.{name}.query",
        params_field=None,
        columns=("the key", "the value"),
    )
    make_private_dir(spool_dir)
    spool = spool_dir / f"lookup-{os.getpid()}-{time.time_ns()}.jsonl"
    snapshot_into(spec, spool)
    try:
        with spool.open("rb") as stream:
            for line in stream:
                key, value = orjson.loads(line).values()
                if key is not None:
                    yield key, value
    finally:
        spool.unlink(missing_ok=True)
