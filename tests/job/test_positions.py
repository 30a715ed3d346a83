"""Tests for reading a run's selected rows again by their line numbers (job/positions.py)."""

from __future__ import annotations

import gzip
import os
from dataclasses import replace
from pathlib import Path

import pytest

from bulkrelay.errors import InputChanged
from bulkrelay.job import positions as positions_module
from bulkrelay.job.config import load_job
from bulkrelay.job.digest import key_text
from bulkrelay.job.inputs import open_records
from bulkrelay.job.positions import DENSE_SHARE, RowPositions, fields_token, open_selected, request_token
from bulkrelay.job.preflight import Preflight, run_preflight
from bulkrelay.job.records import Record

BOM = b"\xef\xbb\xbf"
# Multi-line quoted fields, blank lines, CRLF, a BOM and no newline at the end.
CSV = BOM + b'id,note\r\n1,plain\r\n\r\n2,"two\r\nlines"\r\n3,"a ""quoted"" one"\n\n\n4,"x\ny\nz"\n5,last'
JSONL = BOM + b'{"id": 1}\n{"id": 2, "note": "caf\xc3\xa9"}\r\n{"id": 3}\n{"id": 4}'


JOB = """\
version: 1
name: positions
input: {{file: {name}, key: id}}
request: {{method: PUT, url: "http://127.0.0.1:9/items/{{id}}"}}
execution: {{sync: delta}}
"""


def _write(tmp_path: Path, name: str, body: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    (tmp_path / "job.yaml").write_text(JOB.format(name=name))
    return path


def _preflight(tmp_path: Path) -> tuple[Preflight, list[Record]]:
    """Preflight of the job, and every record of its input."""
    preflight = run_preflight(load_job(tmp_path / "job.yaml"), env={})
    with open_records(preflight.input_spec, pytest.fail) as stream:  # type: ignore[arg-type]
        return preflight, list(stream)


def _positions(preflight: Preflight, records: list[Record], rows: set[int], by_request: bool) -> RowPositions:
    """The positions of `rows`, with the tokens a delta run (`by_request`) or a shard computes."""
    positions = RowPositions(by_request=by_request)
    digester = preflight.digester
    assert digester is not None
    for record in records:
        if record.row_number in rows:
            if by_request:
                digest = digester.digest(preflight.renderer.render(record), record.fields)
                token = request_token(key_text(record.fields["id"]), digest)
            else:
                token = fields_token(record.fields)
            positions.add(record.row_number, record.line, token)
    return positions


def _read(preflight: Preflight, positions: RowPositions) -> list[Record]:
    assert preflight.expected_input is not None
    with open_selected(preflight, preflight.expected_input, positions) as records:
        return list(records)


@pytest.mark.parametrize("by_request", [True, False], ids=["delta", "shard"])
@pytest.mark.parametrize("chunk", [5, 1 << 20])  # 5 bytes: lines (and CRLFs) cut across chunks
@pytest.mark.parametrize("name", ["a.csv", "a.jsonl", "a.csv.gz", "a.jsonl.gz"])
def test_the_selected_records_are_read_again_as_preflight_read_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, chunk: int, by_request: bool
) -> None:
    monkeypatch.setattr(positions_module, "_CHUNK", chunk)
    _write(tmp_path, name, CSV if ".csv" in name else JSONL)
    preflight, records = _preflight(tmp_path)

    every = _positions(preflight, records, {r.row_number for r in records}, by_request)
    assert _read(preflight, every) == records
    some = _read(preflight, _positions(preflight, records, {1, 4}, by_request))
    assert some == [record for record in records if record.row_number in {1, 4}]
    assert _read(preflight, _positions(preflight, records, set(), by_request)) == []


def test_positions_are_kept_only_while_the_selection_is_sparse() -> None:
    sparse, dense = RowPositions(by_request=True), RowPositions(by_request=True)
    for row in range(1, 100_001):
        if row % (DENSE_SHARE * 2) == 0:
            sparse.add(row, row + 1, bytes(16))
        if row % 2 == 0:
            dense.add(row, row + 1, bytes(16))
    assert sparse.kept and len(sparse) == 100_000 // (DENSE_SHARE * 2)
    assert [row for row, _, _ in sparse][:2] == [DENSE_SHARE * 2, DENSE_SHARE * 4]
    assert not dense.kept and len(dense) == 0


def _same_size_rewrite(path: Path, old: bytes, new: bytes) -> None:
    """Replace bytes in place, keeping the size and putting the modification time back."""
    before = path.stat()
    data = path.read_bytes()
    assert len(old) == len(new) and data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _row_4_rewritten(tmp_path: Path, name: str) -> tuple[Path, Preflight, list[Record]]:
    """Preflight of `name`, then its row 4 rewritten in place where size and time cannot show it."""
    body, old, new = (CSV, b'4,"x\ny', b'7,"x\ny') if name == "a.csv" else (JSONL, b'{"id": 4}', b'{"id": 5}')
    path = _write(tmp_path, name, body)
    preflight, records = _preflight(tmp_path)
    _same_size_rewrite(path, old, new)
    return path, preflight, records


@pytest.mark.parametrize("by_request", [True, False], ids=["delta", "shard"])
@pytest.mark.parametrize("name", ["a.csv", "a.jsonl"])
def test_a_row_changed_in_place_is_refused_before_any_row_of_its_region(
    tmp_path: Path, name: str, by_request: bool
) -> None:
    path, preflight, records = _row_4_rewritten(tmp_path, name)
    positions = _positions(preflight, records, {1, 4}, by_request)
    assert preflight.expected_input is not None
    seen: list[Record] = []
    with (
        pytest.raises(InputChanged) as info,
        open_selected(preflight, preflight.expected_input, positions) as selected,
    ):
        seen.extend(selected)
    assert seen == []  # the file is one region: no row of it is handed out
    assert info.value.context["bytes"] == {"first": 0, "last": path.stat().st_size - 1}


@pytest.mark.parametrize("by_request", [True, False], ids=["delta", "shard"])
@pytest.mark.parametrize("name", ["a.csv", "a.jsonl"])
def test_a_selected_row_unlike_its_token_is_refused_naming_its_line(
    tmp_path: Path, name: str, by_request: bool
) -> None:
    """Behind the region check, each selected row is checked against its token: here the regions are
    those of the rewritten bytes, as if preflight had read them, so only the token can tell."""
    path, preflight, records = _row_4_rewritten(tmp_path, name)
    line = next(record.line for record in records if record.row_number == 4)
    positions = _positions(preflight, records, {1, 4}, by_request)
    assert preflight.expected_input is not None
    with open_records(preflight.input_spec, pytest.fail) as stream:  # type: ignore[arg-type]
        list(stream)
        regions = stream.regions()
    expected = replace(preflight.expected_input, regions=regions)
    seen: list[Record] = []
    with pytest.raises(InputChanged) as info, open_selected(preflight, expected, positions) as selected:
        seen.extend(selected)
    assert [record.row_number for record in seen] == [1]  # row 4 never handed out
    assert info.value.context == {"file": str(path), "line": line}
    assert f"line {line}: row 4 is not what preflight read" in info.value.message


def test_a_row_not_selected_changed_in_place_is_caught_at_its_region(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", CSV)
    preflight, records = _preflight(tmp_path)
    positions = _positions(preflight, records, {1, 4}, by_request=True)
    _same_size_rewrite(path, b"3,", b"9,")
    with pytest.raises(InputChanged) as info:
        _read(preflight, positions)
    assert info.value.context["bytes"] == {"first": 0, "last": len(CSV) - 1}


def test_a_file_grown_or_replaced_is_refused_before_a_row_is_read(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", CSV)
    preflight, records = _preflight(tmp_path)
    positions = _positions(preflight, records, {1, 2}, by_request=True)
    with path.open("ab") as out:
        out.write(b"\n6,appended\n")
    with pytest.raises(InputChanged) as info:
        _read(preflight, positions)
    assert "size" in info.value.context["changed"]

    identity = preflight.expected_input.identity if preflight.expected_input else None
    assert identity is not None
    other = tmp_path / "b.csv"
    other.write_bytes(CSV)
    os.utime(other, ns=(identity.mtime_ns, identity.mtime_ns))
    os.replace(other, path)  # the same bytes and times in another file
    with pytest.raises(InputChanged) as info:
        _read(preflight, positions)
    assert list(info.value.context["changed"]) == ["inode"]
