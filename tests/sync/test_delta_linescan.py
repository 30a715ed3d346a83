"""Trying to make a delta night's line scan skip a changed row, through `run` and a real target.

Each case: night 1 sends every row and the state learns every row's line; then a change; night 2
must send exactly the rows whose request changed (the target's log), and skip the others."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.sync.state import job_identity, state_path
from tests.clirun import CliResult, run_cli
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runsteps import rewrite_job, sent_ids
from tests.sync.nights import DELTA, mirror_job, run_night
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

ROWS = 12
ALL = tuple(range(1, ROWS + 1))
Change = Callable[[Path, Path], tuple[tuple[int, ...], tuple[str, ...]]]  # (cwd, job) -> sent, run args


def _lines(cwd: Path) -> dict[str, bytes | None]:
    """Each delivered key's line digest, as the state holds it."""
    path = state_path(cwd / ".bulkrelay" / "runs", job_identity("test-job", cwd / "job.yaml"))
    with sqlite3.connect(path) as db:
        found = dict(db.execute("SELECT key, line FROM delivered"))
    db.close()
    return found


def _first_night(cwd: Path, job: Path, target: TargetProcess) -> None:
    run_night(cwd, job)
    assert sent_ids(target) == Counter({str(n): 1 for n in ALL})
    assert all(_lines(cwd).values()) and len(_lines(cwd)) == ROWS  # the scan knows every line now
    target.reset()


def _assert_sent(night: CliResult, target: TargetProcess, sent: tuple[int, ...], rows: int = ROWS) -> None:
    assert sent_ids(target) == Counter({str(n): 1 for n in sent})
    assert night.data["summary"]["skipped_unchanged"] == rows - len(sent)


def _rows(changed: tuple[int, ...] = (), tag: str = "-v2") -> list[dict[str, str]]:
    rows = make_rows(ROWS)
    for n in changed:
        rows[n - 1]["email"] = f"user{n}{tag}@example.com"
    return rows


def _job_change(**changes: Any) -> Change:
    def change(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
        rewrite_job(job, **changes)
        return ALL, ()

    return change


def _new_url(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    url = yaml.safe_load(job.read_text())["request"]["url"]
    rewrite_job(job, request={"url": url.replace("/items/", "/things/")})
    return ALL, ()


def _idempotency_header_renamed(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    rewrite_job(job, request={"idempotency_key": {"header": "X-Other-Key"}})
    return (), ()  # the digest leaves the idempotency header out: no request changed


def _delimiter(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    rows = _rows((3,))
    text = "\n".join(";".join(row.values()) for row in [dict(zip(rows[0], rows[0], strict=True)), *rows])
    (cwd / "data.csv").write_text(text + "\n")
    rewrite_job(job, input={"delimiter": ";"})
    return (3,), ()


def _header_reordered(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    data = cwd / "data.csv"
    header, rest = data.read_bytes().split(b"\n", 1)
    assert header == b"id,email,name"
    data.write_bytes(b"id,name,email\n" + rest)  # the same data lines: email and name swap
    return ALL, ()


def _contents_swapped(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    rows = make_rows(ROWS)
    for field in ("email", "name"):
        rows[2][field], rows[3][field] = rows[3][field], rows[2][field]
    write_csv(cwd / "data.csv", rows)
    return (3, 4), ()


def _to_json_lines(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    (cwd / "data.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in _rows((4,))))
    rewrite_job(job, input={"file": "data.jsonl"})
    return (4,), ()


def _another_input(cwd: Path, job: Path) -> tuple[tuple[int, ...], tuple[str, ...]]:
    other = write_csv(cwd / "other.csv", _rows((2, 9)))
    return (2, 9), ("--input", str(other))


CASES: dict[str, Change] = {
    "url": _new_url,
    "constant_header": _job_change(request={"headers": {"X-Tag": "night-2"}}),
    "json_mapping": _job_change(
        request={"json": {"email": {"from": "email"}, "name": {"from": "name"}, "source": {"value": "b"}}}
    ),
    "json_type": _job_change(
        request={
            "json": {
                "email": {"from": "email"},
                "name": {"from": "name"},
                "n": {"from": "id", "type": "integer"},
            }
        }
    ),
    "method": _job_change(request={"method": "PUT"}),
    "idempotency_header": _idempotency_header_renamed,
    "delimiter": _delimiter,
    "header_reordered": _header_reordered,
    "contents_swapped": _contents_swapped,
    "csv_to_json_lines": _to_json_lines,
    "another_input": _another_input,
}


@pytest.mark.parametrize("change", CASES.values(), ids=CASES.keys())
def test_night_2_sends_exactly_the_rows_whose_request_changed(
    tmp_path: Path, target: TargetProcess, change: Change
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    _first_night(tmp_path, job, target)

    sent, args = change(tmp_path, job)
    night = run_night(tmp_path, job, *args)

    _assert_sent(night, target, sent)
    assert all(_lines(tmp_path).values())  # every row's line learned again, under the new job or bytes


def test_a_change_in_a_column_no_request_uses_sends_nothing_and_is_learned(
    tmp_path: Path, target: TargetProcess
) -> None:
    rows = [{**row, "note": "a"} for row in make_rows(ROWS)]
    job = write_job(tmp_path, target.url, rows=rows, **DELTA)
    _first_night(tmp_path, job, target)
    before = _lines(tmp_path)

    for n in (2, 5):
        rows[n - 1]["note"] = "b"
    write_csv(tmp_path / "data.csv", rows)
    _assert_sent(run_night(tmp_path, job), target, ())

    after = _lines(tmp_path)
    assert {key for key in after if after[key] != before[key]} == {"2", "5"}
    assert all(after.values())


def test_a_row_changed_back_to_its_earlier_value_is_sent(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    _first_night(tmp_path, job, target)
    write_csv(tmp_path / "data.csv", _rows((2, 6)))
    _assert_sent(run_night(tmp_path, job), target, (2, 6))
    target.reset()

    write_csv(tmp_path / "data.csv", _rows((6,)))  # row 2 as night 1 sent it: its old line again
    _assert_sent(run_night(tmp_path, job), target, (2,))


def test_a_change_that_failed_then_reverted_sends_nothing_and_made_again_is_sent(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    _first_night(tmp_path, job, target)
    write_csv(tmp_path / "data.csv", _rows((5,)))
    target.set_plan({"rules": [{"match": {"path_contains": "/items/5"}, "status": 422}]})
    failed = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert failed.data["summary"]["skipped_unchanged"] == ROWS - 1, failed.envelope
    target.set_plan({})
    target.reset()

    write_csv(tmp_path / "data.csv", _rows())  # row 5 as delivered on night 1
    _assert_sent(run_night(tmp_path, job), target, ())
    write_csv(tmp_path / "data.csv", _rows((5,)))  # the change the target refused, again
    _assert_sent(run_night(tmp_path, job), target, (5,))


def test_full_then_a_night_sends_exactly_the_changed_rows(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    _first_night(tmp_path, job, target)
    write_csv(tmp_path / "data.csv", _rows((3,)))
    _assert_sent(run_night(tmp_path, job, "--full"), target, ALL)
    target.reset()

    write_csv(tmp_path / "data.csv", _rows((3, 8), tag="-v3"))
    _assert_sent(run_night(tmp_path, job), target, (3, 8))


def test_a_row_changed_by_a_full_night_then_changed_back_is_sent(
    tmp_path: Path, target: TargetProcess
) -> None:
    """A `--full` night runs no line scan, so it notes no line for what it delivers: the line its row
    had before must be forgotten, or the old line, back the next night, would be taken as delivered."""
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    _first_night(tmp_path, job, target)
    write_csv(tmp_path / "data.csv", _rows((2,)))
    _assert_sent(run_night(tmp_path, job, "--full"), target, ALL)
    target.reset()

    write_csv(tmp_path / "data.csv", _rows())  # row 2's line as night 1 delivered it
    _assert_sent(run_night(tmp_path, job), target, (2,))


def test_shards_send_exactly_the_changed_rows(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    _first_night(tmp_path, job, target)
    write_csv(tmp_path / "data.csv", _rows((1, 4, 7, 10)))

    nights = [run_night(tmp_path, job, "--shard", f"{k}/2").data for k in range(2)]

    assert sent_ids(target) == Counter({str(n): 1 for n in (1, 4, 7, 10)})
    assert sum(night["summary"]["skipped_unchanged"] for night in nights) == ROWS - 4


def test_a_night_after_a_rebuild_and_the_night_after_it(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **DELTA)
    _first_night(tmp_path, job, target)
    assert run_cli("sync-state", "rebuild", job, cwd=tmp_path).exit_code == 0
    assert not any(_lines(tmp_path).values())  # a rebuild keeps no line

    write_csv(tmp_path / "data.csv", _rows((7,)))
    _assert_sent(run_night(tmp_path, job), target, (7,))
    target.reset()
    write_csv(tmp_path / "data.csv", _rows((7, 8)))
    _assert_sent(run_night(tmp_path, job), target, (8,))


def test_a_mirror_night_sends_exactly_the_changed_rows(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=ROWS, **mirror_job(target, "100%"))
    run_night(tmp_path, job)
    target.reset()
    write_csv(tmp_path / "data.csv", _rows((3, 11)))
    _assert_sent(run_night(tmp_path, job), target, (3, 11))


def test_keys_with_nul_non_ascii_or_thousands_of_characters(tmp_path: Path, target: TargetProcess) -> None:
    keys = ["a\0b", "\u00e9t\u00e9", "\U0001f600", "k" * 5000, "plain", 42]
    job = write_job(
        tmp_path,
        target.url,
        input_name="data.jsonl",
        **{
            **DELTA,
            "input": {"key": "id", "file": "data.jsonl"},
            "request": {
                **DELTA["request"],
                "url": f"{target.url}/items/{{n}}",
                "json": {"key": {"from": "id"}, "email": {"from": "email"}, "name": None},
            },
        },
    )

    def write(changed: tuple[int, ...]) -> None:
        records = [{"id": key, "n": str(n), "email": f"{n}@x"} for n, key in enumerate(keys, 1)]
        for n in changed:
            records[n - 1]["email"] = f"{n}@changed"
        (tmp_path / "data.jsonl").write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))

    write(())
    run_night(tmp_path, job)
    target.reset()
    write((1, 2, 3, 4, 6))
    _assert_sent(run_night(tmp_path, job), target, (1, 2, 3, 4, 6), rows=len(keys))
    target.reset()
    write((1, 2, 3, 4, 6))
    _assert_sent(run_night(tmp_path, job), target, (), rows=len(keys))
