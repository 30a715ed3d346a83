"""`failures` (failed rows grouped, with redacted examples), `export --failed --with-reasons -o -`,
and the run reference every run command takes: a run directory, a run id, or `latest`."""

from __future__ import annotations

import csv
import gc
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode, InputChanged
from bulkrelay.ops.export import _opened, _write
from bulkrelay.store.rundir import RunDir, RunState
from bulkrelay.store.runs import resolve_run
from tests.clirun import cli_env, run_cli, start_cli
from tests.jobfiles import write_job
from tests.runplans import run_plan
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

SECRET = "s3cr3t-token-value-4711"
# Rows whose name holds a 3 get 422 echoing the token; rows with a 7 get 503; the rest succeed.
PLAN = {
    "rules": [
        {
            "match": {"body_field": "name", "contains": "3"},
            "status": 422,
            "body": {"error": "rejected", "token": SECRET},
        },
        {"match": {"body_field": "name", "contains": "7"}, "status": 503, "body": "busy"},
    ]
}
AUTH: dict[str, Any] = {"headers": {"Authorization": "Bearer ${API_TOKEN}"}}


def _run_with_failures(tmp_path: Path, rows: int = 40) -> tuple[Path, Path]:
    runs = tmp_path / "runs"
    with TargetProcess(PLAN) as target:
        job = write_job(tmp_path, target.url, rows, request=AUTH)
        env = cli_env(API_TOKEN=SECRET)
        run = run_cli("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path, env=env)
    assert run.exit_code == ExitCode.PARTIAL_FAILURE, run.envelope
    return Path(run.data["run_dir"]), runs


def test_failures_groups_rows_by_status_and_classification_with_redacted_examples(
    tmp_path: Path,
) -> None:
    run_dir, _ = _run_with_failures(tmp_path)
    answer = run_cli("failures", run_dir, cwd=tmp_path)
    assert answer.exit_code == ExitCode.SUCCESS, answer.envelope
    groups = {(g["status_code"], g["classification"]): g for g in answer.data["groups"]}
    # 1..40: names with a 3 (3, 13, 23, 30-39: 13 rows), else with a 7 (7, 17, 27: 3 rows).
    assert set(groups) == {(422, "http_client_error"), (503, "http_server_error")}, groups
    assert groups[(422, "http_client_error")]["count"] == 13
    assert groups[(503, "http_server_error")]["count"] == 3
    assert answer.data["failed"] == 16
    examples = groups[(422, "http_client_error")]["examples"]
    assert [e["row_number"] for e in examples] == [3, 13, 23]  # at most three, in journal order
    for example in examples:
        assert "rejected" in example["body"] and SECRET not in example["body"]
    assert SECRET not in answer.stdout.decode()


def test_export_failed_with_reasons_writes_csv_to_stdout_and_the_envelope_to_stderr(
    tmp_path: Path,
) -> None:
    run_dir, _ = _run_with_failures(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "bulkrelay", "export", str(run_dir), "--failed", "--with-reasons", "-o", "-"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == ExitCode.SUCCESS, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout.decode())))
    assert list(rows[0]) == ["id", "email", "name", "_status", "_error", "_attempts"]
    by_id = {row["id"]: row for row in rows}
    assert len(by_id) == 16
    assert by_id["3"]["_status"] == "422" and by_id["7"]["_status"] == "503"
    assert by_id["7"]["_attempts"] == "1" and by_id["3"]["_error"]
    envelope = orjson.loads(proc.stderr.splitlines()[-1])
    assert envelope["ok"] is True and envelope["data"]["rows"] == 16


def _export_to_stdout(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "bulkrelay", "export", *map(str, args)],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_export_to_stdout_sends_every_envelope_to_stderr_failures_too(tmp_path: Path) -> None:
    # Before, only a successful export's envelope went to stderr: a refusal put its envelope on stdout,
    # into the CSV a script was writing (`export RUN -o - > failed.csv`), after the rows already there.
    run_dir, _ = _run_with_failures(tmp_path, rows=5)
    refusals = [
        ("NOT_FOUND", (tmp_path / "no-such-run", "-o", "-")),
        ("USAGE_ERROR", (run_dir, "--with-reasons", "--output", "-")),  # refused by export itself
        ("USAGE_ERROR", (run_dir, "--format", "xml", "--output=-")),  # refused by the parser
        ("USAGE_ERROR", (run_dir, "--failed", "--format", "jsonl", "-o-")),
    ]
    for code, args in refusals:
        proc = _export_to_stdout(tmp_path, *args)
        assert proc.stdout == b"", (args, proc.stdout)
        envelope = orjson.loads(proc.stderr.splitlines()[-1])
        assert envelope["error"]["code"] == code, envelope
        assert envelope["meta"]["exit_code"] == proc.returncode != 0

    records = tmp_path / "data.csv"
    records.write_text(records.read_text().replace("user5@", "USER5@"))  # the input changed since the run
    proc = _export_to_stdout(tmp_path, run_dir, "-o", "-")
    assert proc.returncode == ExitCode.PRECONDITION
    rows = list(csv.DictReader(io.StringIO(proc.stdout.decode())))  # the rows read so far, nothing else
    assert [row["id"] for row in rows] == ["1", "2", "3", "4", "5"]
    assert orjson.loads(proc.stderr.splitlines()[-1])["error"]["code"] == "INPUT_CHANGED"


def test_an_export_whose_reader_leaves_early_says_so_without_a_traceback(tmp_path: Path) -> None:
    # `export RUN -o - | head -1`: before, the closed pipe was an unexpected failure (GENERAL_ERROR, a
    # traceback in error.detail). The reader here takes the header and closes the pipe before the rest
    # is written (4,000 rows are more than a pipe holds), as `head` does.
    run_dir, _ = _run_with_failures(tmp_path, rows=4000)
    proc = start_cli("export", run_dir, "-o", "-", cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"id,email,name,")
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=HANG_S)
    assert proc.returncode == ExitCode.GENERAL_ERROR
    envelope = orjson.loads(stderr.splitlines()[-1])
    assert envelope["error"]["code"] == "OUTPUT_CLOSED", envelope
    assert "detail" not in envelope["error"] and b"Traceback" not in stderr
    assert b"Exception ignored" not in stderr  # the interpreter's last flush of stdout did not fail


def test_an_export_that_fails_midway_leaves_its_output_open() -> None:
    # Before, the CSV writer's text wrapper was dropped unclosed on a failure and its finalizer closed
    # the stream under it: stdout itself for `-o -`, so the CLI died writing the answer (exit 1).
    def failing_rows() -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
        yield {"id": "1"}, None
        raise InputChanged("the input changed since the run")

    out = io.BytesIO()
    with pytest.raises(InputChanged):
        _write(out, "csv", failing_rows(), with_results=False)
    gc.collect()
    assert not out.closed
    assert out.getvalue() == b"id\r\n1\r\n"


def test_an_export_file_is_replaced_at_the_end_through_its_link_keeping_its_permissions(
    tmp_path: Path,
) -> None:
    real = tmp_path / "kept" / "failed.csv"
    real.parent.mkdir()
    real.write_bytes(b"yesterday\n")
    real.chmod(0o640)
    link = tmp_path / "failed.csv"
    link.symlink_to(real)
    with pytest.raises(InputChanged), _opened(link) as out:
        out.write(b"id\n1\n")
        raise InputChanged("the input changed since the run")
    assert real.read_bytes() == b"yesterday\n" and os.listdir(real.parent) == ["failed.csv"]
    with _opened(link) as out:
        out.write(b"id\n1\n")
    assert link.is_symlink() and real.read_bytes() == b"id\n1\n"
    assert real.stat().st_mode & 0o777 == 0o640
    with _opened(tmp_path / "new.csv") as out:
        out.write(b"id\n")
    assert (tmp_path / "new.csv").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_with_reasons_without_failed_is_a_usage_error(tmp_path: Path) -> None:
    run_dir, _ = _run_with_failures(tmp_path, rows=5)
    answer = run_cli("export", run_dir, "--with-reasons", cwd=tmp_path)
    assert answer.exit_code == ExitCode.ARG_ERROR
    assert "--failed" in answer.envelope["error"]["suggestion"]


def test_run_commands_take_a_run_id_or_latest(tmp_path: Path) -> None:
    first, runs = _run_with_failures(tmp_path, rows=5)
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, 4, job_name="second.yaml", input_name="second.csv")
        second = run_cli("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
    assert second.exit_code == ExitCode.SUCCESS
    by_id = run_cli("status", first.name, "--runs-dir", runs, cwd=tmp_path)
    assert by_id.exit_code == ExitCode.SUCCESS and by_id.data["run_id"] == first.name
    env = cli_env(BULKRELAY_RUNS_DIR=str(runs))
    latest = run_cli("status", "latest", cwd=tmp_path, env=env)
    assert latest.data["run_id"] == second.data["run_id"]
    failures = run_cli("failures", first.name, cwd=tmp_path, env=env)
    assert failures.data["run_id"] == first.name and failures.data["failed"] == 1
    exported = run_cli("export", "latest", "--runs-dir", runs, cwd=tmp_path)
    assert exported.data["run_id"] == second.data["run_id"] and exported.data["rows"] == 4


def test_an_unknown_run_reference_is_not_found_naming_where_it_looked(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    missing = run_cli("status", "20990101T000000Z-deadbeef", "--runs-dir", runs, cwd=tmp_path)
    assert missing.exit_code == ExitCode.NOT_FOUND
    assert str(runs) in missing.envelope["error"]["message"]
    none_yet = run_cli("failures", "latest", "--runs-dir", runs, cwd=tmp_path)
    assert none_yet.exit_code == ExitCode.NOT_FOUND and "latest" in none_yet.envelope["error"]["message"]


def test_latest_is_the_newest_by_created_at_even_within_one_second(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    older = RunDir.create(runs, run_plan(name="a"))
    newer = RunDir.create(runs, run_plan(name="b"))
    # Within one second the ids differ only in their random part: the name order says nothing.
    newer.save(replace(newer.manifest, state=RunState.COMPLETED, created_at="2099-01-01T00:00:00.000001Z"))
    older.save(replace(older.manifest, state=RunState.COMPLETED, created_at="2099-01-01T00:00:00.000000Z"))
    assert resolve_run("latest", runs) == newer.path
    assert resolve_run(older.run_id, runs) == older.path
    assert resolve_run(str(older.path), None) == older.path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_with_reasons_never_overwrites_an_input_field_of_the_same_name(tmp_path: Path, fmt: str) -> None:
    """Before, an input column `_status` was overwritten by the HTTP status (and `_error`, `_attempts`
    likewise): the fixed file fed to a new run then sent the reason as the row's data."""
    rows = [{"id": str(n), "email": f"u{n}@x.com", "name": f"User {n}", "_status": "vip"} for n in (1, 3)]
    runs = tmp_path / "runs"
    with TargetProcess(PLAN) as target:
        job = write_job(tmp_path, target.url, rows, request={"json": {"tier": {"from": "_status"}}})
        if fmt == "jsonl":
            data = tmp_path / "data.jsonl"
            data.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
            job.write_text(job.read_text().replace("data.csv", "data.jsonl"))
        run = run_cli("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
    assert run.exit_code == ExitCode.PARTIAL_FAILURE, run.envelope  # row 2 (User 3) got 422
    out = tmp_path / f"failed.{fmt}"
    answer = run_cli("export", run.data["run_dir"], "--failed", "--with-reasons", "-o", out, cwd=tmp_path)
    assert answer.exit_code == ExitCode.ARG_ERROR and answer.error_code == "USAGE_ERROR", answer.envelope
    assert answer.envelope["error"]["context"] == {"fields": ["_status"], "row": 2}
    assert not out.exists()  # refused before the output was opened: nothing half written
    plain = run_cli("export", run.data["run_dir"], "--failed", "-o", out, cwd=tmp_path)
    assert plain.exit_code == ExitCode.SUCCESS, plain.envelope
    assert b"vip" in out.read_bytes()


@pytest.mark.slow
def test_with_reasons_refused_at_a_later_json_lines_row_leaves_nothing_in_a_file_or_on_stdout(
    tmp_path: Path,
) -> None:
    """Before, only the first failed row was checked before the output was opened: a `_status` in a
    later JSON Lines row was refused midway, after the rows before it were written to `-o FILE` (over
    the file that was there) or printed to stdout, where a refused export writes nothing."""
    rows: list[dict[str, str]] = [
        {"id": "3", "email": "u3@x.com", "name": "User 3"},
        {"id": "5", "email": "u5@x.com", "name": "User 5"},
        {"id": "13", "email": "u13@x.com", "name": "User 13", "_status": "vip"},
    ]
    with TargetProcess(PLAN) as target:
        job = write_job(tmp_path, target.url, rows[:2], input_name="data.jsonl")
        (tmp_path / "data.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
        run = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
    assert run.exit_code == ExitCode.PARTIAL_FAILURE, run.envelope  # rows 1 and 3 (User 3, 13) got 422
    refused = ("export", run.data["run_dir"], "--failed", "--with-reasons")
    out = tmp_path / "out" / "failed.jsonl"
    out.parent.mkdir()
    out.write_bytes(b"yesterday's export\n")

    answer = run_cli(*refused, "-o", out, cwd=tmp_path)
    assert answer.exit_code == ExitCode.ARG_ERROR and answer.error_code == "USAGE_ERROR", answer.envelope
    assert answer.envelope["error"]["context"] == {"fields": ["_status"], "row": 3}
    assert out.read_bytes() == b"yesterday's export\n"  # neither overwritten nor half written
    assert os.listdir(out.parent) == ["failed.jsonl"]  # and no temporary file left beside it

    printed = _export_to_stdout(tmp_path, *refused[1:], "-o", "-")
    assert printed.returncode == ExitCode.ARG_ERROR, printed.stderr
    assert printed.stdout == b""
    assert orjson.loads(printed.stderr.splitlines()[-1])["error"]["context"] == {
        "fields": ["_status"],
        "row": 3,
    }

    plain = run_cli("export", run.data["run_dir"], "--failed", "-o", out, cwd=tmp_path)
    assert plain.exit_code == ExitCode.SUCCESS, plain.envelope
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["3", "13"]
    assert os.listdir(out.parent) == ["failed.jsonl"]
