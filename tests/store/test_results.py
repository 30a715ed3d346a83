"""The results sink (store/results.py): rows upserted by (job, key) from committed journal groups, an
older outcome never over a newer one, writing twice changes nothing, a torn group is not published,
a locked table is `SinkUnavailable` and a later catch-up completes it; CSV and JSON Lines files too."""

from __future__ import annotations

import sqlite3
import tracemalloc
from pathlib import Path

import orjson
import pytest

from bulkrelay.store.journal.jobrecords import encode_job_record
from bulkrelay.store.results import (
    PROGRESS_FILE,
    SinkTarget,
    SinkUnavailable,
    catch_up,
    fed_offset,
    journal_groups,
    lagging_runs,
    latest_outcomes,
    open_writer,
    read_file_rows,
)
from tests.pgserver import PostgresServer
from tests.runplans import delivered_entry
from tests.store.sinkjournals import append_group, failed_entry, new_run, sqlite_sink, table_of


def test_catch_up_upserts_each_row_keyed_by_key_or_row_number_with_its_commit_time(tmp_path: Path) -> None:
    run = new_run(tmp_path / "runs")
    append_group(
        run, [delivered_entry(1, key="A-1", captured={"id": 7}), failed_entry(2)], 1, 1_764_000_000.5
    )
    sink = sqlite_sink(tmp_path)
    writer = open_writer(sink)
    assert catch_up(writer, sink, run) == 2
    table = table_of(sink)
    assert set(table) == {"A-1", "2"}  # a row without a key: its row number
    assert table["A-1"]["captured"] == '{"id":7}' and table["A-1"]["success"] == 1
    assert table["A-1"]["job"] == "accounts" and table["A-1"]["run_id"] == run.run_id
    assert table["2"]["error"] == "422 Unprocessable" and table["2"]["status_code"] == 422
    assert table["2"]["updated_at"] == "2025-11-24T16:00:00.500000Z"
    assert fed_offset(run, sink) == run.journal_path.stat().st_size
    assert catch_up(writer, sink, run) == 0  # nothing past the progress
    (run.path / PROGRESS_FILE).unlink()
    assert catch_up(writer, sink, run) == 2 and table_of(sink) == table  # twice: the same table
    writer.close()


def test_an_older_outcome_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old, new = new_run(runs), new_run(runs)
    append_group(old, [failed_entry(1, key="A-1")], 1, 1_000.0)
    append_group(new, [delivered_entry(1, key="A-1", captured={"id": 9})], 1, 2_000.0)
    sink = sqlite_sink(tmp_path)
    writer = open_writer(sink)
    catch_up(writer, sink, new)
    catch_up(writer, sink, old)  # caught up later, but older
    assert table_of(sink)["A-1"]["run_id"] == new.run_id
    assert table_of(sink)["A-1"]["success"] == 1
    writer.close()


def test_a_group_without_its_marker_is_not_published(tmp_path: Path) -> None:
    run = new_run(tmp_path / "runs")
    append_group(run, [delivered_entry(1)], 1, 1_000.0)
    append_group(run, [delivered_entry(2)], 2, 1_001.0, marked=False)  # a torn tail
    assert [[e.row_number for e in entries] for entries, _, _ in journal_groups(run.journal_path, 0)] == [[1]]


def test_a_bulk_job_record_between_groups_is_read_past(tmp_path: Path) -> None:
    """A bulk run's journal holds its jobs' records between groups: the catch-up reads on past them
    (it stopped at the first, and the sink lacked every later row until a live feed brought it)."""
    run = new_run(tmp_path / "runs")
    append_group(run, [delivered_entry(1)], 1, 1_000.0)
    with run.journal_path.open("ab") as out:
        out.write(encode_job_record(1, "created", remote="750x", rows=[[2, 3]], keys=["2", "3"]))
    append_group(run, [delivered_entry(2), delivered_entry(3)], 2, 1_001.0)
    sink = sqlite_sink(tmp_path)
    writer = open_writer(sink)
    assert catch_up(writer, sink, run) == 3
    assert set(table_of(sink)) == {"1", "2", "3"}
    assert fed_offset(run, sink) == run.journal_path.stat().st_size
    writer.close()


def test_groups_are_read_up_to_the_end_asked_for(tmp_path: Path) -> None:
    """The live feed reads only what the run told it was committed (store/sinkfeed.py)."""
    run = new_run(tmp_path / "runs")
    first = append_group(run, [delivered_entry(1)], 1, 1_000.0)
    append_group(run, [delivered_entry(2)], 2, 1_001.0)
    groups = journal_groups(run.journal_path, 0, first)
    assert [([e.row_number for e in entries], end) for entries, _, end in groups] == [([1], first)]


def test_a_locked_table_is_unavailable_and_a_later_catch_up_completes_it(tmp_path: Path) -> None:
    run = new_run(tmp_path / "runs")
    append_group(run, [delivered_entry(n) for n in (1, 2, 3)], 1, 1_000.0)
    sink = sqlite_sink(tmp_path)
    open_writer(sink).close()  # the table exists
    assert sink.path is not None
    other = sqlite3.connect(sink.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the table
    writer = open_writer(sink, wait=0.1)
    with pytest.raises(SinkUnavailable, match="locked"):
        catch_up(writer, sink, run)
    assert fed_offset(run, sink) == 0  # nothing claimed
    other.execute("ROLLBACK")
    other.close()
    assert catch_up(writer, sink, run) == 3
    assert set(table_of(sink)) == {"1", "2", "3"}
    writer.close()


def test_lagging_runs_are_the_jobs_runs_the_sink_lacks(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    fed, behind, other_job = new_run(runs), new_run(runs), new_run(runs, "deals")
    for run in (fed, behind, other_job):
        append_group(run, [delivered_entry(1)], 1, 1_000.0)
    sink = sqlite_sink(tmp_path)
    writer = open_writer(sink)
    catch_up(writer, sink, fed)
    assert [run.run_id for run in lagging_runs(runs, "accounts", sink)] == [behind.run_id]
    writer.close()


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_file_sink_is_appended_then_compacted_to_one_line_a_key(tmp_path: Path, kind: str) -> None:
    runs = tmp_path / "runs"
    first, second = new_run(runs), new_run(runs)
    append_group(first, [failed_entry(1, key="k1"), delivered_entry(2, key="k2")], 1, 1_000.0)
    append_group(second, [delivered_entry(1, key="k1", captured={"id": "x,y"})], 1, 2_000.0)
    path = tmp_path / f"results.{kind}"
    sink = SinkTarget(kind, str(path), str(path), "bulkrelay_results", path)  # type: ignore[arg-type]
    writer = open_writer(sink)
    catch_up(writer, sink, first)
    catch_up(writer, sink, second)
    assert len(list(read_file_rows(path, kind))) == 3  # appended
    writer.finish()
    rows = {row[1]: row for row in read_file_rows(path, kind)}
    assert set(rows) == {"k1", "k2"}
    assert rows["k1"][3] == second.run_id and rows["k1"][4] is True
    assert orjson.loads(rows["k1"][9]) == {"id": "x,y"}
    assert rows["k2"][6] == 200 and rows["k2"][8] is None
    writer.close()


def test_a_sqlite_upsert_is_one_statement_a_group_and_keeps_each_columns_type(tmp_path: Path) -> None:
    """The rows of a group go to SQLite as one statement (one JSON parameter), not one a row: each row
    of `executemany` took the GIL back from a busy relay, which starved the sink's thread. Each value
    keeps its type: a key of digits stays text, `captured` stays its JSON text, success an integer."""
    sink = sqlite_sink(tmp_path)
    writer = open_writer(sink)
    statements: list[str] = []
    writer._db.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    rows = [
        ("accounts", "007", 1, "r1", True, "ok", 200, 1, None, '{"id":"é✓"}', "2026-01-01T00:00:00.000000Z"),
        (
            "accounts",
            f"k{2**40}",
            2**40,
            "r1",
            False,
            "http_client_error",
            None,
            3,
            "no",
            None,
            "2026-01-01T",
        ),
    ]
    writer.upsert(rows)
    assert sum(s.startswith("INSERT") for s in statements) == 1
    writer.close()
    assert sink.path is not None
    with sqlite3.connect(sink.path) as db:
        typed = db.execute(
            "SELECT typeof(key), typeof(row_number), typeof(success), typeof(status_code), typeof(captured) "
            "FROM bulkrelay_results ORDER BY row_number"
        ).fetchall()
    db.close()
    assert typed == [
        ("text", "integer", "integer", "integer", "text"),
        ("text", "integer", "integer", "null", "null"),
    ]
    assert [tuple(row.values()) for row in table_of(sink).values()] == [
        tuple(int(v) if type(v) is bool else v for v in row) for row in rows
    ]


def _postgresql(postgres: PostgresServer, table: str) -> SinkTarget:
    """A table of the test's own, new: the tests of one xdist worker share its cluster (a table left
    behind by one test was another's rows too)."""
    postgres.sql(f"DROP TABLE IF EXISTS {table}")
    return SinkTarget("postgresql", "postgresql://127.0.0.1/app", postgres.url(), table)


_STATEMENTS = (
    "CREATE TABLE IF NOT EXISTS statements (n serial PRIMARY KEY);"
    "CREATE OR REPLACE FUNCTION count_statement() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN INSERT INTO statements DEFAULT VALUES; RETURN NULL; END $$;"
    "CREATE OR REPLACE TRIGGER each_statement AFTER INSERT ON results_one_statement "
    "FOR EACH STATEMENT EXECUTE FUNCTION count_statement()"
)


def test_a_postgresql_upsert_is_one_statement_a_group_and_keeps_each_columns_type(
    postgres: PostgresServer,
) -> None:
    """A group's rows go to PostgreSQL in one statement (one JSON parameter), not one a row: a
    statement-level trigger counts the INSERTs the server ran."""
    writer = open_writer(_postgresql(postgres, "results_one_statement"))
    postgres.sql(_STATEMENTS)
    before = postgres.sql("SELECT count(*) FROM statements")[0][0]
    rows = [
        (
            "accounts",
            "007",
            1,
            "r1",
            True,
            "ok",
            200,
            1,
            None,
            '{"id":"é✓","n":1.5}',
            "2026-01-01T00:00:00.250000Z",
        ),
        (
            "accounts",
            f"k{2**40}",
            2**40,
            "r1",
            False,
            "http_client_error",
            None,
            3,
            'no "x"\n',
            None,
            "2026-01-01T00:00:00Z",
        ),
    ]
    writer.upsert(rows)
    writer.close()
    assert postgres.sql("SELECT count(*) FROM statements")[0][0] == before + 1
    held = postgres.sql(
        "SELECT job, key, row_number, run_id, success, classification, status_code, attempts, error, "
        "captured::text, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') "
        "FROM results_one_statement ORDER BY row_number"
    )
    assert held == [
        (
            "accounts",
            "007",
            1,
            "r1",
            True,
            "ok",
            200,
            1,
            None,
            '{"n": 1.5, "id": "é✓"}',
            "2026-01-01T00:00:00.250000",
        ),
        (
            "accounts",
            f"k{2**40}",
            2**40,
            "r1",
            False,
            "http_client_error",
            None,
            3,
            'no "x"\n',
            None,
            "2026-01-01T00:00:00.000000",
        ),
    ]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_key_twice_in_one_group_keeps_its_newest_outcome(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """One statement a group may not touch a row twice (PostgreSQL refuses): the newest outcome of a
    key wins, the later of two as old, as when each row was written in turn."""
    if kind == "sqlite":
        sink = sqlite_sink(tmp_path)
    else:
        sink = _postgresql(request.getfixturevalue("postgres"), "results_key_twice")
    row = ("accounts", "A-1", 1, "r1", True, "ok", 200, 1, None, None)
    writer = open_writer(sink)
    writer.upsert(
        [
            (*row[:3], "new", *row[4:], "2026-01-02T00:00:00.000000Z"),
            (*row[:3], "old", *row[4:], "2026-01-01T00:00:00.000000Z"),
            (*row[:3], "tie", *row[4:], "2026-01-02T00:00:00.000000Z"),
            ("accounts", "A-2", 2, "r1", True, "ok", 200, 1, None, None, "2026-01-01T00:00:00.000000Z"),
        ]
    )
    writer.close()
    if kind == "sqlite":
        held = {key: str(row["run_id"]) for key, row in table_of(sink).items()}
    else:
        held = dict(request.getfixturevalue("postgres").sql("SELECT key, run_id FROM results_key_twice"))
    assert held == {"A-1": "tie", "A-2": "r1"}


def test_latest_outcomes_are_the_newest_of_each_key_in_run_then_row_order(tmp_path: Path) -> None:
    """What a lookup or a chained job reads of a parent: each key's newest outcome (a later run's
    replaces an earlier one's, a key failed last is failed), the oldest run's rows first, each in row
    order, whatever the order the groups were committed in."""
    runs = tmp_path / "runs"
    first, second = new_run(runs), new_run(runs)
    append_group(first, [delivered_entry(2, key="B"), failed_entry(1, key="A")], 1, 1_000.0)
    append_group(first, [delivered_entry(3, key="C", captured={"id": 3})], 3, 1_001.0)
    append_group(
        second, [delivered_entry(1, key="A", captured={"id": 1}), failed_entry(2, key="C")], 1, 2_000.0
    )
    latest = list(latest_outcomes([first, second], tmp_path / "latest.sqlite"))
    assert [(row[1], row[3], row[4]) for row in latest] == [
        ("B", first.run_id, True),
        ("A", second.run_id, True),
        ("C", second.run_id, False),
    ]
    assert latest[1][9] == '{"id":1}'
    assert not (tmp_path / "latest.sqlite").exists()  # the spill is removed once read


def test_latest_outcomes_hold_one_group_at_a_time_not_the_parent(tmp_path: Path) -> None:
    """A parent of a million rows held as a dictionary of its outcomes added 451 MB of peak RSS to the
    lookup that read it (issue 39 allows 150): the outcomes are gathered on disk, so the Python memory
    held is a group's, whatever the rows."""
    run = new_run(tmp_path / "runs")
    rows = 10_000
    for first in range(1, rows + 1, 50):
        group = [
            delivered_entry(n, key=f"acct-{n:08d}", captured={"id": f"001{n:012d}"})
            for n in range(first, first + 50)
        ]
        append_group(run, group, first, 1_000.0 + first)
    tracemalloc.start()
    try:
        count = sum(1 for _ in latest_outcomes([run], tmp_path / "latest.sqlite"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == rows
    assert peak < 1024 * 1024, f"{peak:,} bytes held for {rows:,} rows"  # a dictionary held ~4.5 MB
