"""Batch mode against the embedded target's four shapes: each row's own journaled outcome."""

from __future__ import annotations

import itertools
from functools import partial
from pathlib import Path

import anyio
import orjson
import pytest

from bulkrelay.demo.target import RunningTarget, start_target
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay.engine import StartPoint
from bulkrelay.store.rundir import RunDir
from tests.relay.batchrun import SHAPES, BatchRun, run_batch_job, write_batch_job
from tests.waiting import until

pytestmark = pytest.mark.anyio


async def test_hubspot_207_errors_by_id_fail_only_their_rows(tmp_path: Path) -> None:
    names = [f"user{n}" for n in range(1, 24)]
    names[4] = "bogus5"
    names[16] = "bogus17"
    target = await start_target()
    try:
        job = write_batch_job(tmp_path, target.url, "hubspot", names, max_items=10)
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    rows = result.by_row()
    assert sorted(rows) == list(range(1, 24))
    failed = {n for n, e in rows.items() if not e.success}
    assert failed == {5, 17}
    assert "Property values were not valid: bogus5@example.com" in (rows[5].error or "")
    assert rows[5].classification == "item_rejected" and not rows[5].retryable
    assert [len(orjson.loads(r["body"])["inputs"]) for r in result.requests] == [10, 10, 3]
    print(rows[5], rows[1])


async def test_elasticsearch_bulk_item_429_resends_only_that_item_in_a_request_of_its_batch(
    tmp_path: Path,
) -> None:
    names = [f"user{n}" for n in range(1, 13)]
    names[2] = "busy3"
    names[7] = "bogus8"
    target = await start_target()
    try:
        job = write_batch_job(
            tmp_path,
            target.url,
            "elasticsearch",
            names,
            max_items=5,
            retry={"max_attempts": 3, "initial_backoff_seconds": 0},  # due at once: the next batch
            execution={"concurrency": 1},
        )
        result = await run_batch_job(job, target)
        stats = target.state.stats()
    finally:
        await target.stop()
    rows = result.by_row()
    assert sorted(rows) == list(range(1, 13))
    assert {n for n, e in rows.items() if not e.success} == {8}
    assert rows[8].status_code == 400 and rows[8].classification == "http_client_error"
    assert "mapper_parsing_exception" in (rows[8].error or "") and not rows[8].retryable
    assert rows[3].success and rows[3].attempts == 2 and rows[3].status_code == 201
    assert all(e.attempts == 1 for n, e in rows.items() if n != 3)
    # Each request: NDJSON, two lines an item; row 3 alone was sent twice, the second time in a request
    # of its own: the rows of its batch still pending, never mixed with another batch's (a crash could
    # not form such a mix again under the same Idempotency-Key).
    sent_ids = [
        [orjson.loads(line)["index"]["_id"] for line in r["body"].splitlines()[::2]] for r in result.requests
    ]
    flat = [i for ids in sent_ids for i in ids]
    assert sorted(flat) == sorted([str(n) for n in range(1, 13)] + ["3"])
    second = next(ids for ids in sent_ids[1:] if "3" in ids)
    assert second == ["3"]
    assert all(len(ids) <= 5 for ids in sent_ids)
    assert stats["items_applied_twice"] == [] and stats["distinct_items_applied"] == 11
    assert rows[3].batch is not None and rows[3].batch["index"] == 0


async def test_braze_errors_by_index_fail_only_their_rows(tmp_path: Path) -> None:
    names = [f"user{n}" for n in range(1, 8)]
    names[0] = "bogus1"
    names[6] = "bogus7"
    target = await start_target()
    try:
        job = write_batch_job(tmp_path, target.url, "braze", names, max_items=4)
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    rows = result.by_row()
    assert {n for n, e in rows.items() if not e.success} == {1, 7}
    assert rows[7].error == "item rejected: 'email' is not a valid email"
    assert rows[7].batch == {"seq": rows[5].batch["seq"] if rows[5].batch else 0, "index": 2, "size": 3}
    assert [len(orjson.loads(r["body"])["attributes"]) for r in result.requests] == [4, 3]


async def test_plain_array_400_splits_down_to_the_bad_row_alone(tmp_path: Path) -> None:
    names = [f"user{n}" for n in range(1, 9)]
    names[5] = "poison6"
    target = await start_target()
    try:
        job = write_batch_job(tmp_path, target.url, "array", names, max_items=8)
        result = await run_batch_job(job, target)
        stats = target.state.stats()
    finally:
        await target.stop()
    rows = result.by_row()
    assert sorted(rows) == list(range(1, 9))
    assert {n for n, e in rows.items() if not e.success} == {6}
    assert rows[6].status_code == 400 and rows[6].batch is not None and rows[6].batch["size"] == 1
    assert "one of the items is invalid" in (rows[6].response_body or "")
    sizes = [len(orjson.loads(r["body"])) for r in result.requests]
    assert sizes == [8, 4, 4, 2, 1, 1, 2]  # 8 → halves; the bad half → pairs; the bad pair → singles
    assert stats["distinct_items_applied"] == 7 and stats["items_applied_twice"] == []


async def test_fail_all_fails_every_row_of_a_rejected_batch_but_a_413_still_splits(tmp_path: Path) -> None:
    names = [f"user{n}" for n in range(1, 7)]
    names[1] = "poison2"
    target = await start_target({"batch": {"max_items": 3}})
    try:
        job = write_batch_job(
            tmp_path, target.url, "array", names, max_items=6, response={"on_batch_rejected": "fail_all"}
        )
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    rows = result.by_row()
    sizes = [len(orjson.loads(r["body"])) for r in result.requests]
    assert sizes == [6, 3, 3]  # 413: split whatever on_batch_rejected says; then 400: all fail
    assert {n for n, e in rows.items() if not e.success} == {1, 2, 3}
    assert all(rows[n].status_code == 400 for n in (1, 2, 3))


async def test_no_request_crosses_max_items_or_max_bytes(tmp_path: Path) -> None:
    names = [("x" * (n * 7 % 90)) + f"u{n}" for n in range(1, 60)]
    target = await start_target()
    try:
        job = write_batch_job(tmp_path, target.url, "array", names, max_items=9, batch={"max_bytes": 700})
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    assert len(result.entries) == 59 and all(e.success for e in result.entries)
    bodies = [r["body"].encode() for r in result.requests]
    assert max(len(b) for b in bodies) <= 700
    assert max(len(orjson.loads(b)) for b in bodies) <= 9
    # closed before the row that would cross: adding the next row's item would have crossed a limit
    items = [orjson.loads(b) for b in bodies]
    for batch, following in itertools.pairwise(items):
        grown = orjson.dumps([*batch, following[0]])
        assert len(batch) == 9 or len(grown) > 700
    # input order, every row once
    assert [item["id"] for batch in items for item in batch] == [str(n) for n in range(1, 60)]


async def test_the_journal_commits_a_requests_rows_together(tmp_path: Path) -> None:
    names = [f"user{n}" for n in range(1, 31)]
    target = await start_target()
    try:
        job = write_batch_job(tmp_path, target.url, "hubspot", names, max_items=7)
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    by_seq: dict[int, list[int]] = {}
    for line_seq, entry in enumerate(result.entries, start=1):
        assert entry.batch is not None
        by_seq.setdefault(entry.batch["seq"], []).append(line_seq)
        assert entry.batch["size"] in (7, 2)
    # a batch's seq is its first line's; its lines follow each other
    for seq, lines in by_seq.items():
        assert lines == list(range(seq, seq + len(lines)))
    assert sorted(len(lines) for lines in by_seq.values()) == [2, 7, 7, 7, 7]


@pytest.mark.parametrize(
    ("shape", "body", "repeat", "reason"),
    [
        ("hubspot", '{"status":"COMPLETE","results":[{"objectWriteTraceId":', 1, "not JSON"),
        ("hubspot", '{"results":[{"objectWriteTraceId":"never-sent"}]}', 1, "'never-sent'"),
        ("hubspot", '{"status":"COMPLETE"}', 1, "neither /results nor /errors"),
        ("elasticsearch", '{"items":[{"index":{"status":201}}]}', 1, "/items has 1 entries for 4 items"),
        ("elasticsearch", '{"items":[{"index":{"status":"ok"}}]}', 4, "not JSON"),
        ("braze", '{"errors":[{"index":9}]}', 1, "names position 9"),
        ("braze", "x" * 1000, 10_500, "cut short"),  # a 10 MB answer: the transport reads 1 MiB of it
    ],
)
async def test_a_hostile_answer_fails_the_batchs_rows_clearly_and_loses_none(
    tmp_path: Path, shape: str, body: str, repeat: int, reason: str
) -> None:
    rule = {"match": {"method": "POST"}, "status": 200, "body": body, "repeat": repeat}
    target = await start_target({"rules": [rule]})
    try:
        job = write_batch_job(tmp_path, target.url, shape, [f"user{n}" for n in range(1, 5)], max_items=4)
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    assert sorted(e.row_number for e in result.entries) == [1, 2, 3, 4]
    for entry in result.entries:
        assert not entry.success and entry.retryable, entry
        assert entry.classification == "batch_answer_invalid"
        assert entry.error is not None and entry.error.startswith("batch answer invalid: ")
        assert reason in entry.error, entry.error
        assert entry.response_body is not None and len(entry.response_body) <= 2048
    assert len(result.requests) == 1  # never resent by itself: the target may have applied it


async def test_an_answer_echoing_a_secret_is_kept_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCH_TOKEN", "s3cr3t-token-value")
    rule = {
        "match": {"method": "POST"},
        "status": 200,
        "echo_header": "Authorization",
        "body": '{"e":"{echo}"',
    }
    target = await start_target({"rules": [rule]})
    try:
        job = write_batch_job(
            tmp_path,
            target.url,
            "hubspot",
            ["user1", "user2"],
            request={"headers": {"Authorization": "Bearer ${BATCH_TOKEN}"}},
        )
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    journal = result.run.journal_path.read_bytes()
    assert b"s3cr3t-token-value" not in journal
    assert all("***" in (e.response_body or "") for e in result.entries)


async def test_a_whole_request_503_resends_the_same_batch_and_counts_attempts_per_row(tmp_path: Path) -> None:
    target = await start_target({"rules": [{"match": {"method": "POST"}, "status": 503, "times": 2}]})
    try:
        job = write_batch_job(
            tmp_path,
            target.url,
            "hubspot",
            [f"user{n}" for n in range(1, 6)],
            max_items=5,
            retry={"max_attempts": 3},
            execution={"concurrency": 1},
        )
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    assert [r["status"] for r in result.requests] == [503, 503, 200]
    assert len({r["idempotency_key"] for r in result.requests}) == 1
    assert len({r["body"] for r in result.requests}) == 1
    assert all(e.success and e.attempts == 3 for e in result.entries)


async def test_a_401_halts_the_run_and_leaves_the_batchs_rows_pending(tmp_path: Path) -> None:
    target = await start_target({"rules": [{"match": {"method": "POST"}, "after": 1, "status": 401}]})
    try:
        job = write_batch_job(
            tmp_path, target.url, "hubspot", [f"user{n}" for n in range(1, 10)], max_items=3,
            execution={"concurrency": 1},
        )  # fmt: skip
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    assert result.outcome.stop_reason is not None and result.outcome.stop_reason.value == "halt_auth"
    assert sorted(e.row_number for e in result.entries) == [1, 2, 3]  # the 401's rows are not journaled


async def test_consecutive_failures_count_requests_not_rows(tmp_path: Path) -> None:
    target = await start_target({"rules": [{"status": 503}]})
    try:
        job = write_batch_job(
            tmp_path, target.url, "hubspot", [f"user{n}" for n in range(1, 13)], max_items=4,
            execution={"concurrency": 1}, halt={"consecutive_failures": 2},
        )  # fmt: skip
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    # Two requests (of four rows each) failed in a row: the run halts, their rows stay pending.
    assert result.outcome.stop_reason is not None and result.outcome.stop_reason.value == "halt_unavailable"
    assert result.outcome.stop_detail["message"] == "HTTP 503"  # what the halt's error quotes
    assert len(result.requests) == 2
    assert result.entries == []


async def test_a_whole_answers_rows_are_journaled_each_with_its_own_fields(tmp_path: Path) -> None:
    """A `whole` success builds its rows from one template (relay/batchsender.py): each line must still
    carry the row's own number, key, item id, place and duration, and the values a single row's path
    gives (checked against the same run with `response.capture`, which takes that path)."""
    from bulkrelay.job.config import load_job
    from bulkrelay.job.inputs import open_records
    from bulkrelay.job.preflight import run_preflight

    names = [f"user{n}" for n in range(1, 24)]
    (tmp_path / "plain").mkdir()
    (tmp_path / "captured").mkdir()
    target = await start_target()
    try:
        job = write_batch_job(tmp_path / "plain", target.url, "array", names, max_items=5)
        plain = await run_batch_job(job, target)
        capture = {"capture": {"x": "/x"}}
        other_dir = tmp_path / "captured"
        other = write_batch_job(other_dir, target.url, "array", names, max_items=5, response=capture)
        captured = await run_batch_job(other, target)
    finally:
        await target.stop()
    preflight = run_preflight(load_job(job), None)
    assert preflight.batcher is not None
    with open_records(preflight.input_spec, lambda problem: None) as records:
        ids = {record.row_number: preflight.batcher.item(record).item_id for record in records}
    # Batches are answered by several workers: the journal's order is theirs, each batch's rows in order.
    entries = sorted(plain.entries, key=lambda entry: entry.row_number)
    assert [entry.row_number for entry in entries] == list(range(1, 24))
    assert [entry.key for entry in entries] == [str(n) for n in range(1, 24)]
    assert [entry.idempotency_key for entry in entries] == [ids[n] for n in range(1, 24)]
    assert [entry.batch["index"] if entry.batch else None for entry in entries] == [n % 5 for n in range(23)]
    assert len({id(entry.batch) for entry in entries}) == 23  # each row its own: seq is set in place
    assert all(entry.duration_ms >= entry.latency_ms for entry in entries if entry.latency_ms is not None)
    general = {entry.row_number: vars(entry) for entry in captured.entries}
    varying = {"duration_ms", "latency_ms", "captured", "idempotency_key", "batch"}

    def alike(fields: dict[str, object]) -> dict[str, object]:
        return {name: value for name, value in fields.items() if name not in varying}

    for entry in entries:
        assert alike(vars(entry)) == alike(general[entry.row_number])
        assert list(vars(entry)) == list(general[entry.row_number])  # the line's key order


async def test_a_409_to_a_key_still_in_progress_is_waited_out_under_that_key_never_split(
    tmp_path: Path,
) -> None:
    """A target keeping keys (IETF Idempotency-Key draft, Stripe) answers 409 while a key's first request
    is still being processed. The batch is slower than read_seconds: its retry meets the 409. Split
    into halves under new keys, 40 items were applied 120 times and every row journaled as failed."""
    plan = {"dedup": True, "in_progress_status": 409, "batch": {"delay_ms": 600_000}}  # until released
    target = await start_target(plan)
    try:
        job = write_batch_job(
            tmp_path,
            target.url,
            "hubspot",
            [f"user{n}" for n in range(1, 41)],
            max_items=40,
            retry={"max_attempts": 3, "initial_backoff_seconds": 0.3, "max_backoff_seconds": 0.6},
            execution={"concurrency": 1, "timeout": {"read_seconds": 0.4}},
        )
        result = await _released_after_a_409(job, target, StartPoint())
        stats = target.state.stats()
    finally:
        await target.stop()
    assert stats["items_applied_twice"] == [] and stats["distinct_items_applied"] == 40
    assert len({r["idempotency_key"] for r in result.requests}) == 1  # never split into new keys
    assert 409 in {r["status"] for r in result.requests}
    assert all(e.success for e in result.entries) and len(result.entries) == 40


@pytest.mark.parametrize("continued", [True, False])
async def test_a_409_to_a_batchs_first_send_after_an_earlier_call_sent_it_is_waited_out_if_the_run_continues(
    tmp_path: Path, continued: bool
) -> None:
    """An earlier call sent the batch and ended (cancelled here; a kill -9 leaves the same) while the
    target still processed it. Continuing the run, the 409 to the batch's first send in this call is
    that send in progress: waited out under its key. In a new run it is a refusal, split under new keys,
    which applies the items a second time: what a continued run must never do."""
    target = await start_target({"dedup": True, "in_progress_status": 409, "batch": {"delay_ms": 600_000}})
    try:
        names = [f"user{n}" for n in range(1, 5)]
        job = write_batch_job(
            tmp_path,
            target.url,
            "hubspot",
            names,
            max_items=4,
            execution={"concurrency": 1},
            retry={"initial_backoff_seconds": 0.3, "max_backoff_seconds": 0.8},
        )
        async with anyio.create_task_group() as earlier:
            earlier.start_soon(partial(run_batch_job, job, target, run=_new_run(job, "earlier")))
            await until(lambda: target.state.stats()["requests"], "the earlier call's batch held")
            earlier.cancel_scope.cancel()
        start = StartPoint(journaled_through=0) if continued else StartPoint()
        result = await _released_after_a_409(job, target, start)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert 409 in {r["status"] for r in result.requests}
    if continued:
        assert stats["items_applied_twice"] == [] and all(e.success for e in result.entries), result.entries
        assert (
            len({r["idempotency_key"] for r in result.requests}) == 1
        )  # the earlier call's key, never split
    else:
        assert stats["items_applied_twice"] != []


async def _released_after_a_409(job: Path, server: RunningTarget, start: StartPoint) -> BatchRun:
    """The call, its batches held by the target until it met a 409, then answered (the earlier call's
    too) as they come: released every 50 ms until the call ends."""
    results: list[BatchRun] = []

    async def call() -> None:
        results.append(await run_batch_job(job, server, start=start))

    async with anyio.create_task_group() as calls:
        calls.start_soon(call)
        await until(lambda: server.state.stats()["by_status"].get("409"), "a 409 to the batch in progress")
        while not results:
            server.state.release()
            await anyio.sleep(0.05)
    return results[0]


def _new_run(job: Path, name: str) -> RunDir:
    return RunDir.create(job.parent / name, plan_for(run_preflight(load_job(job), None)))


async def test_a_409_to_a_batchs_first_send_is_its_4xx_and_splits(tmp_path: Path) -> None:
    """A key never sent before cannot be in progress: a 409 to it is the batch's refusal, bisected."""
    plan = {"rules": [{"match": {"body_contains": "poison"}, "status": 409}]}
    target = await start_target(plan)
    try:
        names = [f"user{n}" for n in range(1, 5)]
        names[2] = "poison3"
        job = write_batch_job(tmp_path, target.url, "array", names, max_items=4)
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    rows = result.by_row()
    assert {n for n, e in rows.items() if not e.success} == {3}
    assert rows[3].status_code == 409 and rows[3].attempts == 3  # the batch, its half, itself


async def test_an_elasticsearch_answer_of_6000_items_is_read_whole(tmp_path: Path) -> None:
    """~190 bytes an item: 6,000 items answer over 1 MiB. Read with a fixed 1 MiB cap, every row failed
    though all were applied (and `retry-failed` applied them all again). The cap grows with the batch."""
    target = await start_target({"batch": {"max_items": 10_000}})
    try:
        names = [f"user{n}" for n in range(1, 6001)]
        job = write_batch_job(
            tmp_path, target.url, "elasticsearch", names, max_items=6000, batch={"max_bytes": 2_000_000}
        )
        result = await run_batch_job(job, target)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert len(result.requests) == 1 and stats["distinct_items_applied"] == 6000
    assert all(e.success for e in result.entries) and len(result.entries) == 6000


async def test_item_statuses_are_judged_by_their_own_list_not_the_answers(tmp_path: Path) -> None:
    """`success_statuses: [200]` for Elasticsearch's 200 answer failed every item created (201)."""
    target = await start_target()
    try:
        names = [f"user{n}" for n in range(1, 5)]
        names[1] = "bogus2"
        job = write_batch_job(
            tmp_path, target.url, "elasticsearch", names, max_items=4, response={"success_statuses": [200]}
        )
        default = await run_batch_job(job, target)
        items = {**SHAPES["elasticsearch"]["response"]["items"], "success_statuses": [200]}
        only_200 = {"success_statuses": [200], "items": items}
        job = write_batch_job(tmp_path, target.url, "elasticsearch", names, max_items=4, response=only_200)
        own = await run_batch_job(job, target)
    finally:
        await target.stop()
    assert {n for n, e in default.by_row().items() if not e.success} == {2}  # items: any 2xx by default
    assert all(e.status_code == 201 for n, e in default.by_row().items() if n != 2)
    assert not any(e.success for e in own.by_row().values())  # their own list: 201 is not in it
    assert own.by_row()[1].classification == "http_unexpected"


async def test_gzip_batches_are_counted_by_their_compressed_bytes_and_inflated_by_the_target(
    tmp_path: Path,
) -> None:
    names = [f"user{n}" for n in range(1, 201)]
    target = await start_target()
    try:
        plain = write_batch_job(
            tmp_path, target.url, "array", names, max_items=200, batch={"max_bytes": 1500}
        )
        unzipped = await run_batch_job(plain, target)
        target.state.reset()
        job = write_batch_job(
            tmp_path, target.url, "array", names, max_items=200, batch={"max_bytes": 1500},
            request={"compression": "gzip"},
        )  # fmt: skip
        zipped = await run_batch_job(job, target)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert all(e.success for e in zipped.entries) and len(zipped.entries) == 200
    assert stats["distinct_items_applied"] == 200 and stats["items_applied_twice"] == []
    for request in zipped.requests:
        headers = {name.lower(): value for name, value in request["headers"].items()}
        assert headers["content-encoding"] == "gzip"
        assert int(headers["content-length"]) <= 1500 < len(request["body"])  # the inflated body is larger
    assert len(zipped.requests) < len(unzipped.requests)  # more items fit a request
