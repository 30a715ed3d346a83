"""Which rows a shard owns (`--shard K/N`): a deterministic split that every shard computes alone.

With `input.key`, a row belongs to shard `blake2b-64(key) mod N`, so a row keeps its shard when rows are
added, removed or reordered; without a key, to `(row_number - 1) mod N`. Shards count from 0, like a
Kubernetes Indexed Job's `JOB_COMPLETION_INDEX`. The hash is fixed here forever: changing it would move
rows between the shards of a run in progress.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bulkrelay.errors import UsageError
from bulkrelay.job.durations import whole_number
from bulkrelay.job.inputs import ExpectedInput
from bulkrelay.job.inputs.rowstarts import ChunkShare
from bulkrelay.job.records import Record
from bulkrelay.store.rundir import RunDir

if TYPE_CHECKING:  # what a worker is handed: the relay is loaded by then, not by every importer
    from bulkrelay.relay.engine import StartPoint
    from bulkrelay.store.rowset import RowSet

MAX_SHARDS = 10_000
_SPEC = re.compile(r"^\s*([0-9]+)\s*/\s*([0-9]+)\s*$")  # ASCII digits: \d takes any script's


@dataclass(frozen=True, slots=True)
class ShardSpec:
    index: int  # 0 .. count-1
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, record: Record, key_field: str | None) -> bool:
        if key_field is None:
            return (record.row_number - 1) % self.count == self.index
        return shard_of_key(record.fields.get(key_field), self.count) == self.index

    def to_dict(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}


def shard_of_key(value: Any, count: int) -> int:
    """The shard of a key value; a key is compared as text, as the duplicate check compares it."""
    return key_hash(value) % count


def key_hash(value: Any) -> int:
    """A key value's 64-bit hash, whose remainder by N is its shard of N."""
    text = "" if value is None else value if type(value) is str else str(value)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


# The fewest chunks of rows a worker gets before the rows go to workers in chunks: the workers' shares of
# the rows then differ by at most one chunk in this many.
_CHUNKS_PER_WORKER = 16


@dataclass(frozen=True, slots=True)
class WorkerShare:
    """The rows worker `index` of `count` sends (`execution.workers`). Of a shard `K` of `shards`, whose
    rows all hash to K modulo `shards`, the next digits of the same hash (`hash // shards` modulo
    `count`), so that shards and workers compose as one finer split (`hash mod shards x count` is
    `K + shards x index`) and every worker of every shard has rows. Unsharded, the rows left to send
    are dealt in turn (`of_rows`: the k-th is worker `k mod count`'s; in a new run, the row number
    modulo `count`), or in chunks of rows when those share them out evenly (`chunks`: each worker then
    parses only its own). A row need not keep its worker from one call to the next (the run has one
    journal), so the split may differ between them."""

    index: int
    count: int
    shards: int = 1

    def owns(self, record: Record, key_field: str | None) -> bool:
        if self.shards == 1 or key_field is None:
            spread = record.row_number - 1
        else:
            spread = key_hash(record.fields.get(key_field))
        return (spread // self.shards) % self.count == self.index

    def of_rows(self, key_field: str | None, chunks: ChunkShare | None = None) -> Callable[[Record], bool]:
        """Whether a row left to send is this worker's, asked once for each such row in row order (as
        every worker of the call asks it, of the same rows: one call a row, on the hot path). With
        `chunks`, the rows of its chunks. Unsharded otherwise, the rows left are dealt in turn: each
        worker holds a fixed share of the concurrency and the rate, so rows left on a few residues of
        the row number (`retry-failed` of every second row, a delta night's every eighth) would leave
        the other workers' shares idle."""
        count, index = self.count, self.index
        if chunks is not None:  # the reader yields only these (relay_share does not ask)
            return lambda record: chunks.owns(record.row_number)
        if self.shards == 1:
            dealt = itertools.count()
            return lambda record: next(dealt) % count == index
        return lambda record: self.owns(record, key_field)

    def chunks(
        self, expected: ExpectedInput | None, rows: int, start: StartPoint, run_ahead: int
    ) -> ChunkShare | None:
        """The worker's chunks of rows (job/inputs/rowstarts.py), which it alone parses; None when the
        rows are split by number (`of_rows`), each worker parsing every row. Chunks only when they
        share the work out evenly: each worker holds a fixed share of the concurrency and the rate,
        and a worker without rows leaves its share idle. So not under `--shard` (the rows go by
        hash), nor for a sparse selection, nor when the rows left to send (a resume's, a
        `retry-failed` run's, a delta run's) fall unevenly on the workers' chunks, nor with fewer
        than `_CHUNKS_PER_WORKER` chunks a worker, nor when chunks so wide (a huge input's) would
        hold the last worker past the run-ahead bound (relay/runahead.py) while the first works
        through its chunk."""
        if self.shards != 1 or expected is None or expected.row_starts is None or start.positions is not None:
            return None
        size = expected.row_starts.chunk
        if 2 * (self.count - 1) * size > run_ahead or not _even(start.done_rows, rows, size, self.count):
            return None
        return ChunkShare(expected.row_starts, self.index, self.count, rows)


def _even(done: RowSet | None, rows: int, chunk: int, workers: int) -> bool:
    """Whether the pending rows (those not `done`; every row when None) give each of `workers` at
    least `_CHUNKS_PER_WORKER` chunks' worth, within an eighth of each other (or a chunk)."""
    if done is None:
        return rows >= _CHUNKS_PER_WORKER * workers * chunk
    pending = done.missing_by_stripe(chunk, workers)
    total = sum(pending)
    return total >= _CHUNKS_PER_WORKER * workers * chunk and max(pending) - min(pending) <= max(
        chunk, total // (8 * workers)
    )


def parse_shard(text: str, source: str = "--shard") -> ShardSpec:
    match = _SPEC.match(text)
    if match is None:
        raise UsageError(
            f"{source} must be K/N (shard K of N, counting from 0), not {text!r}",
            suggestion="for example --shard 0/4 ... --shard 3/4",
        )
    # whole_number, as for the variables: int() raises ValueError past 4300 digits, not a usage error
    index, count = whole_number(match.group(1)), whole_number(match.group(2))
    assert index is not None and count is not None  # ASCII digits, by _SPEC
    return _checked(index, count, source)


def _checked(index: int, count: int, source: str, count_source: str | None = None) -> ShardSpec:
    if not 1 <= count <= MAX_SHARDS:
        raise UsageError(
            f"{count_source or source}: the number of shards must be 1 to {MAX_SHARDS}, not {count}"
        )
    if not 0 <= index < count:
        raise UsageError(
            f"{source}: shard {index} does not exist among {count} (they count from 0 to {count - 1})"
        )
    return ShardSpec(index, count)


def resolve_shard(shard: str | None, shards: int | None, environ: Mapping[str, str]) -> ShardSpec | None:
    """The shard of this process: `--shard K/N`, else `BULKRELAY_SHARD`, else `JOB_COMPLETION_INDEX` (a
    Kubernetes Indexed Job's) of `--shards N` / `BULKRELAY_SHARDS`; None when unsharded. Reads only its
    arguments and `environ`, so a typo is refused before any input is read."""
    if shard is not None:
        return parse_shard(shard)
    if environ.get("BULKRELAY_SHARD"):
        return parse_shard(environ["BULKRELAY_SHARD"], "BULKRELAY_SHARD")
    count_source = "--shards" if shards is not None else "BULKRELAY_SHARDS"
    count_text = str(shards) if shards is not None else environ.get("BULKRELAY_SHARDS")
    if not count_text:
        return None
    count = whole_number(count_text)
    if count is None:
        raise UsageError(f"{count_source} must be a whole number, not {count_text!r}")
    index_text = environ.get("JOB_COMPLETION_INDEX")
    if index_text is None:
        raise UsageError(
            f"{count_source} needs the shard's index in JOB_COMPLETION_INDEX "
            "(set by a Kubernetes Indexed Job)",
            suggestion="or name the shard with --shard K/N",
        )
    index = whole_number(index_text)
    if index is None:
        raise UsageError(f"JOB_COMPLETION_INDEX must be the shard's index (0, 1, ...), not {index_text!r}")
    return _checked(index, count, "JOB_COMPLETION_INDEX", count_source)


def shard_of_run(run: RunDir) -> str | None:
    """`K/N` of a run made by `--shard`, from its manifest; None for an unsharded run."""
    return None if run.plan.shard is None else str(run.plan.shard)
