"""`from: /a/b` (a JSON pointer into the record) and `when_missing: error | omit | null` in `request.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.errors import ConfigInvalid, InputInvalid
from bulkrelay.job.config import load_job, parse_job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import Record
from bulkrelay.job.request import RenderError, RequestRenderer


def _renderer(json: dict[str, Any]) -> RequestRenderer:
    text = yaml.safe_dump(
        {"version": 1, "request": {"method": "PATCH", "url": "https://a/x/{id}", "json": json}}
    )
    return RequestRenderer.from_config(parse_job(text, file="job.yaml").request, {})


def _body(renderer: RequestRenderer, fields: dict[str, Any]) -> Any:
    body = renderer.render(Record(1, 2, {"id": "1", **fields})).body
    assert body is not None
    return orjson.loads(body)


def test_a_pointer_reaches_nested_fields_and_array_items() -> None:
    renderer = _renderer(
        {
            "city": {"from": "/address/city"},
            "first_tag": {"from": "/tags/0"},
            "odd": {"from": "/we~1ird/ti~0lde"},
            "zip": {"from": "/address/zip", "type": "integer"},
        }
    )
    record = {"address": {"city": "Oslo", "zip": "0150"}, "tags": ["a", "b"], "we/ird": {"ti~lde": 1}}
    assert _body(renderer, record) == {"city": "Oslo", "first_tag": "a", "odd": 1, "zip": 150}


def test_a_pointer_that_leads_nowhere_is_the_rows_error_naming_it() -> None:
    renderer = _renderer({"city": {"from": "/address/city"}})
    records: list[dict[str, Any]] = [{"address": {}}, {"address": "Oslo"}, {}]
    for record in records:
        with pytest.raises(RenderError) as failed:
            renderer.render(Record(1, 2, {"id": "1", **record}))
        assert failed.value.field == "/address/city" and "missing" in failed.value.message


@pytest.mark.parametrize(
    ("when_missing", "expected"),
    [("omit", {"email": "a@x"}), ("null", {"email": "a@x", "phone": None})],
)
def test_when_missing_omits_the_key_or_sends_null(when_missing: str, expected: dict[str, Any]) -> None:
    renderer = _renderer(
        {"email": {"from": "email"}, "phone": {"from": "/contact/phone", "when_missing": when_missing}}
    )
    assert _body(renderer, {"email": "a@x"}) == expected
    assert _body(renderer, {"email": "a@x", "contact": {"phone": "1"}}) == {"email": "a@x", "phone": "1"}
    # a null that is there is sent as null: merge-patch's "delete this field", said by the data
    assert _body(renderer, {"email": "a@x", "contact": {"phone": None}}) == {"email": "a@x", "phone": None}


def test_omit_works_in_nested_objects() -> None:
    renderer = _renderer({"profile": {"nick": {"from": "nick", "when_missing": "omit"}, "v": {"value": 1}}})
    assert _body(renderer, {}) == {"profile": {"v": 1}}


@pytest.mark.parametrize(
    ("leaf", "said"),
    [
        ({"from": "/a~2b"}, "is not a JSON pointer"),
        ({"from": "x", "default": 1, "when_missing": "null"}, "give a default or a when_missing, not both"),
        ({"from": "x", "when_missing": "skip"}, "when_missing"),
    ],
)
def test_leaf_mistakes_are_config_errors(leaf: dict[str, Any], said: str) -> None:
    text = yaml.safe_dump(
        {"version": 1, "request": {"method": "POST", "url": "https://a/", "json": {"k": leaf}}}
    )
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(text, file="job.yaml")
    assert said in str(refused.value.problems)


def test_old_jobs_keep_their_fingerprint_and_when_missing_changes_it() -> None:
    def fingerprint(leaf: dict[str, Any]) -> str:
        text = yaml.safe_dump(
            {"version": 1, "request": {"method": "POST", "url": "https://a/", "json": {"k": leaf}}}
        )
        return config_fingerprint(parse_job(text, file="job.yaml"))

    assert fingerprint({"from": "x"}) == fingerprint({"from": "x", "when_missing": "error"})
    assert fingerprint({"from": "x"}) != fingerprint({"from": "x", "when_missing": "omit"})


def test_preflight_needs_a_pointers_first_field_and_not_an_optional_one(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text('{"id": 1, "address": {"city": "Oslo"}}\n{"id": 2, "address": {}}\n')
    job = {
        "version": 1,
        "input": {"file": "data.jsonl"},
        "request": {
            "method": "PATCH",
            "url": "https://a/x/{id}",
            "json": {"city": {"from": "/address/city"}, "note": {"from": "note", "when_missing": "omit"}},
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    with pytest.raises(InputInvalid) as refused:
        run_preflight(load_job(tmp_path / "job.yaml"), env={})
    problems = refused.value.problems
    assert [(p.row, p.field) for p in problems] == [(2, "/address/city")]  # row 2 only; `note` is optional


def test_when_missing_null_as_a_user_writes_it_in_yaml_sends_null() -> None:
    # Unquoted, YAML reads `null` as null, not the word: a job written from docs/configuration.md said
    # "Input should be 'error', 'omit' or 'null' (got None)" (the tests above write it through safe_dump,
    # which quotes it).
    text = """
version: 1
request:
  method: PATCH
  url: https://a/x/{id}
  json:
    phone: { from: /contact/phone, when_missing: null }
"""
    job = parse_job(text, file="job.yaml")
    quoted = parse_job(text.replace("when_missing: null", 'when_missing: "null"'), file="job.yaml")
    assert config_fingerprint(job) == config_fingerprint(quoted)
    renderer = RequestRenderer.from_config(job.request, {})
    assert _body(renderer, {}) == {"phone": None}
