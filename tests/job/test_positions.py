"""Tests for reading a run's selected rows by their byte offsets (job/positions.py) and the offsets
the streaming reader reports for them."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from bulkrelay.errors import InputChanged, Problem
from bulkrelay.job.inputs import ExpectedInput, InputSpec, open_records
from bulkrelay.job.positions import DENSE_SHARE, RowPositions, open_selected
from bulkrelay.job.records import Record

BOM = b"\xef\xbb\xbf"
# Multi-line quoted fields, blank lines, CRLF and a BOM: a record's offset is its first line's.
CSV = BOM + b'id,note\r\n1,plain\r\n\r\n2,"two\r\nlines"\r\n3,"a ""quoted"" one"\n\n\n4,"x\ny\nz"\n5,last'
JSONL = BOM + b'{"id": 1}\n{"id": 2, "note": "caf\xc3\xa9"}\r\n{"id": 3}\n{"id": 4}'


def _no_problem(problem: Problem) -> None:
    raise AssertionError(problem)


def _preflight(path: Path) -> tuple[list[tuple[Record, int | None]], ExpectedInput]:
    """Every record with the offset the reader gave it, and what the relay must read again."""
    spec = InputSpec.detect(path)
    with open_records(spec, _no_problem, offsets=True) as stream:
        located = [(record, stream.record_offset) for record in stream]
        expected = ExpectedInput(stream.fingerprint(), stream.identity())
    return located, expected


def _positions(located: list[tuple[Record, int | None]], rows: set[int]) -> RowPositions:
    positions = RowPositions()
    for record, offset in located:
        if record.row_number in rows:
            positions.add(record, offset)
    return positions


def _read(path: Path, expected: ExpectedInput, positions: RowPositions) -> list[Record]:
    with open_selected(InputSpec.detect(path), expected, positions) as records:
        return list(records)


@pytest.mark.parametrize(("name", "body"), [("a.csv", CSV), ("a.jsonl", JSONL)])
def test_each_record_is_read_again_at_its_offset_as_preflight_read_it(
    tmp_path: Path, name: str, body: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(body)
    located, expected = _preflight(path)
    assert all(offset is not None for _, offset in located)

    every = _read(path, expected, _positions(located, {r.row_number for r, _ in located}))
    assert every == [record for record, _ in located]
    some = _read(path, expected, _positions(located, {2, 4}))
    assert [record.row_number for record in some] == [2, 4]
    assert some == [record for record, _ in located if record.row_number in {2, 4}]


def test_a_gzip_input_has_no_offsets_and_its_positions_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "a.csv.gz"
    path.write_bytes(gzip.compress(b"id\n1\n2\n"))
    located, _ = _preflight(path)
    assert [offset for _, offset in located] == [None, None]
    positions = _positions(located, {1})
    assert not positions.kept and len(positions) == 0


def test_positions_are_kept_only_while_the_selection_is_sparse() -> None:
    sparse, dense = RowPositions(), RowPositions()
    for row in range(1, 100_001):
        record = Record(row, row + 1, {"id": str(row)})
        if row % (DENSE_SHARE * 2) == 0:
            sparse.add(record, row * 10)
        if row % 2 == 0:
            dense.add(record, row * 10)
    assert sparse.kept and len(sparse) == 100_000 // (DENSE_SHARE * 2)
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
    [
        ("a.csv", CSV, b'4,"x\ny', b'4,"q\ny'),
        ("a.jsonl", JSONL, b'{"id": 4}', b'{"id": 5}'),
    ],
)
def test_a_selected_row_changed_in_place_is_refused_naming_its_line(
    tmp_path: Path, name: str, body: bytes, old: bytes, new: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(body)
    located, expected = _preflight(path)
    line = next(record.line for record, _ in located if record.row_number == 4)
    _same_size_rewrite(path, old, new)  # what size and modification time cannot show
    with pytest.raises(InputChanged) as info:
        _read(path, expected, _positions(located, {1, 4}))
    assert info.value.context == {"file": str(path), "line": line}
    assert f"line {line}: row 4 is not what preflight read" in info.value.message


def test_a_file_grown_or_replaced_is_refused_before_a_row_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(CSV)
    located, expected = _preflight(path)
    positions = _positions(located, {1, 2})
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
