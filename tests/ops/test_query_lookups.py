"""A query lookup's edges through the real CLI (`validate`, `render`: nothing is sent): a query that
does not return exactly two columns is a config error naming the lookup's query; a NULL key matches
nothing, never a record's text `null`; a value with no JSON form is refused without a traceback on
stderr (a query input's too), and a query that would write is refused naming the lookup's field."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest
import yaml

from bulkrelay.errors import ExitCode
from tests.clirun import run_cli
from tests.jobfiles import write_csv

pytestmark = pytest.mark.slow  # real processes

_QUERY_LINE = 8  # where _job writes lookups.m.query


def _job(tmp_path: Path, query: str) -> Path:
    with sqlite3.connect(tmp_path / "lk.db") as db:
        db.execute("CREATE TABLE t (k TEXT, v INTEGER)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [("a", 1), (None, 2), ("b", 3)])
    db.close()
    write_csv(
        tmp_path / "in.csv", [{"id": "1", "ref": "a"}, {"id": "2", "ref": "null"}, {"id": "3", "ref": "b"}]
    )
    path = tmp_path / "job.yaml"
    job = {
        "version": 1,
        "name": "contacts",
        "input": {"file": "in.csv", "key": "id"},
        "lookups": {"m": {"query": query, "database": "sqlite:///lk.db"}},
        "request": {
            "method": "POST",
            "url": "http://127.0.0.1:9/contacts/{id}",
            "json": {"v": {"lookup": "m", "key": {"from": "ref"}, "on_miss": "null"}},
        },
    }
    path.write_text(yaml.safe_dump(job, sort_keys=False, width=200))
    assert path.read_text().splitlines()[_QUERY_LINE - 1].strip().startswith("query:")
    return path


@pytest.mark.parametrize(
    "query", ["SELECT k FROM t", "SELECT k, v, v + 1 AS w FROM t", "SELECT k FROM t WHERE 0"]
)
def test_a_lookup_query_without_two_columns_is_a_config_error_naming_it(tmp_path: Path, query: str) -> None:
    refused = run_cli("validate", _job(tmp_path, query), cwd=tmp_path)
    assert refused.exit_code == ExitCode.ARG_ERROR, refused.envelope
    assert refused.error_code == "CONFIG_INVALID"
    [problem] = refused.envelope["error"]["context"]["problems"]
    assert (problem["file"], problem["line"], problem["path"]) == (
        str(tmp_path / "job.yaml"),
        _QUERY_LINE,
        "lookups.m.query",
    )
    assert "it must return exactly 2 columns: the key, then the value" in problem["message"]


def test_a_null_key_matches_nothing_not_even_the_text_null(tmp_path: Path) -> None:
    rendered = run_cli("render", _job(tmp_path, "SELECT k, v FROM t"), cwd=tmp_path)
    assert rendered.exit_code == 0, rendered.envelope
    sent = [orjson.loads(request["body"])["v"] for request in rendered.data["requests"]]
    assert sent == [1, None, 3]  # row 2's `null` is text: the NULL key's value 2 is no one's


def test_a_lookup_value_with_no_json_form_is_refused_without_a_traceback(tmp_path: Path) -> None:
    refused = run_cli("validate", _job(tmp_path, "SELECT 1e999 AS x, 2 AS id"), cwd=tmp_path)
    assert refused.error_code == "INPUT_INVALID" and refused.exit_code == ExitCode.ARG_ERROR
    [problem] = refused.envelope["error"]["context"]["problems"]
    assert (problem["row"], problem["field"], problem["path"]) == (1, "x", "lookups.m.query")
    assert refused.stderr == ""


def test_a_query_inputs_value_with_no_json_form_is_refused_without_a_traceback(tmp_path: Path) -> None:
    job = _job(tmp_path, "SELECT k, v FROM t")
    data = yaml.safe_load(job.read_text())
    data["input"] = {"query": "SELECT 1e999 AS x, 2 AS id", "database": "sqlite:///lk.db"}
    job.write_text(yaml.safe_dump(data, sort_keys=False))
    refused = run_cli("validate", job, cwd=tmp_path)
    assert refused.error_code == "INPUT_INVALID", refused.envelope
    assert refused.stderr == ""


def test_a_lookup_query_that_would_write_is_refused_naming_the_lookups_field(tmp_path: Path) -> None:
    refused = run_cli("validate", _job(tmp_path, "DELETE FROM t"), cwd=tmp_path)
    assert refused.error_code == "CONFIG_INVALID", refused.envelope
    [problem] = refused.envelope["error"]["context"]["problems"]
    assert (problem["line"], problem["path"]) == (_QUERY_LINE, "lookups.m.query")
    assert problem["message"].startswith("lookups.m.query must only read")
