"""A bulk job through the command line: `poll.max_wait` stops the call resumably (exit 10 with
`continue_command`), and `resume` polls the same job to its end without submitting its rows again;
`retry-failed`, `export` and `failures` read a bulk run's rows as any run's; a background job's progress,
as `job status` and `job wait` show it, counts the jobs created, processing and done beside the rows."""

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
from tests.waiting import HANG_BUDGET, wait_for

pytestmark = pytest.mark.slow
ENV = cli_env(SF_TOKEN="tok")


def test_max_wait_stops_resumably_and_resume_attaches_to_the_same_job(tmp_path: Path) -> None:
    with TargetProcess({"bulk": {"stuck": True}}) as target:
        job = write_bulk_job(tmp_path, target.url, ["ann", "bogus-bob", "cy"])
        spec = yaml.safe_load(job.read_text())
        spec["request"]["bulk_job"]["poll"] = {
            "first_seconds": 0.02,
            "max_seconds": 0.05,
            "max_wait": "3s",  # the resume's bound too: attach, two polls, three fetches, on a loaded machine
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


def test_a_background_jobs_progress_shows_its_bulk_jobs_created_processing_and_done(tmp_path: Path) -> None:
    env = cli_env(SF_TOKEN="tok", BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    with TargetProcess({"bulk": {"stuck": True}}) as target:  # the first job stays InProgress
        job = write_bulk_job(tmp_path, target.url, ["ann", "bogus-bob", "cy", "dan", "eve"])
        front = run_cli("run", job, "--budget", "1s", cwd=tmp_path, env=env)
        assert front.exit_code == ExitCode.INCOMPLETE, front.envelope
        job_id = front.data["job_id"]

        def processing() -> dict[str, object] | None:
            status = run_cli("job", "status", job_id, cwd=tmp_path, env=env)
            jobs: dict[str, object] | None = status.data["progress"].get("jobs")
            return jobs if jobs is not None and jobs["processing"] == 1 else None

        assert wait_for(processing, "the first bulk job processing") == {
            "created": 1, "processing": 1, "done": 0, "aborted": 0
        }  # fmt: skip
        held = run_cli("job", "wait", job_id, "--budget", "200ms", cwd=tmp_path, env=env)
        assert held.exit_code == ExitCode.INCOMPLETE, held.envelope
        assert held.data["progress"]["jobs"]["processing"] == 1 and held.data["progress"]["done"] == 0
        target.set_plan({"bulk": {"stuck": False}})
        final = run_cli("job", "wait", job_id, "--budget", HANG_BUDGET, cwd=tmp_path, env=env)
    assert final.exit_code == ExitCode.PARTIAL_FAILURE, final.envelope
    progress = final.data["progress"]
    assert progress["jobs"] == {"created": 2, "processing": 0, "done": 2, "aborted": 0}
    assert (progress["done"], progress["ok"], progress["failed"]) == (5, 4, 1)


def test_retry_failed_of_a_bulk_jobs_rows_whose_results_did_not_fit_says_they_may_have_been_applied(
    tmp_path: Path,
) -> None:
    """A job whose results name a key it was never sent ran, but its rows' outcomes cannot be told: they
    fail as `batch_answer_invalid`, and sending them again in another job is said, as for a batch."""
    with TargetProcess({"bulk": {"hostile_results": "unknown_key"}}) as target:
        job = write_bulk_job(tmp_path, target.url, ["ann", "bob", "cy"])
        first = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=ENV)
        assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
        target.set_plan({})
        retried = run_cli("retry-failed", first.data["run_dir"], "--budget", "0", cwd=tmp_path, env=ENV)
    entries = list(read_journal(Path(first.data["run_dir"]) / "results.jsonl"))
    assert {entry.classification for entry in entries} == {"batch_answer_invalid"}
    assert retried.exit_code == ExitCode.SUCCESS, retried.envelope
    [warning] = [w for w in retried.envelope["warnings"] if w["code"] == "ANSWER_UNREAD_RESENT"]
    assert warning["context"]["rows"] == 3
