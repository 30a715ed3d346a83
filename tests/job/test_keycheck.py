"""Duplicate keys in bounded memory: the Bloom filter only nominates, the second pass decides."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import Problem
from bulkrelay.job import keycheck
from bulkrelay.job.inputs import InputSpec, open_records
from bulkrelay.job.records import Record


def _find(tmp_path: Path, ids: list[str], *, in_order: bool = False) -> tuple[list[Problem], list[Problem]]:
    """The first pass's problems and the duplicates; `in_order` lets the finder skip keys in order."""
    path = tmp_path / "in.csv"
    path.write_text("id,x\n" + "".join(f"{i},v\n" for i in ids))
    spec = InputSpec(path=path, format="csv", gzip=False)
    finder = keycheck.DuplicateKeyFinder("id", str(path), spec if in_order else None)
    first_pass: list[Problem] = []
    with open_records(spec, first_pass.append) as stream:
        for record in stream:
            if (problem := finder.add(record)) is not None:
                first_pass.append(problem)
    return first_pass, finder.duplicates(spec)


def test_distinct_keys_report_nothing(tmp_path: Path) -> None:
    assert _find(tmp_path, [str(n) for n in range(5000)]) == ([], [])


def test_a_duplicate_names_its_row_and_the_first(tmp_path: Path) -> None:
    _, duplicates = _find(tmp_path, ["a", "b", "c", "b", "d", "b"])
    assert [(p.row, p.line) for p in duplicates] == [(4, 5), (6, 7)]
    assert "first at row 2" in duplicates[0].message


def test_missing_key_is_reported_in_the_first_pass(tmp_path: Path) -> None:
    first_pass, _ = _find(tmp_path, ["a", "", "c"])
    assert [(p.row, p.field) for p in first_pass] == [(2, "id")]


def test_false_candidates_are_never_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 16-word filter makes almost every value a candidate; only the exact pass may report.
    monkeypatch.setattr(keycheck, "_MASK", (1 << 4) - 1)
    ids = [str(n) for n in range(300)] + ["17"]
    _, duplicates = _find(tmp_path, ids)
    assert [(p.row, p.message) for p in duplicates] == [(301, "duplicate key value '17' (first at row 18)")]


def test_the_second_pass_stops_after_the_last_candidate_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every repeat of a value is itself a candidate row, so nothing after the last one matters."""
    read: list[int] = []

    def counted(records: Iterable[Record]) -> Iterator[Record]:
        for record in records:
            read.append(record.row_number)
            yield record

    @contextmanager
    def counting_open(spec: InputSpec, on_problem: Callable[[Problem], None]) -> Iterator[Iterator[Record]]:
        with open_records(spec, on_problem) as stream:
            yield counted(stream)

    monkeypatch.setattr(keycheck, "open_records", counting_open)
    ids = ["a", "b", "a", "c", "b", "a"] + [str(n) for n in range(2000)]
    _, duplicates = _find(tmp_path, ids)
    assert [(p.row, p.message) for p in duplicates] == [
        (3, "duplicate key value 'a' (first at row 1)"),
        (5, "duplicate key value 'b' (first at row 2)"),
        (6, "duplicate key value 'a' (first at row 1)"),
    ]
    assert max(read) <= 7 < len(ids)


def test_keys_in_order_are_distinct_without_the_filter_or_a_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[InputSpec] = []

    def counting_open(spec: InputSpec, on_problem: Callable[[Problem], None]) -> Any:
        opened.append(spec)
        return open_records(spec, on_problem)

    monkeypatch.setattr(keycheck, "open_records", counting_open)
    monkeypatch.setattr(keycheck, "_MASK", (1 << 4) - 1)  # a filter would nominate nearly every key
    assert _find(tmp_path, [str(n) for n in range(1, 3000)], in_order=True) == ([], [])  # 9 < 10
    assert opened == []


@pytest.mark.parametrize("in_order", [True, False])
def test_a_key_out_of_order_finds_repeats_of_the_rows_before(tmp_path: Path, in_order: bool) -> None:
    ids = [f"k{n:04}" for n in range(1, 3001)] + ["k0017", "k2999", "k5000", "k5000", "k0001"]
    _, duplicates = _find(tmp_path, ids, in_order=in_order)
    assert [(p.row, p.message) for p in duplicates] == [
        (3001, "duplicate key value 'k0017' (first at row 17)"),
        (3002, "duplicate key value 'k2999' (first at row 2999)"),
        (3004, "duplicate key value 'k5000' (first at row 3003)"),
        (3005, "duplicate key value 'k0001' (first at row 1)"),
    ]


def test_a_repeat_right_after_itself_and_a_missing_key_in_order(tmp_path: Path) -> None:
    first_pass, duplicates = _find(tmp_path, ["1", "2", "", "4", "4", "3"], in_order=True)
    assert [(p.row, p.field) for p in first_pass] == [(3, "id")]
    assert [(p.row, p.message) for p in duplicates] == [(5, "duplicate key value '4' (first at row 4)")]


def test_a_repeat_in_an_input_otherwise_in_order(tmp_path: Path) -> None:
    _, duplicates = _find(tmp_path, ["1", "2", "2", "3"], in_order=True)
    assert [(p.row, p.message) for p in duplicates] == [(3, "duplicate key value '2' (first at row 2)")]


def _peak_bytes_of(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_keys_in_order_never_make_the_filter(tmp_path: Path) -> None:
    """A sorted input (the common export ordered by id) pays neither the filter's 16 MiB nor its tables;
    the first key out of order makes it, and repeats are still found."""
    in_order = [str(n) for n in range(1, 2000)]
    assert _peak_bytes_of(lambda: _find(tmp_path, in_order, in_order=True)) < 4 << 20
    found: list[tuple[list[Problem], list[Problem]]] = []
    assert _peak_bytes_of(lambda: found.append(_find(tmp_path, [*in_order, "7"], in_order=True))) > 16 << 20
    assert [(p.row, p.message) for p in found[0][1]] == [(2000, "duplicate key value '7' (first at row 7)")]
