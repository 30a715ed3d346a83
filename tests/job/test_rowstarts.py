"""A worker parses only its own chunks of a CSV's rows (job/inputs/rowstarts.py): together the workers
read every row once, each at the row number and line preflight gave it, and each stream ends with the
input's fingerprint, row count included, as preflight read it; a changed byte in a chunk a worker steps
over still stops it."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from bulkrelay.errors import InputChanged, Problem
from bulkrelay.job.inputs import ExpectedInput, InputSpec, open_records, rowstarts
from bulkrelay.job.inputs.rowstarts import ChunkShare, RowStartsBuilder
from bulkrelay.job.records import Record


def _awkward_csv(rows: int, seed: int = 7) -> bytes:
    """Rows of one line and of several (a quoted value holding newlines), blank lines between some,
    CRLF ends on others: a row's line is not its row number."""
    chance = random.Random(seed)
    out = [b"id,text\r\n", b"\n"]
    for row in range(1, rows + 1):
        text = b'"line one\nline two\n"' if chance.random() < 0.2 else b"plain %d" % row
        out.append(b"%d,%s%s" % (row, text, b"\r\n" if chance.random() < 0.3 else b"\n"))
        if chance.random() < 0.1:
            out.append(b"\n")
    return b"".join(out)


def _write(tmp_path: Path, name: str, body: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    return path


def _preflight(path: Path) -> tuple[list[Record], ExpectedInput]:
    with open_records(InputSpec.detect(path), _refused) as stream:
        records = list(stream)
        expected = ExpectedInput(
            stream.fingerprint(), stream.identity(), stream.regions(), stream.row_starts()
        )
    return records, expected


def _refused(problem: Problem) -> None:
    raise AssertionError(problem)


def _worker_reads(path: Path, expected: ExpectedInput, index: int, count: int) -> list[Record]:
    assert expected.row_starts is not None
    share = ChunkShare(expected.row_starts, index, count, expected.fingerprint.record_count)
    with open_records(InputSpec.detect(path), _refused, expected, share) as stream:
        records = list(stream)  # the stream's end checks the fingerprint, row count included
    assert all(share.owns(record.row_number) for record in records)
    return records


def _jsonl(rows: int) -> bytes:
    return b"".join(b'{"id": %d, "text": "%s"}\n' % (row, b"x" * (row % 50)) for row in range(1, rows + 1))


@pytest.mark.parametrize("name", ["a.csv", "a.csv.gz", "a.jsonl", "a.jsonl.gz"])
@pytest.mark.parametrize("rows", [1, 31, 32, 33, 64, 1000, 4099])
def test_the_workers_together_read_every_row_once_as_preflight_did(
    tmp_path: Path, name: str, rows: int
) -> None:
    body = _awkward_csv(rows) if ".csv" in name else _jsonl(rows)
    path = _write(tmp_path, name, body)
    records, expected = _preflight(path)
    assert len(records) == rows
    for count in (2, 3, 8):
        read = [record for index in range(count) for record in _worker_reads(path, expected, index, count)]
        assert sorted(read) == records  # row number, line and fields alike


def test_a_changed_byte_where_a_worker_steps_over_still_stops_it(tmp_path: Path) -> None:
    body = _awkward_csv(20_000)
    path = _write(tmp_path, "a.csv", body)
    records, expected = _preflight(path)
    at = body.index(b"\n%d," % records[100].row_number) + 1  # in worker 1's chunk of rows 97-128 of 2
    path.write_bytes(body[:at] + b"9" + body[at + 1 :])
    with pytest.raises(InputChanged):
        _worker_reads(path, expected, 0, 2)


def test_the_starts_stay_few_however_long_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rowstarts, "_MOST_STARTS", 1000)
    starts = RowStartsBuilder()
    for row in range(1, 200_001):
        if row == starts.next_row:
            starts.add(row + 1)  # each row starts on the line after its number (a header first)
    kept = starts.starts()
    assert len(kept.lines) <= 1000 and kept.chunk == 256
    assert all(kept.lines[c] == c * kept.chunk + 2 for c in range(len(kept.lines)))
