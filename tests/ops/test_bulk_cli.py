"""A bulk job through the command line: `poll.max_wait` stops the call resumably (exit 10 with
`continue_command`), and `resume` polls the same job to its end without submitting its rows again;
`retry-failed`, `export` and `failures` read a bulk run's rows as any run's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.clirun import cli_env, run_cli
from tests.relay.bulkrun import write_bulk_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow
ENV = cli_env(SF_TOKEN="tok")


def test_max_wait_stops_resumably_and_resume_attaches_to_the_same_job(tmp_path: Path) -> None:
    with TargetProcess({"bulk": {"stuck": True}}) as target:
        job = write_bulk_job(tmp_path, target.url, ["ann", "bogus-bob", "cy"])
        spec = yaml.safe_load(job.read_text())
        spec["request"]["bulk_job"]["poll"] = {
            "first_seconds": 0.02,
            "max_seconds": 0.05,
            "max_wait": "500ms",
        }
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        stopped = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=ENV)
        assert stopped.exit_code == ExitCode.TIMEOUT, stopped.envelope
        assert stopped.data["continue_command"].startswith("bulkrelay resume ")
        run_dir = Path(stopped.data["run_dir"])
        assert list(read_journal(run_dir / "results.jsonl")) == []
        target.set_plan({"bulk": {"stuck": False}})  # the job goes on where it stands
        resumed = run_cli("resume", run_dir, "--budget", "0", cwd=tmp_path, env=ENV)
        assert resumed.exit_code == ExitCode.PARTIAL_FAILURE, resumed.envelope
        stats = target.stats()
    entries = {entry.row_number: entry for entry in read_journal(run_dir / "results.jsonl")}
    assert [entries[n].success for n in (1, 2, 3)] == [True, False, True]
    assert stats["bulk_jobs"]["created"] == 1 and stats["bulk_rows_in_two_jobs"] == 0  # never sent again
    (ledger,) = job_ledgers(run_dir / "results.jsonl").values()
    assert ledger.events == ["created", "uploaded", "closed", "state", "results"]

    failures = run_cli("failures", run_dir, cwd=tmp_path, env=ENV)
    (group,) = failures.data["groups"]
    assert group["examples"][0]["key"] == "k2-bogus-bob" and "INVALID_FIELD" in group["examples"][0]["error"]
    exported = run_cli("export", run_dir, cwd=tmp_path, env=ENV)
    assert exported.data["rows"] == 3
    with TargetProcess({}) as target:  # the failed row alone, as a job of its own
        spec["request"]["bulk_job"]["base_url"] = f"{target.url}/services/data/v62.0"
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        child = run_cli("retry-failed", run_dir, "--budget", "0", cwd=tmp_path, env=ENV)
        uploads = [r["body"] for r in target.requests() if r["method"] == "PUT"]
    assert child.data["progress"]["total"] == 1, child.envelope
    assert uploads == ["External_Id__c,Email\nk2-bogus-bob,bogus-bob@example.com\n"]
