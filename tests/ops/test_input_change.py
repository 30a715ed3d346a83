"""The input changes while a run is sending it: the relay reads only the bytes preflight validated,
stops at a safe point with INPUT_CHANGED (exit 4), and the run resumes once the file is restored.

"Mid-run" is made deterministic with a gate at the target: every request gets 503 (and is retried)
until the test has changed the file, so the relay has taken only the first rows when the change
lands; the reader checks the file every 64 records, long before the 300 rows run out.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.job.inputs import REGION_SIZE
from tests.gatedruns import GATE, GATED_JOB, delivered_ids, run_changing_the_input
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runsteps import assert_each_row_once, resume, sent_ids
from tests.targetproc import TargetProcess

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = [pytest.mark.slow, pytest.mark.target_plan(GATE)]

ROWS = 300


def _append_a_row(data: Path) -> None:
    with data.open("a") as out:
        out.write(f"{ROWS + 1},user{ROWS + 1}@example.com,User {ROWS + 1}\n")


def _rewrite_in_place(data: Path) -> None:
    write_csv(data, make_rows(ROWS, tag="-new"))  # truncates and rewrites the same inode


@pytest.mark.parametrize("change", [_append_a_row, _rewrite_in_place], ids=["append", "rewrite_in_place"])
def test_an_input_changed_mid_run_stops_with_input_changed_and_resumes_once_restored(
    tmp_path: Path, target: TargetProcess, change: Callable[[Path], None]
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **GATED_JOB)
    original = (tmp_path / "data.csv").read_bytes()

    exit_code, envelope = run_changing_the_input(tmp_path, job, target, change)

    assert exit_code == ExitCode.PRECONDITION, envelope
    error = envelope["error"]
    assert error["code"] == "INPUT_CHANGED"
    assert "size" in error["context"]["changed"]
    assert "data.csv changed during the run: size" in error["detail"]
    assert "resume" in error["suggestion"]
    run_dir = Path(envelope["data"]["run_dir"])
    assert envelope["data"]["state"] == "stopped"
    assert orjson.loads((run_dir / "run.json").read_bytes())["state"] == "stopped"
    assert 0 < envelope["data"]["progress"]["done"] < ROWS
    bodies = [r["body"] for r in target.requests()]
    assert str(ROWS + 1) not in delivered_ids(target)  # the appended row was never sent
    assert not any("-new" in body for body in bodies)  # nor a byte of the rewrite

    (tmp_path / "data.csv").write_bytes(original)
    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(run_dir, ROWS)
    assert delivered_ids(target) == Counter({str(n): 1 for n in range(1, ROWS + 1)})


PADDED_ROWS = 400
CHANGED_ROW = 300


def _padded_rows() -> list[dict[str, str]]:
    """Rows of 8 KB (the note is not sent): 3 MiB of input, so that row CHANGED_ROW lies regions
    past the ones the relay has read while the gate holds its first rows."""
    return [{**row, "note": "x" * 8000} for row in make_rows(PADDED_ROWS)]


def _changed_email(row: int) -> tuple[bytes, bytes]:
    """The row's email as written, and a same-size replacement the test can look for."""
    return f"user{row}@example.com".encode(), f"evil{row}@example.com".encode()


def _rewrite_a_later_row_keeping_size_and_time(data: Path) -> None:
    """Row CHANGED_ROW rewritten in place: same size, modification time put back, so that the file's
    identity cannot tell; only its bytes differ from what preflight read."""
    before = data.stat()
    old, new = _changed_email(CHANGED_ROW)
    body = data.read_bytes()
    assert body.count(old) == 1
    data.write_bytes(body.replace(old, new))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_plain_run_never_sends_a_row_from_bytes_preflight_did_not_read(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=_padded_rows(), **GATED_JOB)
    original = (tmp_path / "data.csv").read_bytes()
    offset = original.index(_changed_email(CHANGED_ROW)[0])
    region = offset // REGION_SIZE * REGION_SIZE
    assert region >= 2 * REGION_SIZE and len(original) > region + REGION_SIZE  # far from the first rows

    exit_code, envelope = run_changing_the_input(
        tmp_path, job, target, _rewrite_a_later_row_keeping_size_and_time
    )

    assert exit_code == ExitCode.PRECONDITION, envelope
    bodies = [r["body"] for r in target.requests()]
    assert not any("evil" in body for body in bodies)  # the rewritten row never went out
    whole_rows_before = original[:region].count(b"\n") - 1  # the header is a line, not a row
    assert max(int(row) for row in sent_ids(target)) <= whole_rows_before  # nor a row of its region
    error = envelope["error"]
    assert error["code"] == "INPUT_CHANGED"
    assert f"data.csv changed during the run: bytes {region}-{region + REGION_SIZE - 1}" in error["detail"]
    assert error["context"]["bytes"] == {"first": region, "last": region + REGION_SIZE - 1}
    assert envelope["data"]["state"] == "stopped"
    assert 0 < envelope["data"]["progress"]["done"] < CHANGED_ROW

    (tmp_path / "data.csv").write_bytes(original)
    result = resume(tmp_path, Path(envelope["data"]["run_dir"]))

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(Path(envelope["data"]["run_dir"]), PADDED_ROWS)
    assert delivered_ids(target) == Counter({str(n): 1 for n in range(1, PADDED_ROWS + 1)})
