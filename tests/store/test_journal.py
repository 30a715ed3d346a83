"""The journal line format and the group-commit writer."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import re
import threading
import zlib
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from bulkrelay.errors import StorageFailed
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.journal import (
    JournalEntry,
    JournalState,
    JournalWriter,
    decode_line,
    decode_marker,
    encode_batch,
    encode_line,
    entry_of,
    entry_problem,
    is_commit_marker,
    read_journal,
    scan_journal,
)
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.storage import Storage
from tests.waiting import wait_for


def fields(row: int, **extra: Any) -> dict[str, Any]:
    return {
        "row_number": row,
        "success": row % 5 != 0,
        "classification": "ok" if row % 5 else "http_client_error",
        "status_code": 201 if row % 5 else 422,
        "attempts": 1,
        "retryable": False,
        "error": None if row % 5 else "HTTP 422",
        "duration_ms": 1.5 * row,
        **extra,
    }


def result(row: int, **extra: Any) -> JournalEntry:
    return JournalEntry(**fields(row, **extra))


def raw_line(keys: dict[str, Any]) -> bytes:
    """A line with a valid checksum around any JSON object: what only a hand-made line can hold."""
    return _with_crc(orjson.dumps(keys)[:-1])


class Commits:
    def __init__(self) -> None:
        self.batches: list[tuple[list[JournalEntry], int]] = []

    def __call__(self, entries: list[JournalEntry], end_offset: int) -> None:
        self.batches.append((list(entries), end_offset))

    @property
    def rows(self) -> int:
        return sum(len(entries) for entries, _ in self.batches)


async def write_all(writer: JournalWriter, entries: list[JournalEntry]) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for entry in entries:
            await writer.submit(entry)
        await writer.close()


# ---------------------------------------------------------------- line format


def test_line_ends_with_a_checksum_of_its_own_bytes() -> None:
    line = encode_line(1, result(7))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    head, tail = line[:-19], line[-19:]
    assert tail == b',"crc":"%08x"}\n' % zlib.crc32(head)
    parsed = orjson.loads(line)
    assert next(iter(parsed)) == "seq" and list(parsed)[-1] == "crc"
    assert decode_line(line) == (1, result(7))


def test_optional_fields_round_trip() -> None:
    entry = result(
        3,
        latency_ms=2.5,
        key="c-3",
        idempotency_key="abc",
        captured={"id": "x\ny"},
        response_body="oops",
        digest="00ff",
    )
    assert decode_line(encode_line(3, entry)) == (3, entry)
    assert decode_line(encode_line(4, result(4, key=17))) == (4, result(4, key=17))  # a JSON key value


def test_a_line_without_the_optional_keys_reads_as_nulls() -> None:
    """Journals written before every key was spelled out, null or not, stay readable."""
    assert decode_line(raw_line({"seq": 2, **fields(2)})) == (2, result(2))


def test_batch_encoding_is_line_encoding() -> None:
    entries = [result(n, key=f"k{n}") for n in range(1, 6)]
    assert encode_batch(7, entries) == [encode_line(seq, e) for seq, e in enumerate(entries, 7)]


def test_every_single_byte_flip_is_detected() -> None:
    line = encode_line(1, result(7))
    for index in range(len(line)):
        damaged = bytearray(line)
        damaged[index] ^= 0x01
        with pytest.raises(ValueError):
            decode_line(bytes(damaged))


def _with_crc(head: bytes) -> bytes:
    return head + b',"crc":"%08x"}\n' % zlib.crc32(head)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"\n", "blank line"),
        (b"   \n", "blank line"),
        (b"\0" * 40, "truncated line"),
        (b"\0" * 40 + b"\n", "NUL bytes"),
        (b'{"seq":1,"row_number":2}\n', "no checksum"),
        (encode_line(1, result(2))[:-1], "truncated line"),
        (encode_line(1, result(2)).replace(b"201", b"202"), "checksum mismatch"),
        (_with_crc(b'{"seq":1,"row_number":'), "not valid JSON"),
        (_with_crc(b"[1,2"), "not valid JSON"),
        (_with_crc(b'{"seq":1'), "missing key 'row_number'"),
        (
            raw_line({"seq": 1, **fields(2, status_code=True)}),
            "'status_code' must be int or null, got bool",
        ),
        (raw_line({"seq": 1, **fields(2, success=1)}), "'success' must be bool, got int"),
        (raw_line({"seq": "1", **fields(2)}), "'seq' must be int, got str"),
        (raw_line({"seq": 1, **fields(2, ts="t")}), "unknown key 'ts'"),
        (raw_line({"seq": 1, **fields(2, digest=5)}), "'digest' must be null or str, got int"),
        (raw_line({"seq": 1, **fields(2, captured=[1])}), "'captured' must be dict or null, got list"),
    ],
)
def test_bad_lines_say_why(line: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_line(line)


def test_entry_problem_accepts_nulls_where_allowed() -> None:
    assert entry_problem({"seq": 1, **fields(1, status_code=None, error="connect refused")}) is None
    assert entry_problem({"seq": 1, **fields(1, duration_ms=3)}) is None
    assert entry_problem({"seq": 1, **fields(1, error=None)}) is None
    assert entry_problem({"seq": 1, **fields(1, key=None, captured=None, latency_ms=None)}) is None
    missing = {"seq": 1, **fields(1)}
    del missing["status_code"]
    assert entry_problem(missing) == "missing key 'status_code'"


def test_read_journal_stops_at_the_first_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    good = [encode_line(n, result(n)) for n in (1, 2)]
    path.write_bytes(b"".join(good) + b'{"seq":3,"row_num' + good[1])
    assert list(read_journal(path)) == [result(1), result(2)]
    assert list(read_journal(tmp_path / "missing.jsonl")) == []


# ---------------------------------------------------------------- writer


@pytest.mark.anyio
async def test_one_write_and_one_fsync_per_batch(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    spy, commits = FaultyStorage(), Commits()
    writer = JournalWriter(path, spy, next_seq=1, on_commit=commits, max_rows=10, max_delay=5.0)
    await write_all(writer, [result(n) for n in range(1, 96)])

    assert len(spy.writes) == spy.fsyncs == len(commits.batches) == 10  # 9 full batches and the rest
    assert [len(entries) for entries, _ in commits.batches] == [10] * 9 + [5]
    assert len(spy.dir_fsyncs) == 1
    assert threading.get_ident() not in spy.threads  # blocking I/O ran off the event loop
    every_line = path.read_bytes().splitlines(keepends=True)
    lines = [line for line in every_line if not is_commit_marker(line)]
    assert len(every_line) - len(lines) == 10  # each write ends with its group's commit marker
    assert [decode_line(line)[0] for line in lines] == list(range(1, 96))
    assert [decode_line(line)[1].row_number for line in lines] == list(range(1, 96))


@pytest.mark.anyio
async def test_every_group_is_written_by_one_thread_of_the_writer_that_ends_with_it(tmp_path: Path) -> None:
    spy, commits = FaultyStorage(), Commits()
    writer = JournalWriter(tmp_path / "results.jsonl", spy, next_seq=1, on_commit=commits, max_rows=10)
    await write_all(writer, [result(n) for n in range(1, 96)])

    assert len(commits.batches) == 10
    assert len(spy.threads) == 1  # every group's write: one thread, in order
    (writer_thread,) = spy.threads
    assert writer_thread != threading.get_ident()
    alive = threading.enumerate
    wait_for(lambda: writer_thread not in {t.ident for t in alive()}, "the journal's thread to end")


@pytest.mark.anyio
async def test_on_commit_reports_entries_and_end_offsets(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    spy, commits = FaultyStorage(), Commits()
    writer = JournalWriter(path, spy, next_seq=1, on_commit=commits, max_rows=7)
    await write_all(writer, [result(n) for n in range(1, 31)])

    offset, seq = 0, 1
    for (entries, end_offset), data in zip(commits.batches, spy.writes, strict=True):
        offset += len(data)
        assert end_offset == offset
        group = b"".join(encode_batch(seq, entries))
        assert data.startswith(group)  # then the group's commit marker, in the same write
        marker = decode_marker(data[len(group) :])
        assert marker is not None and (marker.seq, marker.rows) == (seq + len(entries) - 1, len(entries))
        assert marker.group_crc == zlib.crc32(group)
        seq += len(entries)
    assert offset == path.stat().st_size
    assert [entry.row_number for entries, _ in commits.batches for entry in entries] == list(range(1, 31))


@pytest.mark.anyio
async def test_appends_after_an_existing_journal_continuing_seq(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    first = Commits()
    writer = JournalWriter(path, Storage(), next_seq=1, on_commit=first)
    await write_all(writer, [result(n) for n in (1, 2, 3)])
    size = path.stat().st_size
    second = Commits()
    await write_all(JournalWriter(path, Storage(), next_seq=4, on_commit=second), [result(n) for n in (4, 5)])

    assert second.batches[-1][1] == path.stat().st_size > size
    scan = scan_journal(path, committed_seq=3, committed_offset=size, row_count=5)
    assert scan.last_seq == 5 and scan.torn_tail is None and scan.done.count == 5


@pytest.mark.anyio
async def test_offer_queues_without_a_wait_and_refuses_what_submit_would_wait_or_fail_on(
    tmp_path: Path,
) -> None:
    commits = Commits()
    writer = JournalWriter(tmp_path / "j", Storage(), next_seq=1, on_commit=commits, max_rows=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        offered = [writer.offer(result(n)) for n in range(1, 10)]  # 4 x max_rows pending at most
        assert offered == [True] * 8 + [False]  # the ninth would wait for room: submit's to do
        await writer.submit(result(9))
        await writer.close()
    assert writer.offer(result(10)) is False  # closed: submit raises, offer queues nothing
    assert [entry.row_number for entries, _ in commits.batches for entry in entries] == list(range(1, 10))


@pytest.mark.anyio
async def test_a_lone_entry_is_committed_after_max_delay(tmp_path: Path) -> None:
    commits = Commits()
    writer = JournalWriter(tmp_path / "j", Storage(), next_seq=1, on_commit=commits, max_delay=0.02)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        await writer.submit(result(1))
        await anyio.sleep(0.005)
        assert commits.rows == 0  # still gathering a batch
        with anyio.fail_after(2):
            while commits.rows == 0:
                await anyio.sleep(0.005)
        await writer.close()
    assert commits.rows == 1


@pytest.mark.anyio
async def test_close_commits_at_once_without_waiting_for_max_delay(tmp_path: Path) -> None:
    commits = Commits()
    writer = JournalWriter(tmp_path / "j", Storage(), next_seq=1, on_commit=commits, max_delay=60)
    with anyio.fail_after(5):
        await write_all(writer, [result(1), result(2)])
    assert commits.rows == 2


@pytest.mark.anyio
async def test_batches_respect_max_bytes(tmp_path: Path) -> None:
    spy, commits = FaultyStorage(), Commits()
    writer = JournalWriter(tmp_path / "j", spy, next_seq=1, on_commit=commits, max_rows=1000, max_bytes=2000)
    await write_all(writer, [result(n, error="x" * 300) for n in range(1, 41)])
    assert commits.rows == 40
    assert len(spy.writes) > 1
    assert all(len(data) <= 2000 for data in spy.writes)


@pytest.mark.anyio
async def test_async_on_commit_is_awaited_before_the_next_batch(tmp_path: Path) -> None:
    seen: list[int] = []

    async def on_commit(entries: list[JournalEntry], end_offset: int) -> None:
        await anyio.sleep(0.001)
        seen.append(entries[-1].row_number)

    writer = JournalWriter(tmp_path / "j", Storage(), next_seq=1, on_commit=on_commit, max_rows=3)
    await write_all(writer, [result(n) for n in range(1, 10)])
    assert seen == [3, 6, 9]


@pytest.mark.anyio
async def test_backpressure_bounds_the_pending_entries(tmp_path: Path) -> None:
    spy, commits = FaultyStorage(fsync_delay_s=0.002), Commits()
    writer = JournalWriter(tmp_path / "j", spy, next_seq=1, on_commit=commits, max_rows=10)
    lag: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for n in range(1, 301):
            await writer.submit(result(n))
            lag.append(n - commits.rows)
        await writer.close()
    assert max(lag) <= 4 * 10 + 10  # the backlog limit, plus the batch being fsynced
    assert commits.rows == 300


@pytest.mark.anyio
@pytest.mark.parametrize("spy", [FaultyStorage(fail_fsync_at=2), FaultyStorage(fail_write_at=2)])
async def test_a_failed_write_or_fsync_ends_run_unreported(tmp_path: Path, spy: FaultyStorage) -> None:
    commits = Commits()
    writer = JournalWriter(tmp_path / "j", spy, next_seq=1, on_commit=commits, max_rows=5)
    failures: list[StorageFailed] = []
    try:
        await write_all(writer, [result(n) for n in range(1, 21)])
    except* StorageFailed as group:
        failures = [exc for exc in group.exceptions if isinstance(exc, StorageFailed)]
    assert len(failures) == 1 and "injected" in failures[0].message
    assert [entry.row_number for entries, _ in commits.batches for entry in entries] == [1, 2, 3, 4, 5]
    assert len(spy.writes) == 2  # never retried
    with pytest.raises(StorageFailed):
        await writer.submit(result(21))


@pytest.mark.anyio
async def test_what_the_writer_writes_a_resume_reads_back(tmp_path: Path) -> None:
    """The type is the schema: every entry the writer takes is a line the reader accepts, as it was."""
    path = tmp_path / "j"
    entries = [
        result(1, key="k1", idempotency_key="i1", captured={"id": "r1"}, latency_ms=1.0),
        result(2, status_code=None, error="ConnectError: refused", response_body=None, digest="ab"),
        result(3, key=3, captured={}, response_body="x" * 500),
    ]
    await write_all(JournalWriter(path, Storage(), next_seq=1, on_commit=Commits()), entries)
    assert list(read_journal(path)) == entries
    scan = scan_journal(path, committed_seq=3, committed_offset=path.stat().st_size, row_count=3)
    assert scan.last_seq == 3 and scan.torn_tail is None


@pytest.mark.anyio
async def test_cancelling_the_run_leaves_only_whole_committed_batches(tmp_path: Path) -> None:
    path = tmp_path / "j"
    spy, commits = FaultyStorage(fsync_delay_s=0.01), Commits()
    writer = JournalWriter(path, spy, next_seq=1, on_commit=commits, max_rows=4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for n in range(1, 13):
            await writer.submit(result(n))
        await anyio.sleep(0.015)
        tg.cancel_scope.cancel()
    assert commits.batches, "the batch in flight when cancelled is still reported"
    assert commits.batches[-1][1] == path.stat().st_size


def _leaf_exceptions(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaf_exceptions(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves


@pytest.mark.anyio
async def test_a_failure_surfaces_once_when_submitters_are_blocked_in_a_nested_group(tmp_path: Path) -> None:
    """The engine's shape: run() in an outer group, workers blocked on backpressure in an inner one."""
    spy = FaultyStorage(fail_fsync_at=3, fsync_delay_s=0.005)
    writer = JournalWriter(tmp_path / "j", spy, next_seq=1, on_commit=Commits(), max_rows=5)
    rows = iter(range(1, 10_000))

    async def worker() -> None:
        for row in rows:
            await writer.submit(result(row))

    leaves: list[BaseException] = []
    with anyio.fail_after(5):
        try:
            async with anyio.create_task_group() as outer:
                outer.start_soon(writer.run)
                async with anyio.create_task_group() as workers:
                    for _ in range(8):
                        workers.start_soon(worker)
                await writer.close()
        except BaseExceptionGroup as group:
            leaves = _leaf_exceptions(group)
    assert len(leaves) == 1 and isinstance(leaves[0], StorageFailed)


REQUIRED = (
    "seq",
    "row_number",
    "success",
    "classification",
    "status_code",
    "attempts",
    "retryable",
    "error",
    "duration_ms",
)
WRONG = {
    "seq": 1.0,
    "row_number": "1",
    "success": 1,
    "classification": None,
    "status_code": 200.0,
    "attempts": True,
    "retryable": None,
    "error": 5,
    "duration_ms": "1",
}


@pytest.mark.parametrize("key", REQUIRED)
def test_every_required_key_is_checked_by_the_reader(key: str) -> None:
    entry = {"seq": 1, **fields(1)}
    missing = {k: v for k, v in entry.items() if k != key}
    with pytest.raises(ValueError, match=f"missing key '{key}'"):
        decode_line(raw_line(missing))
    with pytest.raises(ValueError, match=f"'{key}' must be"):
        decode_line(raw_line({**entry, key: WRONG[key]}))


@pytest.mark.anyio
async def test_an_error_in_on_commit_ends_run_and_close_reports_it(tmp_path: Path) -> None:
    def on_commit(entries: list[JournalEntry], end_offset: int) -> None:
        raise RuntimeError("counter bug")

    writer = JournalWriter(tmp_path / "j", Storage(), next_seq=1, on_commit=on_commit)
    failures: list[RuntimeError] = []
    try:
        await write_all(writer, [result(1)])
    except* RuntimeError as group:
        failures = [exc for exc in group.exceptions if isinstance(exc, RuntimeError)]
    assert [str(exc) for exc in failures] == ["counter bug"]


@pytest.mark.anyio
async def test_the_writer_keeps_the_digest_and_rows_of_what_it_committed(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    seen: list[tuple[int, int]] = []

    def on_commit(entries: list[JournalEntry], end_offset: int) -> None:
        prefix = writer.prefix()
        assert prefix is not None and prefix.offset == end_offset  # in step with what is reported
        seen.append((prefix.seq, prefix.offset))

    writer = JournalWriter(
        path, Storage(), next_seq=1, on_commit=on_commit, max_rows=2, state=JournalState.empty(20)
    )
    await write_all(writer, [result(n) for n in (3, 1, 7, 10, 9)])  # row 10 fails
    prefix = writer.prefix()
    assert prefix is not None and [seq for seq, _ in seen] == [2, 4, 5]
    assert (prefix.seq, prefix.offset, prefix.ok) == (5, path.stat().st_size, 4)
    assert prefix.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert set(range(1, 21)) - set(RowSet.from_bytes(20, prefix.done_rows).missing()) == {1, 3, 7, 9, 10}

    scan = scan_journal(path, committed_seq=5, committed_offset=prefix.offset, row_count=20, prefix=prefix)
    second = JournalWriter(path, Storage(), next_seq=6, on_commit=Commits(), state=scan.writer_state())
    await write_all(second, [result(11), result(15)])
    after = second.prefix()
    assert after is not None and (after.seq, after.ok) == (7, 5)
    assert after.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(scan.done) == 5  # the scan's rows are not the writer's to change


@pytest.mark.anyio
async def test_a_state_that_does_not_describe_the_file_keeps_no_prefix(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(encode_line(1, result(1)))
    writer = JournalWriter(path, Storage(), next_seq=2, on_commit=Commits(), state=JournalState.empty(5))
    await write_all(writer, [result(2)])
    assert writer.prefix() is None
    assert JournalWriter(path, Storage(), next_seq=3, on_commit=Commits()).prefix() is None


def test_the_entry_constructor_sets_exactly_the_declared_fields() -> None:
    """`JournalEntry.__init__` is written out for speed: it must name every field, in field order."""
    names = [field.name for field in dataclasses.fields(JournalEntry)]
    values: dict[str, Any] = {name: f"v-{name}" for name in names}
    entry = JournalEntry(**values)
    assert list(vars(entry)) == names
    assert [getattr(entry, name) for name in names] == list(values.values())
    assert list(inspect.signature(JournalEntry).parameters) == names
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.success = False  # type: ignore[misc]


def test_the_positional_constructor_builds_the_same_entry() -> None:
    """`entry_of` is the senders' constructor: its parameters are the fields, in field order."""
    names = [field.name for field in dataclasses.fields(JournalEntry)]
    values: list[Any] = [f"v-{name}" for name in names]
    assert list(inspect.signature(entry_of).parameters) == names
    built = entry_of(*values)
    assert type(built) is JournalEntry
    assert built == JournalEntry(**dict(zip(names, values, strict=True)))
    assert list(vars(built)) == names
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.success = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("row_number", "1", "'row_number' must be int, got str"),
        ("success", 1, "'success' must be bool, got int"),
        ("status_code", True, "'status_code' must be int or null, got bool"),
        ("attempts", 1.0, "'attempts' must be int, got float"),
        ("duration_ms", None, "'duration_ms' must be float or int, got NoneType"),
        ("latency_ms", "3", "'latency_ms' must be float or int or null, got str"),
        ("idempotency_key", 7, "'idempotency_key' must be null or str, got int"),
        ("captured", "x", "'captured' must be dict or null, got str"),
        ("response_body", {}, "'response_body' must be null or str, got dict"),
        ("digest", 1.5, "'digest' must be null or str, got float"),
    ],
)
def test_a_line_of_this_version_with_a_wrong_type_is_refused(name: str, value: object, reason: str) -> None:
    """Lines with every key in the writer's order take the fast shape check: it refuses what
    `entry_problem` refuses, and the reason is still the field's."""
    line = encode_line(1, result(2, **{name: value}))
    with pytest.raises(ValueError, match=re.escape(reason)):
        decode_line(line)
