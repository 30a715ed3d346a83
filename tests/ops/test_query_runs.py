"""Query inputs as real `bulkrelay run` processes: the snapshot is what a killed run's identical re-run
sends, a completed run's next invocation queries afresh, a delta night over a query sends only changed
rows, and the database's password reaches no file and no output."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
from collections import Counter
from contextlib import suppress
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.clirun import CliResult, cli_env, run_cli, run_cli_raw, start_cli
from tests.pgserver import PASSWORD, PostgresServer
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

ROWS = 120


def _job(tmp_path: Path, target_url: str, query: str, **input_extra: Any) -> Path:
    job = {
        "version": 1,
        "name": "customers-nightly",
        "input": {"query": query, "database": "${DATABASE_URL}", "key": "id", **input_extra},
        "request": {
            "method": "PUT",
            "url": f"{target_url}/customers/{{id}}",
            "json": {"email": {"from": "email"}},
        },
        "execution": {"concurrency": 4, "sync": "delta"},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _sqlite(tmp_path: Path, rows: range) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS customers (id INTEGER PRIMARY KEY, email TEXT)")
        conn.executemany("INSERT INTO customers VALUES (?, ?)", [(n, f"user{n}@example.com") for n in rows])
    conn.close()
    return path


def _run(tmp_path: Path, job: Path, url: str) -> CliResult:
    return run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(DATABASE_URL=url))


def _sent(target: TargetProcess) -> Counter[int]:
    return Counter(int(request["path"].rsplit("/", 1)[-1]) for request in target.requests())


def _runs(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / ".bulkrelay" / "runs").iterdir() if (p / "run.json").is_file())


class _Customers:
    """The `customers` table (id, email) of a SQLite file or of the PostgreSQL cluster, to add and change
    rows while a run is under way."""

    def __init__(self, tmp_path: Path, postgres: PostgresServer | None) -> None:
        self._postgres = postgres
        if postgres is None:
            self._db = _sqlite(tmp_path, range(0))
            self.url = self.source = f"sqlite:///{self._db}"
        else:
            postgres.sql("DROP TABLE IF EXISTS customers")
            postgres.sql("CREATE TABLE customers (id int PRIMARY KEY, email text)")
            self.url = postgres.url()
            self.source = f"postgresql://127.0.0.1:{postgres.port}/app"

    def add(self, rows: range) -> None:
        if self._postgres is None:
            _sqlite(self._db.parent, rows)
        else:
            self._postgres.sql(
                "INSERT INTO customers SELECT n, 'user' || n || '@example.com'"
                " FROM generate_series(%s::int, %s::int) n",
                (rows.start, rows.stop - 1),
            )

    def change(self, ids: list[int], email: str) -> None:
        if self._postgres is None:
            with sqlite3.connect(self._db) as conn:
                conn.executemany("UPDATE customers SET email = ? WHERE id = ?", [(email, n) for n in ids])
            conn.close()
        else:
            self._postgres.sql("UPDATE customers SET email = %s WHERE id = ANY(%s)", (email, ids))


@pytest.fixture(params=["sqlite", "postgresql"])
def customers(request: pytest.FixtureRequest, tmp_path: Path) -> _Customers:
    postgres = request.getfixturevalue("postgres") if request.param == "postgresql" else None
    return _Customers(tmp_path, postgres)


@pytest.mark.slow
def test_a_killed_runs_rerun_sends_its_snapshot_then_the_next_night_queries_afresh(
    tmp_path: Path, target: TargetProcess, customers: _Customers
) -> None:
    customers.add(range(1, ROWS + 1))
    url = customers.url
    job = _job(tmp_path, target.url, "SELECT id, email FROM customers WHERE id > :after", params={"after": 0})
    target.set_plan(
        {"rules": [{"after": 30, "delay_ms": 120_000}]}
    )  # the 31st request on hangs: killed there
    proc = start_cli(
        "run", job, "--budget", "0", cwd=tmp_path, env=cli_env(DATABASE_URL=url), output="discarded"
    )
    wait_for(lambda: len(target.requests()) >= 30, "30 rows sent")
    customers.add(range(ROWS + 1, ROWS + 41))  # rows added while the run is under way
    customers.change([1], "changed@example.com")  # and a row changed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (killed,) = _runs(tmp_path)
    snapshot = killed / "input.jsonl"
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    assert len(snapshot.read_bytes().splitlines()) == ROWS
    target.set_plan({"rules": []})

    rerun = _run(tmp_path, job, url)

    assert rerun.exit_code == 0, rerun.envelope
    assert rerun.data["run_id"] == killed.name  # the same run, continued from its own snapshot
    assert set(_sent(target)) == set(range(1, ROWS + 1))  # exactly the snapshot's rows: none added later
    manifest = orjson.loads((killed / "run.json").read_bytes())
    assert manifest["input"]["source"] == customers.source
    bodies = [r["body"] for r in target.requests() if r["path"].endswith("/customers/1")]
    assert all("user1@example.com" in body for body in bodies)  # as the snapshot had it, not as updated
    target.reset()

    night = _run(tmp_path, job, url)  # after a completed run: the query runs again

    assert night.exit_code == 0, night.envelope
    assert night.data["run_id"] != killed.name
    assert sorted(_sent(target)) == [1, *range(ROWS + 1, ROWS + 41)]  # the changed row and the new ones
    target.reset()
    customers.change([5, 77], "again@example.com")

    delta = _run(tmp_path, job, url)

    assert delta.exit_code == 0, delta.envelope
    assert sorted(_sent(target)) == [5, 77]


@pytest.mark.slow
def test_a_postgres_run_keeps_no_password_anywhere(
    tmp_path: Path, target: TargetProcess, postgres: PostgresServer
) -> None:
    postgres.sql("DROP TABLE IF EXISTS customers")
    postgres.sql("CREATE TABLE customers (id int PRIMARY KEY, email text, updated_at timestamptz)")
    postgres.sql(
        "INSERT INTO customers SELECT n, 'user' || n || '@example.com', now() FROM generate_series(1, 25) n"
    )
    job = _job(tmp_path, target.url, "SELECT id, email, updated_at FROM customers ORDER BY id")

    result = _run(tmp_path, job, postgres.url())

    assert result.exit_code == 0, result.envelope
    assert sorted(_sent(target)) == list(range(1, 26))
    (run,) = _runs(tmp_path)
    manifest = orjson.loads((run / "run.json").read_bytes())
    assert manifest["input"]["source"] == f"postgresql://127.0.0.1:{postgres.port}/app"
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "app.db"]
    assert files and not [p for p in files if PASSWORD.encode() in p.read_bytes()]
    assert PASSWORD not in result.stdout.decode() + result.stderr


@pytest.mark.slow
def test_an_unreachable_database_exits_12_naming_the_host_and_a_renamed_column_is_a_config_error(
    tmp_path: Path, target: TargetProcess, postgres: PostgresServer
) -> None:
    job = _job(tmp_path, target.url, "SELECT 1 AS id, 'a@example.com' AS mail")

    down = _run(tmp_path, job, postgres.url(port=1))
    renamed = _run(tmp_path, job, postgres.url())

    assert (down.exit_code, down.error_code) == (12, "INPUT_UNAVAILABLE"), down.envelope
    assert "127.0.0.1:1" in down.envelope["error"]["message"]
    assert PASSWORD not in down.stdout.decode() + down.stderr
    assert (renamed.exit_code, renamed.error_code) == (2, "CONFIG_INVALID"), renamed.envelope
    (problem,) = renamed.envelope["error"]["context"]["problems"]
    assert problem["message"].startswith("no column 'email' in <query>; its columns: id, mail")
    assert not target.requests()
    assert not [p for p in (tmp_path / ".bulkrelay" / "runs" / ".spool").iterdir()]  # no snapshot left


@pytest.mark.slow
def test_resume_of_a_query_run_reads_its_snapshot_and_never_the_database(
    tmp_path: Path, target: TargetProcess, postgres: PostgresServer
) -> None:
    postgres.sql("DROP TABLE IF EXISTS people")
    postgres.sql(
        "CREATE TABLE people AS"
        " SELECT n AS id, 'p' || n || '@example.com' AS email FROM generate_series(1, 40) n"
    )
    job = _job(tmp_path, target.url, "SELECT id, email FROM people")
    target.set_plan({"rules": [{"after": 10, "delay_ms": 120_000}]})
    env = cli_env(DATABASE_URL=postgres.url())
    proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, env=env, output="discarded")
    wait_for(lambda: len(target.requests()) >= 10, "10 rows sent")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    postgres.sql("DROP TABLE people")  # gone: a query now would fail
    target.set_plan({"rules": []})
    (run,) = _runs(tmp_path)
    # The same database named (host, port, database), its password wrong: reading it would fail.
    env = cli_env(DATABASE_URL=postgres.url(password="not-the-password"))

    resumed = run_cli("resume", run, "--budget", "0", cwd=tmp_path, env=env)

    assert resumed.exit_code == 0, resumed.envelope
    assert set(_sent(target)) == set(range(1, 41))


@pytest.mark.slow
def test_a_quiet_night_with_no_changed_rows_is_a_run_of_no_rows(
    tmp_path: Path, target: TargetProcess
) -> None:
    """A query's empty answer ("every customer updated since yesterday", on a quiet night) is no broken
    input: validate says 0 records, the run completes with exit 0, and the next night with rows sends
    them. (An empty file, Parquet too, stays refused: no database vouches for it.)"""
    db = _sqlite(tmp_path, range(1, 4))
    url = f"sqlite:///{db}"
    job = _job(tmp_path, target.url, "SELECT id, email FROM customers WHERE id > :after", params={"after": 3})

    checked = run_cli("validate", job, cwd=tmp_path, env=cli_env(DATABASE_URL=url))
    quiet = _run(tmp_path, job, url)
    _sqlite(tmp_path, range(4, 6))
    busy = _run(tmp_path, job, url)

    assert checked.exit_code == 0 and checked.data["record_count"] == 0, checked.envelope
    assert checked.data["format"] == "query"  # not the JSON Lines of its snapshot
    assert quiet.exit_code == 0, quiet.envelope
    assert quiet.data["state"] == "completed" and quiet.data["progress"]["total"] == 0
    assert busy.exit_code == 0 and busy.data["progress"]["total"] == 2, busy.envelope
    assert _sent(target) == Counter({4: 1, 5: 1})


@pytest.mark.slow
def test_a_parquet_file_of_no_rows_is_refused_by_validate_and_run_alike(tmp_path: Path) -> None:
    """A file is not a query: an empty export is more often a failed export than a quiet night."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "empty.parquet")
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "input": {"file": "empty.parquet"},
                "request": {
                    "method": "PUT",
                    "url": "http://127.0.0.1:9/c/{id}",
                    "json": {"id": {"from": "id"}},
                },
            }
        )
    )
    for command in ("validate", "run"):
        refused = run_cli(command, job, cwd=tmp_path)
        assert refused.error_code == "INPUT_INVALID", refused.envelope
        assert "input has no records" in refused.envelope["error"]["message"]


_MANY = "WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n LIMIT 2000000) SELECT id FROM n"


@pytest.mark.slow
def test_the_snapshots_of_runs_killed_mid_snapshot_are_removed_by_the_next_run(
    tmp_path: Path, target: TargetProcess
) -> None:
    """Issue 38 item 12: every run killed while it took its query's snapshot left that file in the
    spool for ever (9 files, 386 MB after 15 kills); `prune` saw none of them."""
    url = f"sqlite:///{_sqlite(tmp_path, range(1, 4))}"
    spool = tmp_path / ".bulkrelay" / "runs" / ".spool"
    job = _job(tmp_path, target.url, _MANY)
    first = _killed_mid_snapshot(tmp_path, job, url, spool)
    pruned = run_cli("prune", "--keep", "1", "--dry-run", cwd=tmp_path)
    assert pruned.data["spools_removed"] == [first] and pruned.data["spool_bytes"] > 0, pruned.envelope

    second = _killed_mid_snapshot(tmp_path, job, url, spool)  # its snapshot began by removing the first's
    assert [p.name for p in spool.glob("query-*")] == [second]

    small = _job(tmp_path, target.url, "SELECT id, email FROM customers")
    done = _run(tmp_path, small, url)

    assert done.exit_code == 0, done.envelope
    assert list(spool.iterdir()) == []  # the abandoned snapshots, and no owner file left behind


def _killed_mid_snapshot(tmp_path: Path, job: Path, url: str, spool: Path) -> str:
    """`run` killed with SIGKILL while it writes its query's snapshot; the name of the file it left."""
    before = {p.name for p in spool.glob("query-*")}
    env = cli_env(DATABASE_URL=url)
    proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, env=env, output="discarded")

    def taking() -> str | None:
        for path in spool.glob("query-*"):
            with suppress(FileNotFoundError):  # a snapshot that ended moves into its run
                if path.name not in before and path.stat().st_size:
                    return path.name
        return None

    name = wait_for(taking, "the snapshot under way", interval=0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (spool / name).is_file()
    return name


@pytest.mark.slow
def test_validate_names_a_parquet_input_parquet_not_the_json_lines_of_its_snapshot(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), tmp_path / "people.parquet")
    job = tmp_path / "job.yaml"
    request = {"method": "PUT", "url": "http://127.0.0.1:9/c/{id}", "json": {"id": {"from": "id"}}}
    job.write_text(yaml.safe_dump({"version": 1, "input": {"file": "people.parquet"}, "request": request}))

    checked = run_cli("validate", job, cwd=tmp_path)
    shown = run_cli_raw("validate", job, "--human", cwd=tmp_path)

    assert checked.data["format"] == "parquet", checked.envelope
    assert b"2 records (parquet) from " in shown.stdout
