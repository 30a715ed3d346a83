"""A gzip bomb meets the line limit while it is read: one line inflating far past MAX_LINE_BYTES is refused
naming its line, and the process that read it never held the line (its peak RSS, measured by wait4)."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import orjson
import pytest
import yaml

from bulkrelay.errors import Problem
from bulkrelay.job.inputs import InputSpec, open_records
from bulkrelay.job.inputs.lines import MAX_LINE_BYTES, TOO_LONG, line_blocks
from tests.clirun import run_cli_peak_rss
from tests.jobfiles import base_job, write_gzip_bomb

_BOMB_LINE = 160 << 20  # ten times the limit: held whole, it would dwarf the bound asserted below
_BOUND = 96 << 20  # what reading the bomb may add to a small input's peak RSS: the limit and its copies


def _validate_peak_rss(tmp_path: Path, input_name: str) -> tuple[int, dict[str, object], int]:
    """`bulkrelay validate` of a job reading `input_name`: exit code, envelope, peak RSS in bytes."""
    job = base_job("http://127.0.0.1:9", input_name)
    job_path = tmp_path / f"{input_name}.yaml"
    job_path.write_text(yaml.safe_dump(job, sort_keys=False))
    return run_cli_peak_rss("validate", job_path, cwd=tmp_path)


def _small(tmp_path: Path, name: str, data: bytes) -> str:
    (tmp_path / name).write_bytes(gzip.compress(data))
    return name


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_gzip_bomb_of_one_line_is_refused_naming_it_in_bounded_memory(tmp_path: Path, fmt: str) -> None:
    if fmt == "csv":
        head = b'id,email,name\n1,a@example.com,A\n2,"'
        tail = b'",B\n3,c@example.com,C\n'
        good = head.split(b"\n2,")[0] + b"\n"
        line, row = 3, 2
    else:
        head = b'{"id": "1", "email": "a@example.com", "name": "A"}\n{"id": "2", "email": "'
        tail = b'", "name": "B"}\n{"id": "3", "email": "c@example.com", "name": "C"}\n'
        good = head.split(b"\n")[0] + b"\n"
        line, row = 2, 2
    bomb = write_gzip_bomb(tmp_path / f"bomb.{fmt}.gz", head, _BOMB_LINE, tail)
    assert bomb.stat().st_size < _BOMB_LINE // 200  # a bomb indeed: under 1 MB inflating to 160 MiB

    code, base_envelope, base_rss = _validate_peak_rss(tmp_path, _small(tmp_path, f"ok.{fmt}.gz", good))
    assert code == 0, base_envelope
    code, envelope, bomb_rss = _validate_peak_rss(tmp_path, bomb.name)

    assert code == 2, envelope
    error = envelope["error"]
    assert isinstance(error, dict) and error["code"] == "INPUT_INVALID"
    problems = error["context"]["problems"]
    assert [(p["line"], p["row"]) for p in problems] == [(line, row)], problems
    assert "longer than 16,777,216 bytes" in problems[0]["message"]
    assert bomb_rss - base_rss < _BOUND, (bomb_rss, base_rss)


def _blocks(data: bytes, limit: int) -> list[bytes]:
    return [line for block in line_blocks(io.BytesIO(data), limit) for line in block]


def test_line_blocks_keep_every_line_and_stand_in_for_each_too_long_one() -> None:
    data = b"\xef\xbb\xbfab\n" + b"x" * 300_000 + b"\nc\r\n" + b"y" * 70_000 + b"\nlast"
    assert _blocks(data, 100_000) == [b"ab\n", TOO_LONG, b"c\r\n", b"y" * 70_000 + b"\n", b"last"]
    assert _blocks(data, 1 << 20) == data[3:].splitlines(keepends=True)
    assert _blocks(b"z" * 200_001, 200_000) == [TOO_LONG]
    assert _blocks(b"", 10) == []


def test_a_long_line_within_the_limit_is_read_whole(tmp_path: Path) -> None:
    value = "v" * (MAX_LINE_BYTES // 2)
    path = tmp_path / "wide.jsonl"
    path.write_bytes(orjson.dumps({"id": "1", "note": value}) + b"\n")
    problems: list[Problem] = []
    with open_records(InputSpec.detect(path), problems.append) as stream:
        records = list(stream)
    assert problems == [] and records[0].fields["note"] == value
