"""examples/batching/ runs against the embedded target: each row's own outcome, as docs/batching.md says."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bulkrelay.demo.target import start_target
from tests.relay.batchrun import run_batch_job

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "batching"
# Row 42's email is bogus (the target refuses it), row 77 is busy (Elasticsearch answers it 429 once),
# row 150 is poisoned (the plain array endpoint refuses any batch holding it).
EXPECTED_FAILED = {"hubspot": {42}, "elasticsearch": {42}, "braze": {42}, "array": {150}}
REQUESTS_AT_LEAST = {"hubspot": 3, "elasticsearch": 4, "braze": 4, "array": 5}

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("name", sorted(EXPECTED_FAILED))
async def test_each_example_runs_against_the_demo_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    for source in EXAMPLES.iterdir():
        shutil.copy(source, tmp_path / source.name)
    target = await start_target()
    monkeypatch.setenv("TARGET_URL", target.url)
    monkeypatch.setenv("API_TOKEN", "demo-token")
    try:
        result = await run_batch_job(tmp_path / f"{name}.yaml", target)
    finally:
        await target.stop()
    rows = result.by_row()
    assert sorted(rows) == list(range(1, 251))
    assert {n for n, e in rows.items() if not e.success} == EXPECTED_FAILED[name]
    assert len(result.requests) >= REQUESTS_AT_LEAST[name]
    if name == "elasticsearch":
        assert rows[77].attempts == 2 and rows[77].success
    if name == "hubspot":
        assert rows[1].captured is not None and rows[1].captured["remote_id"] is not None
