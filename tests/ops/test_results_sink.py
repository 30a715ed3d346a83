"""`results:` through the real CLI: every row's outcome lands in the SQLite table, a CSV file or
PostgreSQL, once a (job, key); a table locked by another writer is a SINK_UNAVAILABLE warning and the
run goes on, and the next run of the job catches the table up from the journal; `export --results`
writes the same columns to stdout. The live feed is a process of the run's, which ends with it, a run
killed with SIGKILL included, and whose rows the resume catches up."""

from __future__ import annotations

import csv
import io
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store import results
from bulkrelay.store.journal import read_journal
from bulkrelay.store.results import COLUMNS, Row, row_of
from tests.clirun import cli_env, run_cli, run_cli_raw, start_cli
from tests.jobfiles import write_job
from tests.pgserver import PASSWORD, PostgresServer
from tests.runsteps import run_here
from tests.sinkfeeders import ended, feeders_of
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.shared_target]  # real processes

ROWS = 30
KILLED_ROWS = 300  # at 200 a second: killed after 20 committed, well before the last
_ANSWER_OK = {"status": 200, "body": {"ok": True}}
_ALL_OK = {"rules": [_ANSWER_OK]}
_FAIL_ROW_7 = {"rules": [{"match": {"path_contains": "/items/7"}, "status": 422}, _ANSWER_OK]}


def _job(
    tmp_path: Path, target: TargetProcess, to: str, name: str = "test-job", table: str | None = None
) -> Path:
    return write_job(
        tmp_path,
        target.url,
        ROWS,
        name=name,
        input={"key": "id"},
        response={"capture": {"ok": "/ok"}},
        results={"to": to, **({"table": table} if table else {})},
    )


def _table(path: Path) -> list[dict[str, object]]:
    with sqlite3.connect(path) as db:
        rows = db.execute(
            f"SELECT {', '.join(COLUMNS)} FROM bulkrelay_results ORDER BY row_number"
        ).fetchall()
    db.close()
    return [dict(zip(COLUMNS, row, strict=True)) for row in rows]


def test_each_rows_outcome_is_in_the_sqlite_table_and_in_export_results(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan(_FAIL_ROW_7)
    job = _job(tmp_path, target, "sqlite:///results.db")
    result = run_cli("run", job, cwd=tmp_path)
    assert result.exit_code == 3, result.stderr  # row 7 failed
    table = _table(tmp_path / "results.db")
    assert [row["key"] for row in table] == [str(n) for n in range(1, ROWS + 1)]
    assert {row["job"] for row in table} == {"test-job"}
    failed = table[6]
    assert failed["success"] == 0 and failed["status_code"] == 422 and failed["classification"]
    assert orjson.loads(str(table[0]["captured"])) == {"ok": True}
    exported = run_cli_raw("export", "latest", "--results", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert orjson.loads(exported.stderr)["data"]["rows"] == ROWS  # the envelope: on stderr
    lines = sorted(csv.DictReader(io.StringIO(exported.stdout.decode())), key=lambda line: int(line["key"]))
    assert [line["key"] for line in lines] == [str(n) for n in range(1, ROWS + 1)]  # in journal order
    assert lines[6]["success"] == "false"
    assert [line["updated_at"] for line in lines] == [row["updated_at"] for row in table]
    as_jsonl = run_cli_raw("export", "latest", "--results", "--format", "jsonl", cwd=tmp_path)
    records = sorted(map(orjson.loads, as_jsonl.stdout.splitlines()), key=lambda r: r["row_number"])
    assert records[0]["captured"] == {"ok": True} and records[6]["success"] is False


def test_a_locked_table_is_a_warning_and_the_next_run_catches_it_up(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan(_ALL_OK)
    job = _job(tmp_path, target, "sqlite:///results.db")
    db = tmp_path / "results.db"
    run_cli("run", job, cwd=tmp_path)  # makes the table
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds it for the whole second run
    try:
        locked = run_cli("run", job, cwd=tmp_path)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert locked.exit_code == 0, locked.stderr  # the run went on
    warnings = [w for w in locked.envelope["warnings"] if w["code"] == "SINK_UNAVAILABLE"]
    assert len(warnings) == 1 and str(db.resolve()) in warnings[0]["message"]
    second = locked.data["run_id"]
    assert {row["run_id"] for row in _table(db)} != {second}  # the table lags
    third = run_cli("run", job, cwd=tmp_path)
    assert third.exit_code == 0 and not third.envelope["warnings"]
    table = _table(db)
    assert len(table) == ROWS and {row["run_id"] for row in table} == {third.data["run_id"]}


def test_the_relay_process_turns_no_entry_into_a_row(
    tmp_path: Path, target: TargetProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live feed is a process of its own (store/sinkfeed.py): the relay's process tells it where the
    committed bytes end and builds no row for the sink (issue 39: building them cost it 5-10 % of its
    rows a second)."""
    target.set_plan(_ALL_OK)
    monkeypatch.chdir(tmp_path)
    built = 0

    def counted(*args: Any) -> Row:
        nonlocal built
        built += 1
        return row_of(*args)

    monkeypatch.setattr(results, "row_of", counted)
    result = run_here(_job(tmp_path, target, "sqlite:///results.db"))
    assert result.exit_code == ExitCode.SUCCESS, result
    assert len(_table(tmp_path / "results.db")) == ROWS
    assert built == 0


def test_a_run_killed_midway_leaves_no_feeder_and_its_resume_catches_the_table_up(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan({"rules": [{"delay_ms": 10}]})
    job = write_job(
        tmp_path,
        target.url,
        KILLED_ROWS,
        input={"key": "id"},
        results={"to": "sqlite:///results.db"},
        execution={"concurrency": 4, "rate_limit": {"requests_per_second": 200}},
    )
    runs = tmp_path / ".bulkrelay" / "runs"
    proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, output="discarded")
    try:
        feeder = wait_for(lambda: feeders_of(proc.pid) or None, what="the run's feeder")[0]
        wait_for(lambda: len(list(_journals(runs))) == 1 and len(_committed(runs)) >= 20, what="20 rows")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL  # killed mid-run
    wait_for(lambda: ended(feeder), what="the feeder to end with its run")
    killed = len(_committed(runs))
    resumed = run_cli("run", job, cwd=tmp_path)  # the identical invocation resumes the run
    assert resumed.exit_code == 0, resumed.envelope
    assert len(_committed(runs)) == KILLED_ROWS > killed
    table = _table(tmp_path / "results.db")
    assert [row["key"] for row in table] == [str(n) for n in range(1, KILLED_ROWS + 1)]  # each row once
    assert {row["run_id"] for row in table} == {resumed.data["run_id"]}
    assert all(row["success"] == 1 for row in table)


def _journals(runs: Path) -> Iterator[Path]:
    return runs.glob("*/results.jsonl")


def _committed(runs: Path) -> list[int]:
    return [entry.row_number for journal in _journals(runs) for entry in read_journal(journal)]


def test_a_csv_sink_holds_one_line_a_key_after_two_runs(tmp_path: Path, target: TargetProcess) -> None:
    target.set_plan(_ALL_OK)
    job = _job(tmp_path, target, "results.csv")
    for _ in range(2):
        assert run_cli("run", job, cwd=tmp_path).exit_code == 0
    lines = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert sorted(int(line["key"]) for line in lines) == list(range(1, ROWS + 1))


def test_a_postgresql_sink_is_upserted(
    tmp_path: Path, target: TargetProcess, postgres: PostgresServer
) -> None:
    target.set_plan(_FAIL_ROW_7)
    postgres.sql("DROP TABLE IF EXISTS sink_upserted")  # the worker's cluster is shared: a table of its own
    job = _job(tmp_path, target, "${DATABASE_URL}", table="sink_upserted")
    env = cli_env(DATABASE_URL=postgres.url())
    for _ in range(2):
        result = run_cli("run", job, cwd=tmp_path, env=env)
        assert result.exit_code == 3, result.stderr
        assert PASSWORD not in result.stderr
    rows = postgres.sql("SELECT key, success, run_id FROM sink_upserted ORDER BY row_number")
    assert len(rows) == ROWS and rows[6][1] is False
    assert {row[2] for row in rows} == {result.data["run_id"]}


def test_a_sink_whose_secret_is_unset_refuses_before_any_run_starts(
    tmp_path: Path, target: TargetProcess
) -> None:
    target.set_plan(_ALL_OK)
    target.reset()
    job = _job(tmp_path, target, "${RESULTS_DATABASE_URL}")
    result = run_cli("run", job, cwd=tmp_path)
    assert (
        result.error_code == "SECRET_MISSING"
        and "RESULTS_DATABASE_URL" in result.envelope["error"]["message"]
    )
    assert target.stats()["requests"] == 0
    assert not list((tmp_path / ".bulkrelay" / "runs").glob("*/run.json"))
