"""`render` of a batch job shows the batches as a fresh run sends them, secrets redacted."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bulkrelay.demo.target import start_target
from bulkrelay.job.config import load_job
from bulkrelay.ops.preview import render
from bulkrelay.ops.results import RenderResult
from tests.relay.batchrun import run_batch_job, write_batch_job


def test_render_shows_each_batch_as_its_one_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH_TOKEN", "tok-123456789")
    job = write_batch_job(
        tmp_path,
        "http://127.0.0.1:9",
        "hubspot",
        [f"user{n}" for n in range(1, 9)],
        max_items=3,
        request={"headers": {"Authorization": "Bearer ${BATCH_TOKEN}"}},
    )
    result = render(load_job(job), None, "1-7")
    data = result.data
    assert isinstance(data, RenderResult)
    shown = [request.to_data() for request in data.requests]
    assert [r["batch"]["rows"] for r in shown] == [[1, 2, 3], [4, 5, 6], [7]]
    assert [r["row_number"] for r in shown] == [1, 4, 7]
    first = shown[0]
    body = orjson.loads(first["body"])
    assert [item["id"] for item in body["inputs"]] == [
        "user1@example.com",
        "user2@example.com",
        "user3@example.com",
    ]
    assert body["allOrNone"] is False
    assert first["batch"]["bytes"] == len(first["body"].encode())
    headers = dict(first["headers"])
    assert headers["Authorization"] == "Bearer ***"
    assert len(headers["Idempotency-Key"]) == 32
    assert b"tok-123456789" not in orjson.dumps([r for r in shown])


@pytest.mark.anyio
async def test_render_shows_exactly_what_a_fresh_run_sends(tmp_path: Path) -> None:
    target = await start_target()
    try:
        job = write_batch_job(
            tmp_path, target.url, "elasticsearch", [f"user{n}" for n in range(1, 24)], max_items=5,
            batch={"max_bytes": 300}, execution={"concurrency": 1},
        )  # fmt: skip
        shown = render(load_job(job), None, "1-23").data
        result = await run_batch_job(job, target)
    finally:
        await target.stop()
    assert isinstance(shown, RenderResult)
    rendered = [(request.body, dict(request.headers)["Idempotency-Key"]) for request in shown.requests]
    sent = [(r["body"], r["idempotency_key"]) for r in result.requests]
    assert rendered == sent and len(sent) > 23 // 5 + 1  # closed on bytes as well as on items
