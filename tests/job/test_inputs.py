"""Tests for the streaming input readers: formats, row and line numbers, problems, gzip, stdin."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
from pathlib import Path

import pytest

from bulkrelay.errors import InputChanged, InputInvalid, NotFound, Problem, StorageFailed, UsageError
from bulkrelay.job.inputs import (
    REGION_SIZE,
    ExpectedInput,
    InputFingerprint,
    InputSpec,
    detect_format,
    open_records,
    spool_stdin,
)
from bulkrelay.job.records import Record


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def _read(spec: InputSpec) -> tuple[list[Record], list[Problem], InputFingerprint]:
    problems: list[Problem] = []
    with open_records(spec, problems.append) as stream:
        records = list(stream)
        fingerprint = stream.fingerprint()
    return records, problems, fingerprint


def _read_file(
    tmp_path: Path, name: str, data: bytes, **spec: str
) -> tuple[list[Record], list[Problem], InputFingerprint]:
    path = _write(tmp_path, name, data)
    return _read(InputSpec.detect(path, declared=spec.get("declared"), delimiter=spec.get("delimiter", ",")))


# --- format detection -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "declared", "expected"),
    [
        ("a.csv", None, ("csv", False)),
        ("a.CSV.GZ", None, ("csv", True)),
        ("dir.v2/a.jsonl", None, ("jsonl", False)),
        ("a.ndjson", None, ("jsonl", False)),
        ("a.ndjson.gz", None, ("jsonl", True)),
        ("a.csv", "jsonl", ("jsonl", False)),
        ("a.txt", "ndjson", ("jsonl", False)),
        ("a.txt.gz", "CSV", ("csv", True)),
        ("-", "csv", ("csv", False)),
    ],
)
def test_detect_format(name: str, declared: str | None, expected: tuple[str, bool]) -> None:
    assert detect_format(name, declared) == expected


@pytest.mark.parametrize("name", ["a.json", "a.gz", "data", "-", "a.txt.gz"])
def test_detect_format_unknown_extension_names_the_file(name: str) -> None:
    with pytest.raises(UsageError) as info:
        detect_format(name, None)
    assert name in info.value.message
    assert info.value.context == {"file": name}


def test_detect_format_unknown_declared_format() -> None:
    with pytest.raises(UsageError, match="'xml'"):
        detect_format("a.csv", "xml")


@pytest.mark.parametrize("delimiter", ["", ";;", '"', "\n"])
def test_bad_delimiter_is_a_usage_error(tmp_path: Path, delimiter: str) -> None:
    with pytest.raises(UsageError):
        InputSpec(tmp_path / "a.csv", "csv", False, delimiter=delimiter)


# --- CSV ----------------------------------------------------------------------------------------------


def test_csv_happy_path_with_bom(tmp_path: Path) -> None:
    records, problems, _ = _read_file(
        tmp_path, "a.csv", b'\xef\xbb\xbf"id",name\r\n1,Ann\r\n2,"Bob, Jr."\r\n'
    )
    assert problems == []
    assert records == [
        Record(1, 2, {"id": "1", "name": "Ann"}),
        Record(2, 3, {"id": "2", "name": "Bob, Jr."}),
    ]


def test_csv_values_stay_strings(tmp_path: Path) -> None:
    records, _, _ = _read_file(tmp_path, "a.csv", b"n,flag\n42,true\n")
    assert records[0].fields == {"n": "42", "flag": "true"}


def test_csv_header_names_are_only_ever_data(tmp_path: Path) -> None:
    """Each row's dict is built by a function compiled for the header: its names must stay names."""
    names = ["r[0]", "_0", "}", "'); import os #", "x\ny", "\u65e5\u672c", " id "]
    header = ",".join('"' + name.replace('"', '""') + '"' for name in names)
    records, problems, _ = _read_file(tmp_path, "a.csv", f"{header}\n1,2,3,4,5,6,7\n".encode())
    assert problems == []
    assert records == [Record(1, 3, dict(zip(names, "1234567", strict=True)))]


def test_csv_a_very_wide_header_still_reads(tmp_path: Path) -> None:
    names = [f"c{n}" for n in range(3000)]
    data = (",".join(names) + "\n" + ",".join(str(n) for n in range(3000)) + "\n").encode()
    records, problems, _ = _read_file(tmp_path, "a.csv", data)
    assert problems == []
    assert records[0].fields == {f"c{n}": str(n) for n in range(3000)}
    assert list(records[0].fields) == names


def test_csv_custom_delimiter(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.csv", b"id;name\n1;A,B\n", delimiter=";")
    assert problems == []
    assert records == [Record(1, 2, {"id": "1", "name": "A,B"})]


def test_csv_multiline_field_reports_starting_line(tmp_path: Path) -> None:
    data = b'id,note\n1,"line one\nline two\nline three"\n2,plain\n3,"a\r\nb"\n'
    records, problems, _ = _read_file(tmp_path, "a.csv", data)
    assert problems == []
    assert [(r.row_number, r.line) for r in records] == [(1, 2), (2, 5), (3, 6)]
    assert records[0].fields["note"] == "line one\nline two\nline three"
    assert records[2].fields["note"] == "a\r\nb"


def test_csv_blank_lines_are_skipped_and_lines_still_count(tmp_path: Path) -> None:
    records, problems, fingerprint = _read_file(tmp_path, "a.csv", b"\nid\n\n1\n\r\n\n2\n")
    assert problems == []
    assert [(r.row_number, r.line, r.fields["id"]) for r in records] == [(1, 4, "1"), (2, 7, "2")]
    assert fingerprint.record_count == 2


def test_csv_ragged_rows_are_reported_and_keep_their_row_number(tmp_path: Path) -> None:
    records, problems, fingerprint = _read_file(tmp_path, "a.csv", b"a,b,c\n1,2,3\n4,5\n6,7,8,9\n10,11,12\n")
    assert [r.row_number for r in records] == [1, 4]
    assert records[1].line == 5
    assert [(p.line, p.row) for p in problems] == [(3, 2), (4, 3)]
    assert problems[0].message == "expected 3 fields (as in the header), got 2"
    assert problems[1].message == "expected 3 fields (as in the header), got 4"
    assert problems[0].file == str(tmp_path / "a.csv")
    assert fingerprint.record_count == 4


def test_csv_duplicate_header_stops_reading(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.csv", b"id,name,id\n1,a,2\n")
    assert records == []
    assert len(problems) == 1
    assert (problems[0].line, problems[0].field, problems[0].message) == (1, "id", "duplicate header")


@pytest.mark.parametrize("header", [b"id,,name", b"id, ,name"])
def test_csv_empty_header_name_stops_reading(tmp_path: Path, header: bytes) -> None:
    records, problems, _ = _read_file(tmp_path, "a.csv", header + b"\n1,2,3\n")
    assert records == []
    assert [(p.line, p.message) for p in problems] == [(1, "header column 2 has no name")]


@pytest.mark.parametrize("data", [b"", b"\n\n", b"\xef\xbb\xbf", b"id,name\n", b"id,name\n\n\n"])
def test_csv_without_records_is_a_problem(tmp_path: Path, data: bytes) -> None:
    records, problems, fingerprint = _read_file(tmp_path, "a.csv", data)
    assert records == []
    assert [(p.message, p.file) for p in problems] == [("input has no records", str(tmp_path / "a.csv"))]
    assert fingerprint.record_count == 0


def test_csv_invalid_utf8_names_the_line_and_reading_goes_on(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.csv", b"id,name\n1,ok\n2,caf\xe9\n3,\xff\xfe\n4,end\n")
    assert [(r.row_number, r.line, r.fields["name"]) for r in records] == [(1, 2, "ok"), (4, 5, "end")]
    assert [(p.line, p.row) for p in problems] == [(3, 2), (4, 3)]
    assert problems[0].message.startswith("invalid UTF-8")


def test_csv_invalid_utf8_in_header(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.csv", b"id,n\xe4me\n1,2\n")
    assert records == []
    assert len(problems) == 1
    assert problems[0].line == 1
    assert problems[0].message.startswith("invalid UTF-8")


def test_csv_malformed_quoting_is_reported_at_the_record_start(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.csv", b'id,name\n1,"a"b\n2,ok\n3,"never closed\n4,x\n')
    assert [(r.row_number, r.line) for r in records] == [(2, 3)]
    assert [(p.line, p.row) for p in problems] == [(2, 1), (4, 3)]
    assert all(p.message.startswith("malformed CSV") for p in problems)


@pytest.mark.parametrize(
    ("data", "line", "where"),
    [(b"id,name\r1,a\r2,b\r", 1, "header"), (b"id,name\n1,a\r2,b\n", 2, "row")],
)
def test_csv_a_carriage_return_outside_quotes_is_explained(
    tmp_path: Path, data: bytes, line: int, where: str
) -> None:
    """CR-only line ends (or a stray CR) got the csv module's advice about Python's newline mode."""
    _, problems, _ = _read_file(tmp_path, "a.csv", data)
    assert [p.line for p in problems] == [line]
    message = problems[0].message
    assert message.startswith("malformed CSV header: " if where == "header" else "malformed CSV: ")
    assert "carriage return (\\r) outside quotes" in message
    assert "universal-newline" not in message


def test_csv_gzip(tmp_path: Path) -> None:
    records, problems, fingerprint = _read_file(tmp_path, "a.csv.gz", b"id,name\n1,a\n2,b\n")
    assert problems == []
    assert [r.fields for r in records] == [{"id": "1", "name": "a"}, {"id": "2", "name": "b"}]
    assert fingerprint.gzip is True


# --- JSON Lines ---------------------------------------------------------------------------------------


def test_jsonl_happy_path(tmp_path: Path) -> None:
    data = b'\xef\xbb\xbf{"id": 1, "tags": ["a"]}\r\n{"id": 2, "nested": {"x": null}}\n'
    records, problems, fingerprint = _read_file(tmp_path, "a.jsonl", data)
    assert problems == []
    assert records == [
        Record(1, 1, {"id": 1, "tags": ["a"]}),
        Record(2, 2, {"id": 2, "nested": {"x": None}}),
    ]
    assert (fingerprint.format, fingerprint.record_count) == ("jsonl", 2)


def test_jsonl_last_line_without_newline(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.ndjson", b'{"a": 1}\n{"a": 2}')
    assert problems == []
    assert [r.fields["a"] for r in records] == [1, 2]


def test_jsonl_blank_line_is_a_problem(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.jsonl", b'{"a": 1}\n   \n{"a": 3}\n')
    assert [(r.row_number, r.line) for r in records] == [(1, 1), (3, 3)]
    assert [(p.line, p.row, p.message) for p in problems] == [(2, 2, "blank line")]


def test_jsonl_bad_json_names_the_line(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.jsonl", b'{"a": 1}\n{"a": }\n{"a": NaN}\n')
    assert len(records) == 1
    assert [p.line for p in problems] == [2, 3]
    assert problems[0].message.startswith("invalid JSON: ")
    assert "column" in problems[0].message


@pytest.mark.parametrize(
    ("line", "kind"),
    [(b"[1, 2]", "array"), (b'"text"', "string"), (b"3", "number"), (b"null", "null"), (b"true", "boolean")],
)
def test_jsonl_non_object_is_a_problem(tmp_path: Path, line: bytes, kind: str) -> None:
    records, problems, _ = _read_file(tmp_path, "a.jsonl", b'{"a": 1}\n' + line + b"\n")
    assert len(records) == 1
    assert [(p.line, p.message) for p in problems] == [(2, f"expected a JSON object, got {kind}")]


@pytest.mark.parametrize(
    "number",
    [
        b"123456789012345678901234567890",
        b"18446744073709551616",
        b"-9223372036854775809",
        b"-9999999999999999999",
    ],
)
def test_jsonl_an_integer_beyond_64_bits_is_a_problem_not_a_float(tmp_path: Path, number: bytes) -> None:
    """orjson reads such an integer as a float: the id 123456789012345678901234567890 went out as
    1.2345678901234568e+29."""
    data = b'{"id": 1}\n{"id": 2, "big": {"list": [' + number + b"]}}\n"
    records, problems, _ = _read_file(tmp_path, "a.jsonl", data)
    assert [record.fields["id"] for record in records] == [1]
    assert [(p.line, p.row) for p in problems] == [(2, 2)]
    assert (
        problems[0].message
        == f"the integer {number.decode()} is outside the 64-bit range (send it as a string)"
    )


def test_jsonl_integers_at_the_64_bit_limits_and_long_digit_strings_stay_as_they_are(tmp_path: Path) -> None:
    data = b'{"low": -9223372036854775808, "high": 18446744073709551615, "card": "12345678901234567890123"}\n'
    records, problems, _ = _read_file(tmp_path, "a.jsonl", data)
    assert problems == []
    assert records[0].fields == {
        "low": -9223372036854775808,
        "high": 18446744073709551615,
        "card": "12345678901234567890123",
    }


def test_jsonl_empty_file_has_no_records(tmp_path: Path) -> None:
    records, problems, _ = _read_file(tmp_path, "a.jsonl", b"")
    assert records == []
    assert [p.message for p in problems] == ["input has no records"]


def test_jsonl_gzip(tmp_path: Path) -> None:
    records, problems, fingerprint = _read_file(tmp_path, "a.jsonl.gz", b'{"a": 1}\n{"a": 2}\n')
    assert problems == []
    assert [r.fields for r in records] == [{"a": 1}, {"a": 2}]
    assert fingerprint.gzip is True


# --- gzip damage --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "body"),
    [("a.jsonl.gz", b'{"a": 1}\n' * 50_000), ("a.csv.gz", b"a\n" + b"1\n" * 50_000)],
)
def test_truncated_gzip_is_a_problem_and_still_fingerprinted(tmp_path: Path, name: str, body: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(gzip.compress(body)[:-40])
    records, problems, fingerprint = _read(InputSpec.detect(path))
    damage = [p for p in problems if p.message.startswith("cannot decompress the gzip data")]
    assert len(damage) == 1
    assert damage[0].file == str(path)
    assert 0 < len(records) < 50_000
    assert fingerprint.record_count == len(records) + sum(1 for p in problems if p.row is not None)
    assert fingerprint.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert fingerprint.size == path.stat().st_size


def test_plain_data_named_gz_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "a.csv.gz"
    path.write_bytes(b"id\n1\n")
    records, problems, _ = _read(InputSpec.detect(path))
    assert records == []
    assert [p.message.startswith("cannot decompress") for p in problems] == [True]


# --- fingerprint --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a.csv", "a.csv.gz"])
def test_fingerprint_hashes_the_raw_file_bytes(tmp_path: Path, name: str) -> None:
    body = b"id,name\n" + b"".join(b"%d,name %d\n" % (i, i) for i in range(50_000))
    records, problems, fingerprint = _read_file(tmp_path, name, body)
    raw = (tmp_path / name).read_bytes()
    assert problems == []
    assert fingerprint.sha256 == hashlib.sha256(raw).hexdigest()
    assert fingerprint.size == len(raw)
    assert fingerprint.record_count == len(records) == 50_000


def test_fingerprint_covers_the_whole_file_when_reading_stops_early(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", b"id,id\n" + b"1,2\n" * 100_000)
    _, problems, fingerprint = _read(InputSpec.detect(path))
    assert [p.message for p in problems] == ["duplicate header"]
    assert fingerprint.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert fingerprint.size == path.stat().st_size


def test_fingerprint_round_trips_through_a_dict() -> None:
    fingerprint = InputFingerprint(format="csv", gzip=True, sha256="ab" * 32, size=10, record_count=3)
    assert fingerprint.to_dict() == {
        "format": "csv",
        "gzip": True,
        "sha256": "ab" * 32,
        "size": 10,
        "record_count": 3,
    }
    assert InputFingerprint.from_dict(fingerprint.to_dict()) == fingerprint


@pytest.mark.parametrize(("key", "value"), [("size", "10"), ("record_count", True), ("gzip", None)])
def test_fingerprint_from_dict_rejects_bad_values(key: str, value: object) -> None:
    data = InputFingerprint(format="csv", gzip=False, sha256="0" * 64, size=1, record_count=1).to_dict()
    data[key] = value
    with pytest.raises(ValueError, match=key):
        InputFingerprint.from_dict(data)


def test_fingerprint_before_the_end_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.jsonl", b'{"a": 1}\n{"a": 2}\n')
    with open_records(InputSpec.detect(path), lambda p: None) as stream:
        iterator = iter(stream)
        next(iterator)
        with pytest.raises(RuntimeError):
            stream.fingerprint()
        with pytest.raises(RuntimeError):
            iter(stream)


# --- opening, stdin, streaming ------------------------------------------------------------------------


def test_missing_file_is_not_found(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    with pytest.raises(NotFound) as info, open_records(InputSpec.detect(path), lambda p: None):
        pass
    assert str(path) in info.value.message
    assert info.value.context == {"file": str(path)}


def test_directory_is_invalid_input(tmp_path: Path) -> None:
    folder = tmp_path / "dir.csv"
    folder.mkdir()
    with pytest.raises(InputInvalid), open_records(InputSpec.detect(folder), lambda p: None):
        pass


def test_problems_use_the_display_name(tmp_path: Path) -> None:
    path = _write(tmp_path, "spool", b"[1]\n")
    _, problems, _ = _read(InputSpec(path, "jsonl", False, name="<stdin>"))
    assert problems[0].describe() == "<stdin>:1, row 1: expected a JSON object, got array"


def test_spool_stdin_round_trip(tmp_path: Path) -> None:
    body = b"".join(b'{"n": %d}\n' % i for i in range(200_000))
    dest = spool_stdin(tmp_path / "stdin.jsonl", io.BytesIO(body))
    assert dest.read_bytes() == body
    records, problems, fingerprint = _read(InputSpec(dest, "jsonl", False))
    assert problems == []
    assert records[-1] == Record(200_000, 200_000, {"n": 199_999})
    assert fingerprint.sha256 == hashlib.sha256(body).hexdigest()


def test_spool_stdin_failure_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageFailed):
        spool_stdin(tmp_path / "missing-dir" / "stdin", io.BytesIO(b"x"))


@pytest.mark.parametrize("name", ["big.csv", "big.csv.gz", "big.jsonl"])
def test_first_record_arrives_before_the_file_is_read(tmp_path: Path, name: str) -> None:
    if name.startswith("big.csv"):
        body = b"id,text\n" + b"".join(b"%d,%s\n" % (i, b"x" * 40) for i in range(200_000))
    else:
        body = b"".join(b'{"id": %d, "text": "%s"}\n' % (i, b"x" * 40) for i in range(200_000))
    path = _write(tmp_path, name, body)
    size = path.stat().st_size
    with open_records(InputSpec.detect(path), lambda p: None) as stream:
        first = next(iter(stream))
        assert first.row_number == 1
        assert 0 < stream.bytes_read < size // 4


# --- reading again exactly what preflight read ---------------------------------------------------------


def _big_csv(rows: int = 20_000, tag: str = "") -> bytes:
    return b"id,text\n" + b"".join(b"%d,%s%s\n" % (i, tag.encode(), b"x" * 40) for i in range(1, rows + 1))


def _preflight_read(path: Path) -> tuple[list[Record], ExpectedInput]:
    with open_records(InputSpec.detect(path), lambda p: None) as stream:
        records = list(stream)
        expected = ExpectedInput(stream.fingerprint(), stream.identity(), stream.regions())
    return records, expected


def _relay_read(path: Path, expected: ExpectedInput, seen: list[Record]) -> None:
    """Read as the relay does, keeping every record handed out until the reader stops."""

    def on_problem(problem: Problem) -> None:
        raise AssertionError(problem)

    with open_records(InputSpec.detect(path), on_problem, expected) as stream:
        for record in stream:
            seen.append(record)


@pytest.mark.parametrize("name", ["a.csv", "a.csv.gz", "a.jsonl"])
def test_an_unchanged_input_reads_the_same_records_again(tmp_path: Path, name: str) -> None:
    body = _big_csv() if ".csv" in name else b"".join(b'{"n": %d}\n' % i for i in range(20_000))
    path = _write(tmp_path, name, body)
    records, expected = _preflight_read(path)
    seen: list[Record] = []
    _relay_read(path, expected, seen)
    assert seen == records


@pytest.mark.parametrize("name", ["a.csv", "a.csv.gz"])
def test_bytes_appended_after_preflight_are_refused_before_any_record(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, name, _big_csv(50))
    _, expected = _preflight_read(path)
    with path.open("ab") as out:
        out.write(gzip.compress(b"51,appended\n") if name.endswith(".gz") else b"51,appended\n")
    seen: list[Record] = []
    with pytest.raises(InputChanged) as info:
        _relay_read(path, expected, seen)
    assert seen == []
    changed = info.value.context["changed"]
    assert changed["size"]["recorded"] == expected.identity.size < changed["size"]["now"]
    assert f"size {expected.identity.size} -> " in info.value.message and str(path) in info.value.message


@pytest.mark.parametrize("change", ["append", "rewrite_in_place"])
def test_a_change_mid_read_stops_the_reader_before_a_changed_byte(tmp_path: Path, change: str) -> None:
    path = _write(tmp_path, "a.csv", _big_csv())
    records, expected = _preflight_read(path)
    seen: list[Record] = []
    with (
        pytest.raises(InputChanged),
        open_records(InputSpec.detect(path), lambda p: None, expected) as stream,
    ):
        for record in stream:
            seen.append(record)
            if record.row_number == 10:
                if change == "append":
                    with path.open("ab") as out:
                        out.write(b"20001,appended\n")
                else:
                    path.write_bytes(_big_csv(tag="new-"))  # same inode, other bytes
    assert 10 <= len(seen) < len(records)
    assert seen == records[: len(seen)]  # every record handed out is one preflight read


def test_a_file_replaced_by_rename_is_refused_at_the_open(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", _big_csv(50))
    _, expected = _preflight_read(path)
    _write(tmp_path, "b.csv", _big_csv(50)).replace(path)  # same bytes, another file
    with pytest.raises(InputChanged) as info:
        _relay_read(path, expected, [])
    assert "inode" in info.value.context["changed"]


def _rewrite_keeping_size_and_time(path: Path, expected: ExpectedInput, offset: int) -> None:
    """Change the byte at `offset` in place; then put the old modification time back."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(data)
    os.utime(path, ns=(expected.identity.mtime_ns, expected.identity.mtime_ns))


def test_a_change_the_file_times_hide_is_caught_before_any_record(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", _big_csv(50))
    _, expected = _preflight_read(path)
    _rewrite_keeping_size_and_time(path, expected, path.read_bytes().index(b"49,x") + 3)
    seen: list[Record] = []
    with pytest.raises(InputChanged) as info:
        _relay_read(path, expected, seen)
    assert seen == []
    last = expected.identity.size - 1  # one short region: the whole file
    assert info.value.context["bytes"] == {"first": 0, "last": last}
    assert set(info.value.context["changed"]) == {"sha256"}
    assert f"{path} changed during the run: bytes 0-{last} are not the bytes" in info.value.message


@pytest.mark.parametrize("name", ["a.csv", "a.csv.gz"])
def test_a_change_in_a_later_region_stops_the_reader_before_any_record_of_it(
    tmp_path: Path, name: str
) -> None:
    # Random text: its gzip is several regions long too.
    body = b"id,text\n" + b"".join(b"%d,%s\n" % (i, os.urandom(32).hex().encode()) for i in range(100_000))
    path = _write(tmp_path, name, body)
    records, expected = _preflight_read(path)
    assert expected.identity.size > 3 * REGION_SIZE
    _rewrite_keeping_size_and_time(path, expected, 2 * REGION_SIZE + 100)  # in region 2
    seen: list[Record] = []
    with pytest.raises(InputChanged) as info:
        _relay_read(path, expected, seen)
    assert 0 < len(seen) < len(records)
    assert seen == records[: len(seen)]  # every record handed out is one preflight read
    if name == "a.csv":  # nothing handed out from the changed region (rows are 67 bytes)
        assert len(seen) <= body[: 2 * REGION_SIZE].count(b"\n") - 1  # the header is no record
    assert info.value.context["bytes"] == {"first": 2 * REGION_SIZE, "last": 3 * REGION_SIZE - 1}


@pytest.mark.parametrize("size", [10, REGION_SIZE, 2 * REGION_SIZE + 7])
def test_preflight_keeps_the_sha256_of_each_region_of_the_raw_bytes(tmp_path: Path, size: int) -> None:
    header = b"id,text\n"
    body = header + b"1," + b"x" * (size - len(header) - 3) + b"\n"
    path = _write(tmp_path, "a.csv", body)
    _, expected = _preflight_read(path)
    starts = range(0, size, REGION_SIZE)
    assert expected.regions.digests == b"".join(
        hashlib.sha256(body[i : i + REGION_SIZE]).digest() for i in starts
    )
    assert expected.regions.of(len(starts)) is None


def test_a_file_that_changes_while_preflight_reads_it_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", _big_csv())
    with open_records(InputSpec.detect(path), lambda p: None) as stream:
        iterator = iter(stream)
        next(iterator)
        with path.open("ab") as out:
            out.write(b"20001,appended\n")
        list(iterator)
        with pytest.raises(InputChanged) as info:
            stream.identity()
    assert "while it was being read" in info.value.message


def test_a_csv_value_may_be_as_long_as_a_line(tmp_path: Path) -> None:
    """The line limit (16 MiB) holds for CSV as for JSON Lines: a 200 KB value (a JSON blob in a
    column) is read, not refused by the csv module's own 128 KiB field limit."""
    blob = "x" * 200_000
    records, problems, _ = _read_file(tmp_path, "a.csv", f'id,blob\n1,"{blob}"\n2,b\n'.encode())
    assert problems == []
    assert [(r.row_number, len(r.fields["blob"])) for r in records] == [(1, 200_000), (2, 1)]


def test_a_csv_record_of_many_quoted_lines_is_bounded_like_a_line(tmp_path: Path) -> None:
    """A quoted value that never closes, spread over many short lines, would build one record of any
    size: a record longer than the line limit is refused naming where it starts, and reading stops
    (inside an open quote there is no next record to find)."""
    many = (b"x" * 1023 + b"\n") * (17 << 10)  # 17 MiB of 1 KiB lines
    records, problems, _ = _read_file(tmp_path, "a.csv", b'id,v\n1,a\n2,"' + many + b'"\n3,c\n')
    assert [r.row_number for r in records] == [1]
    assert [(p.line, p.row) for p in problems] == [(3, 2)]
    assert problems[0].message.startswith("the record is longer than 16,777,216 bytes")
    records, problems, _ = _read_file(tmp_path, "b.csv", b'id,"v' + many)  # the header's own quote
    assert records == [] and [(p.line, p.row) for p in problems] == [(1, None)]
