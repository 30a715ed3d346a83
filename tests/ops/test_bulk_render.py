"""`render` of a bulk job shows each job as the request that carries its CSV, for each kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def test_render_shows_a_json_upload_as_its_json_and_request_auth_as_stars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SF_TOKEN", "tok-123456789")
    monkeypatch.setenv("CLIENT_SECRET", "client-secret-2b")
    upload = {**UPLOAD, "format": "json", "json": {"data": {"kind": "contacts"}}, "rows_at": "/data/rows"}
    kind = {**GENERIC, "steps": {**GENERIC_STEPS, "upload": upload}}
    job = write_bulk_job(tmp_path, BASE, ["ann", "bob", "cy", "dan", "eve"], **kind)
    spec = yaml.safe_load(job.read_text())
    oauth2 = {"token_url": f"{BASE}/oauth/token", "client_id": "c", "client_secret": "${CLIENT_SECRET}"}
    spec["request"] = {"auth": {"oauth2": oauth2}, "bulk_job": spec["request"]["bulk_job"]}
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    data = render(load_job(job), None, "1-5").data
    assert isinstance(data, RenderResult)
    shown = [request.to_data() for request in data.requests]
    assert json.loads(shown[1]["body"]) == {
        "data": {"kind": "contacts", "rows": [{"External_Id__c": "k5-eve", "Email": "eve@example.com"}]}
    }
    headers = dict(shown[1]["headers"])
    assert headers["Content-Type"] == "application/json" and headers["Authorization"] == "Bearer ***"
