"""`bulkrelay shards DIR...`: the shards of one job, each an ordinary run, summed into one view.

Each DIR is a shard's runs directory (its newest sharded run is taken) or a run directory. Reads only.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bulkrelay.envelope import EnvelopeWarning, Result
from bulkrelay.errors import NotFound
from bulkrelay.ops.results import ShardRow, ShardsResult
from bulkrelay.ops.sharding import shard_of_run
from bulkrelay.ops.status import LIVE, committed_progress, liveness
from bulkrelay.relay.progress import Snapshot
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.runs import is_run_dir, runs_in


def shards(dirs: list[Path]) -> Result:
    rows = [_shard_row(_shard_run(path)) for path in dirs]
    rows.sort(key=lambda row: (row.shard is None, row.shard or ""))
    total = Snapshot(
        total=sum(row.progress.total for row in rows),
        done=sum(row.progress.done for row in rows),
        ok=sum(row.progress.ok for row in rows),
        failed=sum(row.progress.failed for row in rows),
    )
    live = sum(1 for row in rows if row.live)
    data = ShardsResult(tuple(rows), total, live, _complete(rows))
    return Result(data=data, warnings=_consistency(rows))


def _shard_run(path: Path) -> RunDir:
    """The run directory itself, or the newest sharded run of a runs directory."""
    if is_run_dir(path):
        return RunDir.open(path)
    for run in runs_in(path):
        if shard_of_run(run) is not None:
            return run
    raise NotFound(
        f"no sharded run in {path}",
        context={"path": str(path)},
        suggestion="name each shard's runs directory (--runs-dir of its `run --shard K/N`) or run directory",
    )


def _shard_row(run: RunDir) -> ShardRow:
    return ShardRow(
        shard=shard_of_run(run),
        run_id=run.run_id,
        run_dir=str(run.path),
        state=run.state,
        live=liveness(run) == LIVE,  # another user's finished shard is not live (status's rule)
        progress=committed_progress(run),
    )


def _complete(rows: list[ShardRow]) -> bool:
    """Every shard of N present once, and each finished (with or without failed rows)."""
    specs = [row.shard for row in rows if row.shard is not None]
    if not specs or len(specs) < len(rows):
        return False
    count = int(specs[0].split("/")[1])
    every = {f"{k}/{count}" for k in range(count)}
    finished = all(row.state.every_row_ended for row in rows)
    return set(specs) == every and len(specs) == count and finished


def _consistency(rows: list[ShardRow]) -> list[EnvelopeWarning]:
    specs = [row.shard for row in rows if row.shard is not None]
    warnings = []
    counts = {spec.split("/")[1] for spec in specs}
    if len(counts) > 1:
        warnings.append(
            EnvelopeWarning("SHARDS_MIXED", f"shards of different splits: {', '.join(sorted(specs))}", {})
        )
    twice = [spec for spec, n in Counter(specs).items() if n > 1]
    if twice:
        warnings.append(EnvelopeWarning("SHARD_TWICE", f"named twice: {', '.join(twice)}", {"shards": twice}))
    if len(counts) == 1:
        count = int(next(iter(counts)))
        missing = sorted(set(range(count)) - {int(spec.split("/")[0]) for spec in specs})
        if missing:
            text = ", ".join(f"{k}/{count}" for k in missing)
            warnings.append(EnvelopeWarning("SHARDS_MISSING", f"not given: {text}", {"missing": missing}))
    return warnings
