"""Delta sync with bulk jobs (`request.bulk_job` and `execution.sync: delta`), through the real CLI against
the demo target's ingest API in its own process: night 2 uploads exactly the changed, new and failed
rows; a job attached by `resume` gives its rows their digests too; a renamed column sends every row
again; and `sync-state verify` agrees with the journals each night."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, cli_env, run_cli
from tests.relay.bulkrun import write_bulk_job
from tests.sync.nights import verified
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow

ENV = cli_env(SF_TOKEN="tok")
NAMES = ["ann", "bogus-bob", "cy", "dan", "eve"]


def _rows(path: Path, emails: dict[str, str]) -> None:
    """rows.csv as tests/relay/bulkrun.py writes it: id `k<n>-<name>`, the email given."""
    with path.open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["id", "email"])
        for n, (name, email) in enumerate(emails.items(), start=1):
            writer.writerow([f"k{n}-{name}", email])


def _delta_job(tmp_path: Path, url: str, **poll: object) -> Path:
    job = write_bulk_job(tmp_path, url, NAMES)
    spec = yaml.safe_load(job.read_text())
    spec["execution"] = {"sync": "delta"}
    spec["request"]["bulk_job"]["poll"].update(poll)
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


def _night(tmp_path: Path, job: Path, *more: str) -> CliResult:
    result = run_cli("run", job, "--budget", "0", *more, cwd=tmp_path, env=ENV)
    assert result.exit_code == ExitCode.PARTIAL_FAILURE, result.envelope  # bogus-bob fails each night
    return result


def _uploaded(target: TargetProcess) -> list[str]:
    """The ids of the rows uploaded since the target was last reset, in upload order."""
    uploads = [r["body"] for r in target.requests() if r["method"] == "PUT"]
    return [line.split(",")[0] for body in uploads for line in body.splitlines()[1:]]


def test_night_2_uploads_the_changed_new_and_failed_rows_and_a_renamed_column_all(tmp_path: Path) -> None:
    emails = {name: f"{name}@example.com" for name in NAMES}
    with TargetProcess({}) as target:
        job = _delta_job(tmp_path, target.url)
        first = _night(tmp_path, job)
        assert first.data["progress"]["total"] == 5 and len(_uploaded(target)) == 5
        verified(tmp_path, job)

        target.reset()
        _rows(tmp_path / "rows.csv", {**emails, "cy": "cy@new.example.com", "fay": "fay@example.com"})
        second = _night(tmp_path, job)
        assert sorted(_uploaded(target)) == ["k2-bogus-bob", "k3-cy", "k6-fay"]
        assert second.data["progress"] == {
            "done": 3, "total": 3, "unit": "rows", "ok": 2, "failed": 1,
            "jobs": {"created": 1, "processing": 0, "done": 1, "aborted": 0},
        }  # fmt: skip
        verified(tmp_path, job)

        target.reset()
        spec = yaml.safe_load(job.read_text())
        columns = spec["request"]["bulk_job"]["columns"]
        columns["Email__c"] = columns.pop("Email")  # the same cells under another field: all again
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        _night(tmp_path, job)
        assert len(_uploaded(target)) == 6
        verified(tmp_path, job)


def test_a_job_attached_by_resume_gives_its_rows_their_digests(tmp_path: Path) -> None:
    with TargetProcess({"bulk": {"stuck": True}}) as target:
        job = _delta_job(tmp_path, target.url, max_wait="3s")  # the resume's bound as well: not 500 ms
        stopped = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=ENV)
        assert stopped.exit_code == ExitCode.TIMEOUT, stopped.envelope
        target.set_plan({"bulk": {"stuck": False}})
        resumed = run_cli("resume", stopped.data["run_dir"], "--budget", "0", cwd=tmp_path, env=ENV)
        assert resumed.exit_code == ExitCode.PARTIAL_FAILURE, resumed.envelope
        verified(tmp_path, job)
        target.reset()
        _night(tmp_path, job)  # the next night: only the row that failed
        assert _uploaded(target) == ["k2-bogus-bob"]
