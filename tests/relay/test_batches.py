"""Batch mode against the embedded target's four shapes: each row's own journaled outcome."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bulkrelay.demo.target import start_target
from tests.relay.batchrun import run_batch_job, write_batch_job

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
