"""`retry-failed` (a linked run over the parent's failed rows) and `export` (rows joined with results)."""

from __future__ import annotations

import csv
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from tests.clirun import run_cli
from tests.jobfiles import make_rows, write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

REJECT_503 = {"rules": [{"match": {"body_field": "name", "contains": "7"}, "status": 503}]}
REJECT_422 = {"rules": [{"match": {"body_field": "email", "contains": "user3"}, "status": 422}]}


def _journal_rows(run_dir: Path) -> dict[int, dict[str, object]]:
    return {e.row_number: e.as_dict() for e in read_journal(run_dir / "results.jsonl")}


def test_retry_failed_sends_only_the_matching_failed_rows_and_links_the_parent(tmp_path: Path) -> None:
    rows = make_rows(40)
    with TargetProcess({"rules": [*REJECT_503["rules"], *REJECT_422["rules"]]}) as target:
        job = write_job(tmp_path, target.url, rows)
        parent = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        assert parent.exit_code == ExitCode.PARTIAL_FAILURE
        parent_dir = Path(parent.data["run_dir"])
        failed = {n for n, e in _journal_rows(parent_dir).items() if not e["success"]}
        only_503 = {n for n, e in _journal_rows(parent_dir).items() if e["status_code"] == 503}
        assert only_503 and only_503 < failed

        target.set_plan({})  # the target recovered
        target.reset()
        child = run_cli("retry-failed", parent_dir, "--status", "503", "--budget", "0", cwd=tmp_path)
        assert child.exit_code == ExitCode.SUCCESS, child.envelope
        assert child.data["parent_run"] == parent.data["run_id"]
        assert child.data["progress"]["total"] == len(only_503)
        sent = {int(r["path"].rsplit("/", 1)[1]) for r in target.requests()}
        assert sent == only_503  # row ids equal row numbers in these rows

    child_dir = Path(child.data["run_dir"])
    assert set(_journal_rows(child_dir)) == only_503  # row numbers stay those of the input
    manifest = orjson.loads((child_dir / "run.json").read_bytes())
    assert manifest["parent_run"] == parent.data["run_id"]
    status = run_cli("status", child_dir, cwd=tmp_path)
    assert status.data["progress"]["total"] == len(only_503)  # its selection, not the whole input

    exported = run_cli("export", parent_dir, "--failed", cwd=tmp_path)
    assert exported.exit_code == ExitCode.SUCCESS
    with open(exported.data["output"], newline="") as out:
        still_failed = [row["id"] for row in csv.DictReader(out)]
    assert sorted(map(int, still_failed)) == sorted(failed - only_503)  # the latest result counts


def test_retry_failed_with_nothing_to_retry(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, 5)
        parent = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        assert parent.exit_code == ExitCode.SUCCESS
        again = run_cli("retry-failed", parent.data["run_dir"], "--budget", "0", cwd=tmp_path)
    assert again.exit_code == ExitCode.SUCCESS
    assert again.data["selected"] == 0


def test_export_joins_every_row_with_its_result(tmp_path: Path) -> None:
    with TargetProcess(REJECT_422) as target:
        job = write_job(tmp_path, target.url, 12)
        run = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
    out = tmp_path / "joined.jsonl"
    exported = run_cli("export", run.data["run_dir"], "--format", "jsonl", "-o", out, cwd=tmp_path)
    assert exported.exit_code == ExitCode.SUCCESS, exported.envelope
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(lines) == 12
    by_id = {line["record"]["id"]: line["result"] for line in lines}
    assert by_id["3"]["status_code"] == 422 and by_id["3"]["success"] is False
    assert by_id["4"]["success"] is True


def test_export_failed_refuses_a_foreign_format(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, 3)
        run = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
    refused = run_cli("export", run.data["run_dir"], "--failed", "--format", "jsonl", cwd=tmp_path)
    assert refused.exit_code == ExitCode.ARG_ERROR


def test_export_to_a_place_it_cannot_write_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, 3)
        run = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
    for output in (tmp_path / "missing" / "rows.csv", tmp_path):  # no such directory; a directory
        refused = run_cli("export", run.data["run_dir"], "-o", output, cwd=tmp_path)
        assert refused.exit_code == ExitCode.ARG_ERROR, refused.envelope
        assert refused.error_code == "USAGE_ERROR"
        assert refused.envelope["error"]["context"] == {"output": str(output)}
        assert str(output) in refused.envelope["error"]["message"]


def test_retry_failed_refuses_a_status_list_that_names_no_status(tmp_path: Path) -> None:
    """`--status "$CODES"` with CODES empty must not quietly retry nothing and exit 0."""
    with TargetProcess(REJECT_422) as target:
        job = write_job(tmp_path, target.url, 5)
        parent = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        for codes in ("", " , ", "422,,503", "42", "9999", "99999999999999999999"):
            refused = run_cli(
                "retry-failed", parent.data["run_dir"], "--status", codes, "--budget", "0", cwd=tmp_path
            )
            assert refused.exit_code == ExitCode.ARG_ERROR, (codes, refused.envelope)
            assert refused.envelope["error"]["message"].startswith(f"--status {codes!r}: ")
        assert target.stats()["requests"] == 5  # the parent's only


def test_retry_failed_refuses_an_unknown_classification_naming_the_valid_ones(tmp_path: Path) -> None:
    with TargetProcess(REJECT_422) as target:
        job = write_job(tmp_path, target.url, 5)
        parent = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        assert parent.exit_code == ExitCode.PARTIAL_FAILURE
        for budget in ("0", "30s"):
            bogus = run_cli(
                "retry-failed",
                parent.data["run_dir"],
                "--classification",
                "bogus",
                "--budget",
                budget,
                cwd=tmp_path,
            )
            assert bogus.exit_code == ExitCode.ARG_ERROR, bogus.envelope
            assert bogus.error_code == "USAGE_ERROR"
            message = bogus.envelope["error"]["message"]
            assert "'bogus'" in message and "http_client_error" in message and "timeout_error" in message
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    assert runs == [parent.data["run_id"]]  # no child run was started


def _damage_line(journal: Path, line: int) -> None:
    """Flip one byte inside line `line` (1-based): its checksum no longer holds."""
    data = bytearray(journal.read_bytes())
    start = 0
    for _ in range(line - 1):
        start = data.index(b"\n", start) + 1
    data[start + 10] ^= 0x01
    journal.write_bytes(bytes(data))


def test_readers_of_results_refuse_a_journal_damaged_before_its_checkpoint(tmp_path: Path) -> None:
    # Before, retry-failed, export and failures stopped reading at the damage: failed rows after it
    # were neither retried nor listed, and export showed them as never sent.
    with TargetProcess(REJECT_503) as target:
        job = write_job(tmp_path, target.url, make_rows(40))
        parent = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        assert parent.exit_code == ExitCode.PARTIAL_FAILURE
        parent_dir = Path(parent.data["run_dir"])
        _damage_line(parent_dir / "results.jsonl", 3)
        target.reset()
        answers = {
            "retry-failed": run_cli("retry-failed", parent_dir, "--budget", "0", cwd=tmp_path),
            "export": run_cli("export", parent_dir, "--failed", cwd=tmp_path),
            "failures": run_cli("failures", parent_dir, cwd=tmp_path),
        }
        assert target.requests() == []
    for command, answer in answers.items():
        assert answer.exit_code == ExitCode.PRECONDITION, (command, answer.envelope)
        assert answer.envelope["error"]["code"] == "JOURNAL_CORRUPT", command
        assert answer.envelope["error"]["context"]["line"] == 3, command
    assert not (parent_dir / "failed.csv").exists()
    # Each refusal says what the user can do with this command, not what only a resume would face.
    advice = {command: answer.envelope["error"]["suggestion"] for command, answer in answers.items()}
    journal = str(parent_dir / "results.jsonl")
    assert all(f"restore {journal} from a backup" in text for text in advice.values()), advice
    assert "nothing was retried" in advice["retry-failed"] and "bulkrelay run" in advice["retry-failed"]
    assert "export again" in advice["export"] and "bulkrelay status" in advice["export"]
    assert "failures again" in advice["failures"] and "bulkrelay status" in advice["failures"]
    assert not any("resume" in text for text in advice.values()), advice


def test_retry_failed_refuses_a_parent_whose_journal_is_gone(tmp_path: Path) -> None:
    with TargetProcess(REJECT_503) as target:
        job = write_job(tmp_path, target.url, make_rows(20))
        parent = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        parent_dir = Path(parent.data["run_dir"])
        (parent_dir / "results.jsonl").unlink()
        target.reset()
        again = run_cli("retry-failed", parent_dir, "--budget", "0", cwd=tmp_path)
        assert target.requests() == []
    assert again.exit_code == ExitCode.PRECONDITION, again.envelope
    assert again.envelope["error"]["code"] == "JOURNAL_CORRUPT"
    assert "results.jsonl" in again.envelope["error"]["message"]
    assert "nothing was retried" in again.envelope["error"]["suggestion"]
