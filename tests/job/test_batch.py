"""request.batch and response.items in the job file, and each row's item (job/batch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.errors import ConfigInvalid, InputInvalid
from bulkrelay.job.batch import BatchRenderer, batch_key
from bulkrelay.job.config import config_semantic_dict, load_job, parse_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import Record
from bulkrelay.job.request import RequestRenderer

BATCH_JOB: dict[str, Any] = {
    "version": 1,
    "input": {"file": "rows.csv", "key": "id"},
    "request": {
        "method": "POST",
        "url": "http://127.0.0.1:9/crm/batch/upsert",
        "headers": {"X-Source": "nightly"},
        "idempotency_key": {"header": "Idempotency-Key"},
        "batch": {
            "max_items": 3,
            "items_at": "/inputs",
            "envelope": {"allOrNone": {"value": False}},
            "item": {"id": {"from": "email"}, "objectWriteTraceId": {"meta": "item_id"}},
        },
    },
    "response": {"items": {"mode": "by_id", "results": "/results", "id": "/objectWriteTraceId"}},
}


def _job(**changes: Any) -> dict[str, Any]:
    job: dict[str, Any] = orjson.loads(orjson.dumps(BATCH_JOB))
    job.update(orjson.loads(orjson.dumps(changes)))  # each section given replaces the job's
    return job


def _problems(job: dict[str, Any]) -> str:
    with pytest.raises(ConfigInvalid) as caught:
        parse_job(yaml.safe_dump(job), file="job.yaml")
    return str(caught.value)


def test_a_field_in_the_url_or_a_header_of_a_batch_job_is_refused_naming_it() -> None:
    url = _job(request={**BATCH_JOB["request"], "url": "http://127.0.0.1:9/crm/{id}/upsert"})
    assert "request.url uses {id}" in _problems(url)
    header = _job(request={**BATCH_JOB["request"], "headers": {"X-Tenant": "t-{tenant}"}})
    assert "request.headers.X-Tenant uses {tenant}" in _problems(header)
    query = _job(request={**BATCH_JOB["request"], "query": {"since": "{updated}"}})
    assert "request.query.since uses {updated}" in _problems(query)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"request": {**BATCH_JOB["request"], "json": {"a": {"from": "id"}}}}, "request.json and request"),
        ({"request": {**BATCH_JOB["request"], "method": "GET"}}, "not GET"),
        ({"response": {"items": {"mode": "positional"}}}, "mode positional needs results"),
        ({"response": {"items": {"mode": "by_index", "errors": "/e"}}}, "mode by_index needs index"),
        ({"response": {"items": {"mode": "whole", "results": "/r"}}}, "mode whole does not read results"),
        (
            {"request": {**BATCH_JOB["request"], "batch": {"max_items": 2, "envelope": {"a": {"value": 1}},
                                                           "item": {"a": {"from": "id"}}}}},
            "envelope needs items_at",
        ),
        (
            {"request": {**BATCH_JOB["request"], "batch": {"max_items": 2, "items_at": "/x",
                                                           "envelope": {"a": {"from": "id"}},
                                                           "item": {"a": {"from": "id"}}}}},
            "must be a {value: ...}",
        ),
        (
            {"request": {**BATCH_JOB["request"], "batch": {"max_items": 2, "encoding": "ndjson"}}},
            "exactly one of item, item_lines",
        ),
    ],
)  # fmt: skip
def test_incoherent_batch_settings_are_config_errors(change: dict[str, Any], message: str) -> None:
    assert message in _problems(_job(**change))


def test_response_items_without_request_batch_is_refused() -> None:
    job = _job(request={k: v for k, v in BATCH_JOB["request"].items() if k != "batch"})
    job["request"]["url"] = "http://127.0.0.1:9/v1/{id}"
    job["request"]["json"] = {"id": {"from": "id"}}
    assert "response.items reads a batch's answer: it needs request.batch" in _problems(job)


def test_a_job_without_batch_keeps_its_fingerprint_keys() -> None:
    job = _job(request={k: v for k, v in BATCH_JOB["request"].items() if k != "batch"}, response={})
    job["request"]["json"] = {"id": {"from": "id"}}
    data = config_semantic_dict(parse_job(yaml.safe_dump(job), file="job.yaml"))
    assert "batch" not in data["request"]
    assert "items" not in data["response"] and "on_batch_rejected" not in data["response"]


def _renderer(job: dict[str, Any], fingerprint: str = "f" * 64) -> BatchRenderer:
    config = parse_job(yaml.safe_dump(job), file="job.yaml")
    batcher = BatchRenderer.of_job(config, RequestRenderer.from_config(config.request, {}), fingerprint)
    assert batcher is not None
    return batcher


def test_an_items_id_is_stable_and_follows_its_content() -> None:
    batcher = _renderer(BATCH_JOB)
    first = batcher.item(Record(1, 2, {"id": "1", "email": "a@example.com"}))
    again = _renderer(BATCH_JOB).item(Record(1, 2, {"id": "1", "email": "a@example.com"}))
    changed = batcher.item(Record(1, 2, {"id": "1", "email": "b@example.com"}))
    assert first.item_id == again.item_id != changed.item_id
    assert orjson.loads(first.data) == {"id": "a@example.com", "objectWriteTraceId": first.item_id}
    other_job = _renderer(BATCH_JOB, fingerprint="e" * 64).item(
        Record(1, 2, {"id": "1", "email": "a@example.com"})
    )
    assert other_job.item_id != first.item_id


def test_a_batch_request_is_exactly_sized_and_keyed_by_its_items() -> None:
    batcher = _renderer(BATCH_JOB)
    items = [batcher.item(Record(n, n + 1, {"id": str(n), "email": f"u{n}@example.com"})) for n in (1, 2, 3)]
    request, key = batcher.request(items)
    assert request.body is not None
    assert len(request.body) == batcher.size(3, sum(len(i.data) for i in items))
    assert orjson.loads(request.body) == {"allOrNone": False, "inputs": [orjson.loads(i.data) for i in items]}
    assert ("Idempotency-Key", key) in request.headers and (
        "Content-Type",
        "application/json",
    ) in request.headers
    assert key == batch_key([i.item_id for i in items]) != batch_key([i.item_id for i in reversed(items)])
    assert batcher.request(items)[1] == key


def test_ndjson_item_lines_are_one_line_each() -> None:
    job = _job(request={**BATCH_JOB["request"], "batch": {
        "max_items": 2, "encoding": "ndjson",
        "item_lines": [{"index": {"_id": {"from": "id"}}}, {"email": {"from": "email"}}],
    }})  # fmt: skip
    batcher = _renderer(job)
    items = [batcher.item(Record(n, n + 1, {"id": str(n), "email": f"u{n}@x"})) for n in (1, 2)]
    request, _ = batcher.request(items)
    assert (
        request.body == b'{"index":{"_id":"1"}}\n{"email":"u1@x"}\n{"index":{"_id":"2"}}\n{"email":"u2@x"}\n'
    )
    assert ("Content-Type", "application/x-ndjson") in request.headers


def test_preflight_refuses_a_row_whose_item_alone_is_over_max_bytes(tmp_path: Path) -> None:
    job = _job(request={**BATCH_JOB["request"], "batch": {**BATCH_JOB["request"]["batch"], "max_bytes": 200}})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    (tmp_path / "rows.csv").write_text(
        f"id,email\n1,a@example.com\n2,{'b' * 300}@example.com\n3,c@example.com\n"
    )
    with pytest.raises(InputInvalid) as caught:
        run_preflight(load_job(tmp_path / "job.yaml"), None)
    [problem] = caught.value.problems
    assert (problem.row, problem.line, problem.field) == (2, 3, "email")
    assert "over request.batch.max_bytes 200" in problem.message


def test_items_at_may_nest_in_the_envelope_but_not_over_one_of_its_values() -> None:
    nested = _job(request={**BATCH_JOB["request"], "batch": {
        "max_items": 2, "items_at": "/data/inputs", "envelope": {"data": {"mode": {"value": "upsert"}}},
        "item": {"id": {"from": "id"}},
    }})  # fmt: skip
    batcher = _renderer(nested)
    request, _ = batcher.request([batcher.item(Record(1, 2, {"id": "7"}))])
    assert orjson.loads(request.body or b"") == {"data": {"mode": "upsert", "inputs": [{"id": "7"}]}}
    clash = _job(request={**BATCH_JOB["request"], "batch": {
        "max_items": 2, "items_at": "/data", "envelope": {"data": {"value": 1}},
        "item": {"id": {"from": "id"}},
    }})  # fmt: skip
    with pytest.raises(ConfigInvalid, match="items_at /data: the envelope already has a value there"):
        _renderer(clash)
