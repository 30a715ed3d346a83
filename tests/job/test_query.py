"""Query inputs taken into a snapshot: placeholders, types as docs/inputs.md tables them, and every way a
query can be wrong, against SQLite and a real PostgreSQL on a loopback port."""

from __future__ import annotations

import io
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.errors import ConfigInvalid, InputInvalid, InputUnavailable, UsageError
from bulkrelay.job.config import load_job
from bulkrelay.job.inputs.query import (
    QuerySpec,
    database_of,
    pg_placeholders,
    query_parameters,
    take_snapshot,
)
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.snapshot import passing_snapshot
from tests.pgserver import PASSWORD, PostgresServer


def _spec(url: str, query: str, params: dict[str, Any] | None = None, base: Path = Path("/")) -> QuerySpec:
    return QuerySpec(query, params or {}, database_of(url, {}, base), job_file="job.yaml", query_line=3)


def _rows(spec: QuerySpec) -> list[dict[str, Any]]:
    out = io.BytesIO()
    count = take_snapshot(spec, out)
    lines = out.getvalue().splitlines()
    assert count == len(lines)
    return [orjson.loads(line) for line in lines]


@pytest.fixture
def sqlite_db(tmp_path: Path) -> str:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (id INTEGER, name TEXT, price NUMERIC, data BLOB, ratio REAL)")
        conn.executemany(
            "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
            [(1, "a", "12.50", b"\x00\x01", 0.5), (2, "b:c", None, None, None)],
        )
    conn.close()
    return f"sqlite:///{path}"


def test_placeholders_become_psycopgs_and_quoted_text_stays() -> None:
    sql = (
        "SELECT x::text, ':no', \"a:b\", $q$ :no $q$ FROM t -- :no\n"
        "WHERE a = :since AND b LIKE '5%' AND c % 2 = :n"
    )
    assert pg_placeholders(sql) == (
        "SELECT x::text, ':no', \"a:b\", $q$ :no $q$ FROM t -- :no\n"
        "WHERE a = %(since)s AND b LIKE '5%%' AND c %% 2 = %(n)s"
    )
    assert query_parameters(sql) == {"since", "n"}


def test_the_database_is_named_without_its_credentials(tmp_path: Path) -> None:
    db = database_of(
        "${URL}", {"URL": f"postgresql://u:{PASSWORD}@db.example:6543/shop?sslmode=require"}, tmp_path
    )
    assert (db.kind, db.identity, db.host) == (
        "postgresql",
        "postgresql://db.example:6543/shop",
        "db.example:6543",
    )
    assert PASSWORD not in repr(db)
    lite = database_of("sqlite:///data/app.db", {}, tmp_path)
    assert lite.identity == f"sqlite:///{tmp_path / 'data' / 'app.db'}"
    with pytest.raises(UsageError, match="postgresql:// or sqlite:///"):
        database_of("mysql://x/y", {}, tmp_path)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cr@tpass@127.0.0.1:5432/app",  # libpq reads "tpass@127.0.0.1" as the host
        "postgresql://app:12/tpass@127.0.0.1/app",  # "tpass@127.0.0.1/app" as the database
        "postgresql://app:12?tpass@127.0.0.1/app",
        "postgresql://app:12#tpass@127.0.0.1/app",
        "postgresql://app:tpass@[::1:5432/app",  # an IPv6 bracket left open (was a ValueError: exit 1)
        "postgresql://app:tpass@127.0.0.1:54x32/app",
    ],
)
def test_a_database_url_that_cannot_be_read_safely_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(UsageError) as raised:
        database_of("${DATABASE_URL}", {"DATABASE_URL": url}, Path("/"))
    error = raised.value
    assert error.exit_code == 2 and error.context["field"] == "input.database"
    assert "tpass" not in str(error.to_dict())


def test_an_ipv6_host_is_named_in_brackets() -> None:
    db = database_of("postgresql://app:pw@[fe80::1]:6543/shop", {}, Path("/"))
    assert (db.identity, db.host) == ("postgresql://[fe80::1]:6543/shop", "[fe80::1]:6543")


def test_sqlite_rows_are_read_in_one_read_only_transaction_with_their_types(sqlite_db: str) -> None:
    rows = _rows(_spec(sqlite_db, "SELECT id, name, price, data, ratio FROM t WHERE id >= :low", {"low": 1}))
    assert rows == [
        {"id": 1, "name": "a", "price": 12.5, "data": "AAE=", "ratio": 0.5},
        {"id": 2, "name": "b:c", "price": None, "data": None, "ratio": None},
    ]


@pytest.mark.parametrize(
    ("query", "params", "error", "message"),
    [
        ("DELETE FROM t", {}, ConfigInvalid, "must only read"),
        ("  -- note\n/* x */ insert into t values (3)", {}, ConfigInvalid, "not insert"),
        ("SELECT id, name AS id FROM t", {}, ConfigInvalid, "the column 'id' twice"),
        ("SELECT id FROM t WHERE id = :id", {}, ConfigInvalid, "no value for :id"),
        ("SELECT id FROM t", {"since": 1}, ConfigInvalid, "input.params.since is not used"),
        ("SELECT nope FROM t", {}, InputInvalid, "the query failed: no such column: nope"),
    ],
)
def test_a_query_that_cannot_be_taken_is_refused_naming_why(
    sqlite_db: str, query: str, params: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as raised:
        _rows(_spec(sqlite_db, query, params))
    assert raised.value.context["problems"][0]["path"] == "input.query"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("query", "count"), [("SELECT id FROM t", 1), ("SELECT id, name, price FROM t", 3)])
def test_a_lookups_query_of_other_than_two_columns_is_refused_naming_its_field(
    sqlite_db: str, query: str, count: int
) -> None:
    spec = replace(_spec(sqlite_db, query), field="lookups.m.query", columns=("the key", "the value"))
    with pytest.raises(ConfigInvalid, match=f"returns {count} column.*exactly 2 columns") as raised:
        _rows(spec)
    assert raised.value.problems[0].path == "lookups.m.query"
    assert _rows(replace(spec, query="SELECT name, id FROM t")) == [
        {"name": "a", "id": 1},
        {"name": "b:c", "id": 2},
    ]


def test_a_missing_sqlite_file_is_unavailable_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InputUnavailable, match=r"app\.db: no such file") as raised:
        _rows(_spec(f"sqlite:///{tmp_path}/app.db", "SELECT 1"))
    assert raised.value.exit_code == 12
    suggestion = raised.value.suggestion or ""
    assert "names the SQLite file" in suggestion and "host" not in suggestion  # a file has no host


def test_postgres_types_map_to_json_as_documented(postgres: PostgresServer) -> None:
    query = (
        "SELECT 7::int8 AS id, 12.345::numeric AS price, 1.5::float8 AS ratio, true AS active, 'x' AS name,"
        " '2026-11-01 10:00+02'::timestamptz AS at, '2026-11-01 10:00'::timestamp AS local,"
        " '2026-11-01'::date AS day, '{\"a\": [1, 2.5]}'::jsonb AS doc, '\\x0001'::bytea AS raw,"
        " ARRAY[1, 2] AS ids, ARRAY[1.10]::numeric[] AS prices, NULL::text AS nothing,"
        " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS uid, :since::date AS since"
    )
    (row,) = _rows(_spec(postgres.url(), query, {"since": "2026-10-31"}))
    assert row == {
        "id": 7,
        "price": "12.345",
        "ratio": 1.5,
        "active": True,
        "name": "x",
        "at": "2026-11-01T08:00:00+00:00",
        "local": "2026-11-01T10:00:00",
        "day": "2026-11-01",
        "doc": {"a": [1, 2.5]},
        "raw": "AAE=",
        "ids": [1, 2],
        "prices": ["1.10"],
        "nothing": None,
        "uid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "since": "2026-10-31",
    }


@pytest.mark.parametrize(
    ("query", "field", "why"),
    [
        ("SELECT 1 AS id, interval '1 day' AS wait", "wait", "a value of type interval has no JSON form"),
        ("SELECT 1 AS id, 'NaN'::float8 AS r", "r", "the value nan has no JSON form"),
        ("SELECT 1 AS id, '10:00+02'::timetz AS t", "t", "a value of type timetz has no JSON form"),
        (
            """SELECT 1 AS id, '{"a": [1, 123456789012345678901234]}'::jsonb AS doc""",
            "doc",
            "the jsonb value holds an integer beyond 64 bits at $.a[1], which JSON readers round",
        ),
    ],
)
def test_a_value_with_no_json_form_is_refused_naming_row_column_and_its_sql_type(
    postgres: PostgresServer, query: str, field: str, why: str
) -> None:
    with pytest.raises(InputInvalid) as raised:
        _rows(_spec(postgres.url(), query))
    problem = raised.value.problems[0]
    assert (problem.row, problem.field) == (1, field)
    assert problem.message == f"{why}; cast it in the query (for example ::text)"


def test_a_postgres_sql_error_gives_the_servers_message_and_position(postgres: PostgresServer) -> None:
    with pytest.raises(InputInvalid) as raised:
        _rows(
            _spec(postgres.url(), "SELECT :a::int AS id, 100 % 7 AS r, nope FROM (SELECT 1) AS t", {"a": 1})
        )
    assert raised.value.message.endswith(
        'the query failed: column "nope" does not exist (at character 37 of input.query)'
    ), raised.value.message


def test_a_write_hidden_in_a_with_is_refused_by_the_server_before_it_runs(postgres: PostgresServer) -> None:
    postgres.sql("CREATE TABLE IF NOT EXISTS kept (id int)")
    postgres.sql("INSERT INTO kept VALUES (1)")
    with pytest.raises(InputInvalid, match="must not contain data-modifying statements"):
        _rows(_spec(postgres.url(), "WITH gone AS (DELETE FROM kept RETURNING id) SELECT id FROM gone"))
    assert postgres.sql("SELECT count(*) FROM kept") == [(1,)]


@pytest.mark.parametrize("case", ["unreachable", "wrong password"])
def test_an_unreachable_database_is_unavailable_naming_the_host_never_the_password(
    postgres: PostgresServer, case: str
) -> None:
    url = postgres.url(port=1) if case == "unreachable" else postgres.url(password="wrong-" + PASSWORD)
    with pytest.raises(InputUnavailable) as raised:
        _rows(_spec(url, "SELECT 1 AS id"))
    error = raised.value
    port = 1 if case == "unreachable" else postgres.port
    assert error.exit_code == 12 and error.context["host"] == f"127.0.0.1:{port}"
    assert f"127.0.0.1:{port}" in error.message
    assert PASSWORD not in str(error.to_dict())
    if case == "wrong password":
        assert "password authentication failed" in error.message


def test_a_column_the_job_needs_that_the_query_lacks_is_the_files_config_error(
    tmp_path: Path, sqlite_db: str
) -> None:
    job = {
        "version": 1,
        "input": {"query": "SELECT id, name AS full_name FROM t", "database": sqlite_db, "key": "id"},
        "request": {"method": "POST", "url": "http://127.0.0.1:9/x/{id}", "json": {"n": {"from": "name"}}},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    loaded = load_job(tmp_path / "job.yaml")
    with passing_snapshot(loaded, tmp_path / "spool") as snapshot, pytest.raises(ConfigInvalid) as raised:
        run_preflight(loaded, snapshot)
    (problem,) = raised.value.problems
    assert (
        problem.message
        == "no column 'name' in <query>; its columns: id, full_name (did you mean 'full_name'?)"
    )
    assert problem.path == "request.json.n.from"
    assert list((tmp_path / "spool").iterdir()) == []  # nothing kept
