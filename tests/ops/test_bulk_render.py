"""`render` of a bulk job shows each job as the request that carries its CSV, for each kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bulkrelay.job.config import load_job
from bulkrelay.ops.preview import render
from bulkrelay.ops.results import RenderResult
from tests.relay.bulkrun import GENERIC_STEPS, write_bulk_job

BASE = "http://127.0.0.1:9"
UPLOAD = {"method": "POST", "path": "/uploads/{job}"}
GENERIC = {
    "kind": "generic",
    "steps": {**GENERIC_STEPS, "upload": UPLOAD},
    "object": "-",
    "operation": "insert",
    "external_id_field": None,
}


@pytest.mark.parametrize(
    ("kind", "method", "url"),
    [
        ({}, "PUT", f"{BASE}/services/data/v62.0/jobs/ingest/{{job}}/batches"),
        ({"kind": "named_import", "base_url": BASE, "object": "0-1"}, "POST", f"{BASE}/crm/v3/imports"),
        (GENERIC, "POST", f"{BASE}/services/data/v62.0/uploads/{{job}}"),
    ],
)
def test_render_shows_each_job_as_the_request_carrying_its_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: dict[str, Any], method: str, url: str
) -> None:
    monkeypatch.setenv("SF_TOKEN", "tok-123456789")
    job = write_bulk_job(tmp_path, BASE, ["ann", "bob", "cy", "dan", "eve"], **kind)
    data = render(load_job(job), None, "1-5").data
    assert isinstance(data, RenderResult)
    shown = [request.to_data() for request in data.requests]
    assert [r["batch"]["rows"] for r in shown] == [[1, 2, 3, 4], [5]]
    assert {(r["method"], r["url"]) for r in shown} == {(method, url)}
    assert shown[1]["body"] == "External_Id__c,Email\nk5-eve,eve@example.com\n"
    assert all("tok-123456789" not in str(r) for r in shown)
