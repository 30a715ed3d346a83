"""The line scan keeps the input readers' line limit (MAX_LINE_BYTES): a line longer than it is read past
in chunks and never known, so a gzip bomb of one line costs the scan process no more memory than the
limit, and preflight's own refusal is the one error the night gives."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import orjson
import pytest

from bulkrelay.job.inputs import InputSpec
from bulkrelay.job.inputs.lines import MAX_LINE_BYTES
from bulkrelay.sync import linescan
from bulkrelay.sync.linescan import LINE_DIGEST_SIZE, NO_DIGEST, LineScan, line_digest
from bulkrelay.sync.state import SyncState
from tests.clirun import run_cli_peak_rss
from tests.jobfiles import make_rows, write_csv, write_gzip_bomb, write_job
from tests.sync.nights import DELTA, run_night
from tests.targetproc import TargetProcess

SALT = bytes(range(LINE_DIGEST_SIZE))
KEYS = ("first", "long", "after")
_BOMB_LINE = 160 << 20  # ten times the limit: held whole (the scan held it three times), far past the bound
_BOUND = 96 << 20  # what the bomb may add to a small night's peak RSS, as tests/job/test_input_limits.py


def _lines(data: bytes, limit: int, size: int) -> list[bytes]:
    return [line for block in linescan._blocks(io.BytesIO(data), limit, size) for line in block]


@pytest.mark.parametrize("size", [7, 64, 1 << 20], ids=["7", "64", "1MiB"])
def test_the_scan_s_lines_stand_in_for_each_one_longer_than_the_limit(size: int) -> None:
    """The limit counts a line's newline, as the readers' does (`line_blocks`); a last line has none.
    A line the readers would refuse is never held, however the reads cut it."""
    too_long = linescan._TOO_LONG
    data = b"\xef\xbb\xbfab\n" + b"x" * 40 + b"\nc\r\n" + b"y" * 19 + b"\n" + b"z" * 20 + b"\nlast"
    assert _lines(data, 20, size) == [b"ab", too_long, b"c\r", b"y" * 19, too_long, b"last"]
    assert _lines(data, 1 << 10, size) == data[3:].split(b"\n")
    assert _lines(b"w" * 21, 20, size) == [too_long]
    assert _lines(b"w" * 20, 20, size) == [b"w" * 20]
    assert _lines(b"\xef\xbb\xbf" + b"v" * 30 + b"\n", 20, size) == [too_long]
    assert _lines(b"", 20, size) == []


@pytest.mark.slow  # the scan's own process
def test_a_line_past_the_limit_is_unknown_and_the_lines_after_it_keep_their_verdicts(tmp_path: Path) -> None:
    long = orjson.dumps({"id": "long", "v": "x" * MAX_LINE_BYTES})
    first, after = b'{"id": "first"}', b'{"id": "after"}'  # the long line: just past the limit
    data = tmp_path / "data.jsonl.gz"
    data.write_bytes(gzip.compress(b"\n".join((first, long, after)) + b"\n", compresslevel=1))
    state = tmp_path / "state.db"
    delivered = [
        (key, b"r" * 16, line_digest(SALT, line))
        for key, line in zip(KEYS, (first, long, after), strict=True)
    ]
    with SyncState(state, "job") as sync:  # every line delivered, the long one too (as if read whole)
        sync._db.executemany(
            "INSERT INTO delivered (key, digest, run, at, line) VALUES (?, ?, 1, 1, ?)", delivered
        )
    scan = LineScan(InputSpec.detect(data), "id", salt=SALT, state=state)
    try:
        scan.advance(3)
        assert list(scan.marks[1 - scan.start : 4 - scan.start]) == [1, 0, 1]
        at = 2 - scan.start
        assert scan.digests[at * LINE_DIGEST_SIZE : (at + 1) * LINE_DIGEST_SIZE] == NO_DIGEST
        size, lines, _ = scan.finish()
    finally:
        scan.close()
    assert (size, lines) == (data.stat().st_size, 3)


def _night_peak_rss(cwd: Path, job: Path) -> tuple[int, dict[str, object], int]:
    """`bulkrelay run` of one night: exit code, envelope, and the peak RSS (by wait4) of the CLI and of
    every process it waited for, the line scan among them."""
    return run_cli_peak_rss("run", job, "--budget", "0", cwd=cwd)


@pytest.mark.slow
def test_a_gzip_bomb_on_a_second_delta_night_is_refused_naming_its_line_in_bounded_memory(
    tmp_path: Path, target: TargetProcess
) -> None:
    data = tmp_path / "data.csv.gz"
    rows = make_rows(3)
    job = write_job(tmp_path, target.url, rows=rows, input_name=data.name, **DELTA)
    plain = write_csv(tmp_path / "plain.csv", rows).read_bytes()
    data.write_bytes(gzip.compress(plain))
    run_night(tmp_path, job)  # night 1: every row delivered, and the state knows their lines
    code, envelope, base_rss = _night_peak_rss(tmp_path, job)  # night 2 unchanged: the scan runs
    assert code == 0, envelope

    head, tail = plain.split(b"\n2,")
    write_gzip_bomb(data, head + b'\n2,"', _BOMB_LINE, b'",B\n' + tail.split(b"\n", 1)[1])
    assert data.stat().st_size < _BOMB_LINE // 200  # under 1 MB inflating to 160 MiB
    code, envelope, bomb_rss = _night_peak_rss(tmp_path, job)

    assert code == 2, envelope
    error = envelope["error"]
    assert isinstance(error, dict) and error["code"] == "INPUT_INVALID", error
    problems = error["context"]["problems"]
    assert [(p["line"], p["row"]) for p in problems] == [(3, 2)], problems
    assert "longer than 16,777,216 bytes" in problems[0]["message"]
    assert bomb_rss - base_rss < _BOUND, (bomb_rss, base_rss)
