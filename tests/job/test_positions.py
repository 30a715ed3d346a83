"""Tests for reading a run's selected rows again by their line numbers (job/positions.py)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from bulkrelay.errors import InputChanged, Problem
from bulkrelay.job import positions as positions_module
from bulkrelay.job.inputs import ExpectedInput, InputSpec, open_records
from bulkrelay.job.positions import DENSE_SHARE, RowPositions, open_selected
from bulkrelay.job.records import Record

BOM = b"\xef\xbb\xbf"
# Multi-line quoted fields, blank lines, CRLF, a BOM and no newline at the end.
CSV = BOM + b'id,note\r\n1,plain\r\n\r\n2,"two\r\nlines"\r\n3,"a ""quoted"" one"\n\n\n4,"x\ny\nz"\n5,last'
JSONL = BOM + b'{"id": 1}\n{"id": 2, "note": "caf\xc3\xa9"}\r\n{"id": 3}\n{"id": 4}'


def _no_problem(problem: Problem) -> None:
    raise AssertionError(problem)


def _write(tmp_path: Path, name: str, body: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    return path


def _preflight(path: Path) -> tuple[list[Record], ExpectedInput]:
    """Every record, and what the relay must read again."""
    with open_records(InputSpec.detect(path), _no_problem) as stream:
        records = list(stream)
        expected = ExpectedInput(stream.fingerprint(), stream.identity())
    return records, expected


def _positions(records: list[Record], rows: set[int]) -> RowPositions:
    positions = RowPositions()
    for record in records:
        if record.row_number in rows:
            positions.add(record)
    return positions


def _read(path: Path, expected: ExpectedInput, positions: RowPositions) -> list[Record]:
    with open_selected(InputSpec.detect(path), expected, positions) as records:
        return list(records)


@pytest.mark.parametrize("chunk", [5, 1 << 20])  # 5 bytes: lines (and CRLFs) cut across chunks
@pytest.mark.parametrize(
    ("name", "body"), [("a.csv", CSV), ("a.jsonl", JSONL), ("a.csv.gz", CSV), ("a.jsonl.gz", JSONL)]
)
def test_the_selected_records_are_read_again_as_preflight_read_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: bytes, chunk: int
) -> None:
    monkeypatch.setattr(positions_module, "_CHUNK", chunk)
    path = _write(tmp_path, name, body)
    records, expected = _preflight(path)

    assert _read(path, expected, _positions(records, {r.row_number for r in records})) == records
    some = _read(path, expected, _positions(records, {1, 4}))
    assert some == [record for record in records if record.row_number in {1, 4}]
    assert _read(path, expected, _positions(records, set())) == []


def test_positions_are_kept_only_while_the_selection_is_sparse() -> None:
    sparse, dense = RowPositions(), RowPositions()
    for row in range(1, 100_001):
        record = Record(row, row + 1, {"id": str(row)})
        if row % (DENSE_SHARE * 2) == 0:
            sparse.add(record)
        if row % 2 == 0:
            dense.add(record)
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


@pytest.mark.parametrize(
    ("name", "body", "old", "new"),
    [("a.csv", CSV, b'4,"x\ny', b'4,"q\ny'), ("a.jsonl", JSONL, b'{"id": 4}', b'{"id": 5}')],
)
def test_a_selected_row_changed_in_place_is_refused_naming_its_line(
    tmp_path: Path, name: str, body: bytes, old: bytes, new: bytes
) -> None:
    path = _write(tmp_path, name, body)
    records, expected = _preflight(path)
    line = next(record.line for record in records if record.row_number == 4)
    _same_size_rewrite(path, old, new)  # what size and modification time cannot show
    seen: list[Record] = []
    positions = _positions(records, {1, 4})
    with (
        pytest.raises(InputChanged) as info,
        open_selected(InputSpec.detect(path), expected, positions) as selected,
    ):
        seen.extend(selected)
    assert [record.row_number for record in seen] == [1]  # row 4 never handed out
    assert info.value.context == {"file": str(path), "line": line}
    assert f"line {line}: row 4 is not what preflight read" in info.value.message


def test_a_row_not_selected_changed_in_place_is_caught_by_the_hash_at_the_end(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", CSV)
    records, expected = _preflight(path)
    _same_size_rewrite(path, b"3,", b"9,")
    with pytest.raises(InputChanged) as info:
        _read(path, expected, _positions(records, {1, 4}))
    assert list(info.value.context["changed"]) == ["sha256"]


def test_a_file_grown_or_replaced_is_refused_before_a_row_is_read(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", CSV)
    records, expected = _preflight(path)
    positions = _positions(records, {1, 2})
    with path.open("ab") as out:
        out.write(b"\n6,appended\n")
    with pytest.raises(InputChanged) as info:
        _read(path, expected, positions)
    assert "size" in info.value.context["changed"]

    other = tmp_path / "b.csv"
    other.write_bytes(CSV)
    os.utime(other, ns=(expected.identity.mtime_ns, expected.identity.mtime_ns))
    os.replace(other, path)  # the same bytes and times in another file
    with pytest.raises(InputChanged) as info:
        _read(path, expected, positions)
    assert list(info.value.context["changed"]) == ["inode"]
