"""RowSet: a bitset of row numbers 1..size."""

from __future__ import annotations

import pytest

from bulkrelay.store.rowset import RowSet


def test_add_contains_and_count() -> None:
    rows = RowSet(20)
    assert rows.add(1) is True
    assert rows.add(20) is True
    assert rows.add(1) is False  # already there: a duplicate
    assert 1 in rows and 20 in rows
    assert 2 not in rows and 0 not in rows and 21 not in rows and "1" not in rows
    assert rows.count == len(rows) == 2


@pytest.mark.parametrize("row", [0, -1, 11])
def test_add_out_of_range_is_refused(row: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        RowSet(10).add(row)


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 15, 16, 17, 100])
def test_missing_of_an_empty_set_is_every_row(size: int) -> None:
    assert list(RowSet(size).missing()) == list(range(1, size + 1))


@pytest.mark.parametrize("size", [1, 7, 8, 9, 64, 1000])
def test_missing_of_a_full_set_is_empty(size: int) -> None:
    rows = RowSet(size)
    for n in range(1, size + 1):
        rows.add(n)
    assert list(rows.missing()) == []
    assert rows.count == size


def test_missing_is_the_exact_complement_in_order() -> None:
    size = 1003
    rows = RowSet(size)
    present = {n for n in range(1, size + 1) if n % 7 in (0, 3) or 200 <= n <= 600}
    for n in sorted(present, reverse=True):
        rows.add(n)
    assert list(rows.missing()) == [n for n in range(1, size + 1) if n not in present]
    assert rows.count == len(present)


def test_a_million_rows_fit_in_125_kilobytes() -> None:
    rows = RowSet(1_000_000)
    assert len(rows._bits) <= 125_001
    for n in range(1, 1_000_001, 2):
        rows.add(n)
    missing = rows.missing()
    assert next(missing) == 2
    assert sum(1 for _ in missing) == 499_999


def test_union_complement_and_bytes_round_trip() -> None:
    left, right = RowSet(20), RowSet(20)
    for row in (1, 5, 9):
        left.add(row)
    for row in (5, 17, 20):
        right.add(row)
    merged = left.union(right)
    assert sorted(set(range(1, 21)) - set(merged.missing())) == [1, 5, 9, 17, 20]
    assert len(merged) == 5
    inverse = merged.complement()
    assert len(inverse) == 15
    assert 5 not in inverse and 6 in inverse and 20 not in inverse
    assert list(inverse.missing()) == [1, 5, 9, 17, 20]
    again = RowSet.from_bytes(20, merged.to_bytes())
    assert len(again) == 5 and list(again.missing()) == list(merged.missing())


def test_add_all_adds_every_row_and_names_the_first_already_there() -> None:
    rows = RowSet(10)
    assert rows.add_all([3, 1, 9]) is None
    assert [row for row in range(1, 11) if row in rows] == [1, 3, 9] and len(rows) == 3
    assert rows.add_all([4, 9, 5]) == 9  # 4 added, stopped at 9, 5 not added
    assert [row for row in range(1, 11) if row in rows] == [1, 3, 4, 9] and len(rows) == 4


@pytest.mark.parametrize("row", [0, 11, -1])
def test_add_all_refuses_a_row_out_of_range_keeping_the_count_true(row: int) -> None:
    rows = RowSet(10)
    with pytest.raises(ValueError, match="outside"):
        rows.add_all([2, row])
    assert [row for row in range(1, 11) if row in rows] == [2] and len(rows) == 1


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 16, 1000])
def test_highest_is_the_highest_row_added_never_a_padding_bit(size: int) -> None:
    rows = RowSet(size)
    assert rows.highest() == 0
    for row in sorted({1, size // 2, size} & set(range(1, size + 1))):
        rows.add(row)
        assert rows.highest() == row
    assert RowSet.from_bytes(size, rows.to_bytes()).highest() == size  # 0 for no rows


def test_highest_of_a_complement_is_its_highest_missing_row() -> None:
    rows = RowSet(10)
    rows.add_all([1, 2, 9, 10])
    assert rows.complement().highest() == 8
