"""Parquet inputs: row group by row group into a JSON Lines snapshot, types as documented, the extras
named when missing, and a run that keeps the snapshot and records the file's bytes as its source."""

from __future__ import annotations

import builtins
import datetime as dt
import decimal
import sys
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
from tests.clirun import run_cli
from tests.targetproc import TargetProcess


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


def test_a_value_with_no_json_form_is_refused_naming_row_and_column(tmp_path: Path) -> None:
    path = _table(tmp_path / "d.parquet", id=[1, 2], wait=pa.array([None, dt.timedelta(days=1)]))
    with pytest.raises(
        InputInvalid, match="column 'wait': a value of type timedelta has no JSON form"
    ) as raised:
        parquet_into(path, tmp_path / "out.jsonl")
    assert raised.value.problems[0].row == 2
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
