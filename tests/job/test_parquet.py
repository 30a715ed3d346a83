"""Parquet inputs: row group by row group into a JSON Lines snapshot, types as documented, the extras
named when missing, and a run that keeps the snapshot and records the file's bytes as its source."""

from __future__ import annotations

import builtins
import datetime as dt
import decimal
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
import yaml

from bulkrelay.errors import InputInvalid, UsageError
from bulkrelay.job.inputs.parquet import parquet_into, parquet_source
from bulkrelay.job.inputs.query import QuerySpec, database_of, take_snapshot
from tests.clirun import run_cli, start_cli
from tests.runsteps import journal_rows
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

ROWS = 200


def _table(path: Path, **columns: Any) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=2)
    return path


def test_rows_are_read_by_row_group_with_nested_values_as_json(tmp_path: Path) -> None:
    at = dt.datetime(2026, 11, 1, 10, tzinfo=dt.UTC)
    path = _table(
        tmp_path / "c.parquet",
        id=[1, 2, 3],
        price=pa.array([decimal.Decimal("1.10"), None, decimal.Decimal("3")], pa.decimal128(10, 2)),
        at=pa.array([at] * 3, pa.timestamp("us", tz="UTC")),
        day=pa.array([dt.date(2026, 11, 1)] * 3),
        addr=[{"city": "Oslo"}, None, {"city": "Rome"}],
        tags=[["a"], [], None],
        raw=[b"\x00\x01", None, b""],
    )
    assert pq.ParquetFile(path).num_row_groups == 2

    count, source = parquet_into(path, tmp_path / "out.jsonl")

    rows = [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert count == 3 and source == parquet_source(path) and source.startswith("parquet sha256:")
    assert rows[0] == {
        "id": 1,
        "price": "1.10",
        "at": "2026-11-01T10:00:00+00:00",
        "day": "2026-11-01",
        "addr": {"city": "Oslo"},
        "tags": ["a"],
        "raw": "AAE=",
    }
    assert rows[2]["price"] == "3.00" and rows[1]["addr"] is None and rows[2]["tags"] is None


def test_rows_come_in_file_order_across_batches_and_row_groups(tmp_path: Path) -> None:
    """Groups of 3,000 rows read 2,000 at a time: batches end inside a group and at its end."""
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": list(range(1, 7501))}), path, row_group_size=3000)
    assert pq.ParquetFile(path).num_row_groups == 3

    count, _ = parquet_into(path, tmp_path / "out.jsonl")

    rows = [orjson.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]
    assert count == 7500 and rows == list(range(1, 7501))


def test_a_value_with_no_json_form_is_refused_naming_row_and_column(tmp_path: Path) -> None:
    path = _table(tmp_path / "d.parquet", id=[1, 2], wait=pa.array([None, dt.timedelta(days=1)]))
    with pytest.raises(
        InputInvalid, match=r"column 'wait': a value of type duration\[us\] has no JSON form"
    ) as raised:
        parquet_into(path, tmp_path / "out.jsonl")
    assert raised.value.problems[0].row == 2
    assert not (tmp_path / "out.jsonl").exists()


def _snapshot(path: Path, tmp_path: Path) -> list[dict[str, Any]]:
    parquet_into(path, tmp_path / "out.jsonl")
    return [orjson.loads(line) for line in (tmp_path / "out.jsonl").read_bytes().splitlines()]


def test_nanoseconds_are_written_with_nine_digits_and_zoned_timestamps_in_utc(tmp_path: Path) -> None:
    nanos = 1_700_000_000_123_456_789
    path = _table(
        tmp_path / "n.parquet",
        id=[1, 2],
        at=pa.array([nanos, 1_700_000_000_123_456_000], pa.timestamp("ns")),
        zoned=pa.array([nanos, None], pa.timestamp("ns", tz="Europe/Paris")),
        clock=pa.array([3_600_000_000_123, 0], pa.time64("ns")),
        paris=pa.array([1_700_000_000_000_000] * 2, pa.timestamp("us", tz="Europe/Paris")),
        nested=pa.array(
            [{"at": 1_700_000_000_000}] * 2, pa.struct([("at", pa.timestamp("ms", tz="+05:30"))])
        ),
    )
    assert _snapshot(path, tmp_path) == [
        {
            "id": 1,
            "at": "2023-11-14T22:13:20.123456789",
            "zoned": "2023-11-14T22:13:20.123456789+00:00",
            "clock": "01:00:00.000000123",
            "paris": "2023-11-14T22:13:20+00:00",  # the instant in UTC, as a query's timestamptz
            "nested": {"at": "2023-11-14T22:13:20+00:00"},
        },
        {
            "id": 2,
            "at": "2023-11-14T22:13:20.123456",  # no nanoseconds: six digits, as Python writes it
            "zoned": None,
            "clock": "00:00:00",
            "paris": "2023-11-14T22:13:20+00:00",
            "nested": {"at": "2023-11-14T22:13:20+00:00"},
        },
    ]


@pytest.mark.parametrize(
    "column",
    [
        pa.array([0, 253_402_300_800_000_000], pa.timestamp("us")),  # year 10000
        pa.array([0, -62_135_596_801_000], pa.timestamp("ms", tz="UTC")),  # before year 1
        pa.array([0, 2_932_897 + 10], pa.date32()),
        pa.array([0, 253_402_300_800_000], pa.date64()),
    ],
    ids=["timestamp-after-9999", "timestamp-before-1", "date32", "date64"],
)
def test_a_date_outside_iso_8601s_years_is_refused_naming_file_row_and_column(
    tmp_path: Path, column: Any
) -> None:
    path = _table(tmp_path / "far.parquet", id=[1, 2], when=column)
    with pytest.raises(InputInvalid, match="column 'when': a date outside the years 1 to 9999") as raised:
        parquet_into(path, tmp_path / "out.jsonl")
    problem = raised.value.problems[0]
    assert (problem.file, problem.row) == (str(path), 2)
    assert raised.value.exit_code == 2 and not (tmp_path / "out.jsonl").exists()


def test_a_column_named_twice_is_the_files_fault_as_a_csv_header_named_twice_is(tmp_path: Path) -> None:
    """INPUT_INVALID, not CONFIG_INVALID: the names are the file's, and no job file can fix them (a
    query's duplicate is CONFIG_INVALID: its names are written in the job file; docs/inputs.md)."""
    path = tmp_path / "twice.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["id", "id"]), path)

    with pytest.raises(InputInvalid, match="the column 'id' appears twice") as raised:
        parquet_into(path, tmp_path / "out.jsonl")

    assert raised.value.code == "INPUT_INVALID"
    (problem,) = raised.value.problems
    assert (problem.file, problem.field) == (str(path), "id")
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(("module", "extra"), [("psycopg", "postgres"), ("pyarrow.parquet", "parquet")])
def test_a_missing_extra_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: str, extra: str
) -> None:
    real_import = builtins.__import__

    def refusing(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == module or name.startswith(module + "."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(builtins, "__import__", refusing)
    with pytest.raises(UsageError, match=rf"bulkrelay\[{extra}\]"):
        if extra == "postgres":
            database = database_of("postgresql://127.0.0.1:1/x", {}, tmp_path)
            with open(tmp_path / "x", "wb") as out:
                take_snapshot(QuerySpec("SELECT 1", {}, database, "job.yaml"), out)
        else:
            parquet_into(tmp_path / "none.parquet", tmp_path / "out.jsonl")


@pytest.mark.slow
def test_a_parquet_run_keeps_its_snapshot_and_a_changed_file_is_a_fresh_run(tmp_path: Path) -> None:
    _table(tmp_path / "c.parquet", id=[1, 2, 3], email=["a@x", "b@x", "c@x"])
    with TargetProcess() as target:
        job = {
            "version": 1,
            "input": {"file": "c.parquet", "key": "id"},
            "request": {"method": "PUT", "url": f"{target.url}/c/{{id}}", "json": {"e": {"from": "email"}}},
        }
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))

        first = run_cli("run", tmp_path / "job.yaml", "--budget", "0", cwd=tmp_path)
        _table(tmp_path / "c.parquet", id=[1, 2, 3, 4], email=["a@x", "b@x", "c@x", "d@x"])
        second = run_cli("run", tmp_path / "job.yaml", "--budget", "0", cwd=tmp_path)

        assert first.exit_code == 0 and second.exit_code == 0, (first.envelope, second.envelope)
        assert len(target.requests()) == 3 + 4
    run_dir = Path(first.data["run_dir"])
    manifest = orjson.loads((run_dir / "run.json").read_bytes())
    assert manifest["input"]["path"] == str(run_dir / "input.jsonl")
    assert manifest["input"]["source"].startswith("parquet sha256:")
    assert len((run_dir / "input.jsonl").read_bytes().splitlines()) == 3


def _emails(rows: int, tag: str = "") -> dict[str, Any]:
    return {"id": list(range(1, rows + 1)), "email": [f"u{n}{tag}@x" for n in range(1, rows + 1)]}


def _killed_with_20_rows_committed(tmp_path: Path, target: TargetProcess) -> Path:
    """A run of c.parquet killed with -9 once exactly 20 rows are journaled: the target answers 20
    requests and holds every later one, so no other row can be answered, whatever the timing."""
    target.set_plan({"rules": [{"after": 20, "delay_ms": 120_000}]})
    proc = start_cli("run", tmp_path / "job.yaml", "--budget", "0", cwd=tmp_path, output="discarded")
    runs = tmp_path / ".bulkrelay" / "runs"
    run = wait_for(
        lambda: next(
            (p.parent for p in runs.glob("2*/results.jsonl") if len(journal_rows(p.parent)) >= 20), None
        ),
        "20 rows journaled",
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    target.set_plan({"rules": []})
    target.reset()
    return run


@pytest.mark.slow
@pytest.mark.parametrize("file", ["unchanged", "changed"])
def test_an_unfinished_parquet_runs_rerun_reads_its_snapshot_unless_the_file_changed(
    tmp_path: Path, target: TargetProcess, file: str
) -> None:
    """docs/inputs.md: the identical re-run of an unfinished run reads its snapshot while the file is
    unchanged (the same run, only the rows not yet committed sent); a changed file is a new run of the
    new file, CHECKPOINT_DISCARDED, as for any input."""
    _table(tmp_path / "c.parquet", **_emails(ROWS))
    job = {
        "version": 1,
        "input": {"file": "c.parquet", "key": "id"},
        "request": {"method": "PUT", "url": f"{target.url}/c/{{id}}", "json": {"e": {"from": "email"}}},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    killed = _killed_with_20_rows_committed(tmp_path, target)
    committed = set(journal_rows(killed))
    snapshot = (killed / "input.jsonl").stat()
    assert len(committed) == 20
    if file == "changed":
        _table(tmp_path / "c.parquet", **_emails(ROWS + 30, tag="-v2"))

    rerun = run_cli("run", tmp_path / "job.yaml", "--budget", "0", cwd=tmp_path)

    assert rerun.exit_code == 0, rerun.envelope
    sent = Counter(int(r["path"].rsplit("/", 1)[-1]) for r in target.requests())
    discarded = [w for w in rerun.envelope["warnings"] if w["code"] == "CHECKPOINT_DISCARDED"]
    if file == "unchanged":
        assert rerun.data["run_id"] == killed.name and not discarded
        assert sent == Counter(set(range(1, ROWS + 1)) - committed)  # only the rest, each once
        again = (killed / "input.jsonl").stat()
        assert (again.st_ino, again.st_mtime_ns) == (snapshot.st_ino, snapshot.st_mtime_ns)  # not retaken
    else:
        assert rerun.data["run_id"] != killed.name
        (warning,) = discarded
        assert warning["context"] == {"previous_run": killed.name, "reason": "INPUT_CHANGED"}
        assert sent == Counter(range(1, ROWS + 31))  # every row of the new file, the 20 committed too
        assert all("-v2@x" in r["body"] for r in target.requests())
        fresh = Path(rerun.data["run_dir"]) / "input.jsonl"
        assert len(fresh.read_bytes().splitlines()) == ROWS + 30
