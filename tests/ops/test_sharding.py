"""Shard ownership: deterministic, complete, even, and fixed across versions."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable

import pytest

from bulkrelay.errors import UsageError
from bulkrelay.job.inputs import ExpectedInput, InputFingerprint, InputIdentity, RegionDigests
from bulkrelay.job.inputs.rowstarts import RowStarts
from bulkrelay.job.positions import RowPositions
from bulkrelay.job.records import Record
from bulkrelay.ops.sharding import ShardSpec, WorkerShare, parse_shard, resolve_shard, shard_of_key
from bulkrelay.relay.engine import StartPoint
from bulkrelay.store.rowset import RowSet


def _record(row: int, key: object) -> Record:
    return Record(row, row + 1, {"id": key})


def test_every_row_has_exactly_one_shard_and_the_split_is_even() -> None:
    shards = [ShardSpec(k, 4) for k in range(4)]
    records = [_record(n, f"customer-{n}") for n in range(1, 40_001)]
    owners = Counter(sum(1 for shard in shards if shard.owns(r, "id")) for r in records)
    assert owners == {1: 40_000}
    sizes = Counter(shard_of_key(r.fields["id"], 4) for r in records)
    assert all(9_500 <= size <= 10_500 for size in sizes.values())


def test_the_hash_is_fixed_forever() -> None:
    # Pinned values: a new version that moved keys between shards would break runs in progress.
    assert [shard_of_key(f"customer-{n}", 4) for n in range(1, 13)] == [1, 3, 1, 0, 2, 0, 2, 2, 0, 3, 0, 2]
    assert shard_of_key("customer-1", 1000) == 485
    assert shard_of_key(42, 7) == shard_of_key("42", 7)  # keys compare as text, JSON numbers too


def test_without_a_key_rows_are_dealt_round_robin() -> None:
    spec = ShardSpec(1, 3)
    assert [n for n in range(1, 10) if spec.owns(_record(n, None), None)] == [2, 5, 8]


@pytest.mark.parametrize("text", ["4/4", "-1/4", "1", "a/b", "0/0", "1/10001"])
def test_bad_specs_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_shard(text)


def test_the_shard_comes_from_the_flag_the_variable_or_the_indexed_job() -> None:
    assert resolve_shard("1/4", None, {}) == ShardSpec(1, 4)
    assert resolve_shard(None, None, {"BULKRELAY_SHARD": "2/4"}) == ShardSpec(2, 4)
    assert resolve_shard(None, 8, {"JOB_COMPLETION_INDEX": "7"}) == ShardSpec(7, 8)
    assert resolve_shard(None, None, {"JOB_COMPLETION_INDEX": "3", "BULKRELAY_SHARDS": "4"}) == ShardSpec(
        3, 4
    )
    assert resolve_shard(None, None, {"JOB_COMPLETION_INDEX": "3"}) is None  # no N: not sharded
    with pytest.raises(UsageError, match="JOB_COMPLETION_INDEX"):
        resolve_shard(None, 4, {})
    with pytest.raises(UsageError, match="does not exist"):
        resolve_shard(None, 4, {"JOB_COMPLETION_INDEX": "4"})


@pytest.mark.parametrize(
    "environ",
    [
        {"BULKRELAY_SHARDS": "\u00b2", "JOB_COMPLETION_INDEX": "0"},
        {"BULKRELAY_SHARDS": "4", "JOB_COMPLETION_INDEX": "\u00b2"},
        {"BULKRELAY_SHARDS": "9" * 5000, "JOB_COMPLETION_INDEX": "0"},
    ],
    ids=["count-superscript", "index-superscript", "count-5000-digits"],
)
def test_a_shard_number_that_int_refuses_is_a_usage_error(environ: dict[str, str]) -> None:
    # str.isdigit takes "\u00b2" (superscript two) and 5000 digits; int() refuses both
    with pytest.raises(UsageError):
        resolve_shard(None, None, environ)


@pytest.mark.parametrize(
    "text",
    ["0/" + "1" * 5000, "9" * 5000 + "/4", "\u0663/\u0664"],
    ids=["count-5000-digits", "index-5000-digits", "arabic-indic-digits"],
)
def test_a_shard_spec_that_int_refuses_or_reads_otherwise_is_a_usage_error(text: str) -> None:
    # K/N of --shard and BULKRELAY_SHARD: 5000 digits made int() raise ValueError past the usage error
    # (a traceback, exit 1), and \d with int() took other scripts' digits the variables refuse
    with pytest.raises(UsageError, match="BULKRELAY_SHARD"):
        resolve_shard(None, None, {"BULKRELAY_SHARD": text})
    with pytest.raises(UsageError, match="--shard"):
        resolve_shard(text, None, {})


@pytest.mark.parametrize("key_field", ["id", None])
@pytest.mark.parametrize(("shards", "workers"), [(1, 4), (2, 2), (3, 2), (4, 3)])
def test_the_workers_of_a_shard_split_its_rows_between_them_all(
    key_field: str | None, shards: int, workers: int
) -> None:
    records = [Record(n, n + 1, {"id": f"k{n * 7}"}) for n in range(1, 4001)]
    for index in range(shards):
        shard = ShardSpec(index, shards)
        rows = [record for record in records if shard.owns(record, key_field)]
        shares = [
            {r.row_number for r in rows if WorkerShare(i, workers, shards).owns(r, key_field)}
            for i in range(workers)
        ]
        assert sum(len(share) for share in shares) == len(rows)  # each row one worker's
        assert set().union(*shares) == {r.row_number for r in rows}
        assert min(len(share) for share in shares) > len(rows) / workers / 2  # every worker has rows


def _expected(rows: int, chunk: int = 32) -> ExpectedInput:
    starts = RowStarts(chunk, array("q", range(2, rows + 2, chunk)))  # row r on line r + 1
    fingerprint = InputFingerprint(format="csv", gzip=False, sha256="0" * 64, size=1, record_count=rows)
    return ExpectedInput(fingerprint, InputIdentity(0, 0, 1, 0), RegionDigests(b""), starts)


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_chunks_of_rows_split_a_new_runs_rows_evenly_between_the_workers(workers: int) -> None:
    rows = 32 * 16 * workers + 5
    shares = [
        WorkerShare(i, workers).chunks(_expected(rows), rows, StartPoint(), 2048) for i in range(workers)
    ]
    owned = [{row for row in range(1, rows + 1) if share is not None and share.owns(row)} for share in shares]
    assert set().union(*owned) == set(range(1, rows + 1)) and sum(map(len, owned)) == rows
    assert max(map(len, owned)) - min(map(len, owned)) <= 32  # one chunk at most between any two
    owns = [WorkerShare(i, workers).of_rows("id", shares[i]) for i in range(workers)]
    for index in range(workers):
        for row in (1, 33, rows):
            assert owns[index](_record(row, "k")) == (row in owned[index])


def _done(rows: int, done: Iterable[int]) -> RowSet:
    kept = RowSet(rows)
    kept.add_all(done)
    return kept


def test_rows_split_by_number_where_chunks_would_leave_workers_idle() -> None:
    """Each worker holds a fixed share of the concurrency and the rate: chunks only when the rows left
    fall evenly on every worker's chunks, many of them. A few rows, rows left in a few chunks
    (`retry-failed` of a burst of failures), a sparse selection, a shard's rows, or chunks too wide for
    the run-ahead bound: by row number."""
    big = 32 * 16 * 8 * 4

    def chunks(share: WorkerShare, rows: int, start: StartPoint | None = None, chunk: int = 32) -> object:
        return share.chunks(_expected(rows, chunk), rows, start or StartPoint(), 2048)

    assert chunks(WorkerShare(0, 8), big) is not None
    assert chunks(WorkerShare(0, 8), 32 * 16 * 8 - 1) is None  # fewer than 16 chunks a worker
    resumed = StartPoint(done_rows=_done(big, range(1, big // 2)))  # a crash half-way: the rest is even
    assert chunks(WorkerShare(0, 8), big, resumed) is not None
    burst = StartPoint(done_rows=_done(big, [*range(1, 2001), *range(4001, big + 1)]), total=2000)
    assert chunks(WorkerShare(0, 8), big, burst) is None  # rows 2001-4000: under 16 chunks a worker
    window = StartPoint(done_rows=_done(big, [*range(1, 2001), *range(12001, big + 1)]), total=10000)
    assert chunks(WorkerShare(0, 8), big, window) is not None  # 10,000 rows in a row: even
    many = big * 4  # the rows left all in worker 0's chunks: 8,192 of them, enough, but one worker's
    uneven = _done(many, [row for row in range(1, many + 1) if (row - 1) // 32 % 8 != 0])
    assert chunks(WorkerShare(0, 8), many, StartPoint(done_rows=uneven, total=many // 8)) is None
    positions = StartPoint(done_rows=_done(big, range(1, big, 2)), positions=RowPositions(by_request=False))
    assert chunks(WorkerShare(0, 8), big, positions) is None
    assert chunks(WorkerShare(0, 8, shards=2), big) is None
    assert chunks(WorkerShare(0, 8), big * 8, chunk=256) is None  # 7 chunks of 256 span 1,792 rows
    assert chunks(WorkerShare(0, 4), big, chunk=128) is not None  # 3 of 128: 384


@pytest.mark.parametrize(
    ("size", "stripe", "stripes"), [(1, 8, 1), (100, 8, 3), (1000, 32, 2), (4099, 32, 8)]
)
def test_missing_rows_by_stripe_count_each_stripes_rows(size: int, stripe: int, stripes: int) -> None:
    done = _done(size, [row for row in range(1, size + 1) if row % 3 and row % 7])
    expected = [0] * stripes
    for row in range(1, size + 1):
        if row not in done:
            expected[(row - 1) // stripe % stripes] += 1
    assert done.missing_by_stripe(stripe, stripes) == expected


@pytest.mark.parametrize("step", [1, 2, 8])
def test_rows_left_are_dealt_to_the_workers_in_turn_whatever_their_numbers(step: int) -> None:
    """Each worker holds a fixed share of the rate: `retry-failed` of every second row, or a delta night's
    every eighth, would otherwise give all its rows to one worker in eight."""
    left = [_record(row, "k") for row in range(step, 800 * step + 1, step)]  # 800 rows left
    owns = [WorkerShare(i, 8).of_rows("id") for i in range(8)]
    shares = [[record.row_number for record in left if own(record)] for own in owns]
    assert sorted(row for share in shares for row in share) == [record.row_number for record in left]
    assert {len(share) for share in shares} == {len(left) // 8}
    if step == 1:  # a new run: the row number modulo the workers, as before
        assert all((row - 1) % 8 == index for index, share in enumerate(shares) for row in share)
