"""A bulk-job run (salesforce_bulk2, named_import, and generic: paged JSON results, and Mailchimp-like
batches submitted with their rows and read from an archive) killed with SIGKILL at random moments, over
create, upload, close, poll and fetch, then the identical invocation run to its end: every row journaled
exactly once, each with its own outcome, and the target counts no row processed in two jobs that both ran."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from bulkrelay.store.journal.jobrecords import read_job_records
from tests.clirun import cli_env, run_cli, start_cli
from tests.relay.bulkrun import generic_json_steps, write_batches_job, write_bulk_job, write_generic_job
from tests.spawnedruns import run_held_by
from tests.targetproc import TargetProcess

ROWS = 60
KILLS = 6  # the 30 were run by hand (docs/bulk-jobs.md); the suite keeps a cheap loop
NAMES = ["bogus" if n % 11 == 0 else "later" if n % 7 == 0 else "row" for n in range(1, ROWS + 1)]
ENV = cli_env(SF_TOKEN="tok")


SALESFORCE = {"bulk": {"delay_ms": 15, "polls_to_complete": 3, "fail_job_every": 9}}
IMPORTS = {"imports": {"delay_ms": 15, "polls_to_complete": 3, "fail_import_every": 9, "page_size": 4}}


def kill_loop(tmp_path: Path, kills: int, seed: int, *, named_import: bool = False) -> Counter[str]:
    """Kill the run `kills` times, then run it to its end and check it; returns the step each kill
    fell in (the last job record on disk then: created = uploading, uploaded = closing, ...)."""
    rng = random.Random(seed)
    runs_root = tmp_path / ".bulkrelay" / "runs"
    phases: Counter[str] = Counter()
    with TargetProcess(IMPORTS if named_import else SALESFORCE) as target:
        kind = {"kind": "named_import", "base_url": target.url, "object": "0-1"} if named_import else {}
        job = write_bulk_job(tmp_path, target.url, NAMES, max_rows=3, **kind)
        spec = yaml.safe_load(job.read_text())
        spec["request"]["bulk_job"]["poll"] = {"first_seconds": 0.02, "max_seconds": 0.05}
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        for kill in range(kills):
            proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, env=ENV, output="stdout")
            run_dir = run_held_by(runs_root, proc)
            time.sleep(rng.uniform(0.05, 0.5))
            if proc.poll() is not None:
                said = proc.communicate()[0]
                assert proc.returncode == ExitCode.PARTIAL_FAILURE, f"kill {kill}: {said!r}"
                break  # the run ended before this kill
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()  # its pipe, left open, warns (an error under -W error) later
            records = list(read_job_records(run_dir / "results.jsonl"))
            phases[records[-1]["event"] if records else "before the first job"] += 1
        final = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=ENV, timeout=120)
        stats = target.stats()
    assert final.exit_code == ExitCode.PARTIAL_FAILURE, final.envelope
    run_dir = Path(final.data["run_dir"])
    entries = list(read_journal(run_dir / "results.jsonl"))
    assert sorted(entry.row_number for entry in entries) == list(range(1, ROWS + 1))  # each row once
    assert stats["import_rows_in_two_imports" if named_import else "bulk_rows_in_two_jobs"] == 0, stats
    captured, job_failed, row_failed = (
        ("import_id", "the import ended FAILED", "INVALID_PROPERTY_VALUE")
        if named_import
        else ("sf__Id", "InvalidBatch", "INVALID_FIELD")
    )
    for entry in entries:
        name = NAMES[entry.row_number - 1]
        if entry.success:
            assert name != "bogus" and entry.captured is not None and entry.captured[captured]
        else:
            failed_job = job_failed in (entry.error or "")
            assert failed_job or (name == "bogus" and row_failed in (entry.error or "")), entry
    return phases


@pytest.mark.slow
def test_kill_9_loop_over_bulk_jobs_submits_no_row_in_two_jobs_that_ran(tmp_path: Path) -> None:
    phases = kill_loop(tmp_path, KILLS, seed=40)
    assert sum(phases.values()) >= 1


@pytest.mark.slow
def test_kill_9_loop_over_named_imports_imports_no_row_twice(tmp_path: Path) -> None:
    """Killed over submit, poll and fetch: the identical re-run finds each journaled import by its
    name in the target's list and attaches to it."""
    phases = kill_loop(tmp_path, 4, seed=41, named_import=True)
    assert sum(phases.values()) >= 1


GENERIC_ROWS = 15
GENERIC_NAMES = ["bogus" if n % 7 == 0 else "row" for n in range(1, GENERIC_ROWS + 1)]


def generic_kill_loop(
    tmp_path: Path, plan: dict[str, Any], write: Callable[[Path, str], Path], kills: int, seed: int
) -> tuple[list[Any], dict[str, Any], Path]:
    """Kill the run of the job `write` makes `kills` times at random moments, then run it to its end:
    its journal's entries (each row once), the target's stats and the run directory."""
    rng = random.Random(seed)
    runs_root = tmp_path / ".bulkrelay" / "runs"
    with TargetProcess(plan) as target:
        job = write(tmp_path, target.url)
        for _ in range(kills):
            proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, env=ENV, output="discarded")
            run_held_by(runs_root, proc)
            time.sleep(rng.uniform(0.05, 0.4))
            if proc.poll() is not None:
                break  # the run ended before this kill
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        final = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=ENV, timeout=120)
        stats = target.stats()
    assert final.exit_code == ExitCode.PARTIAL_FAILURE, final.envelope
    run_dir = Path(final.data["run_dir"])
    entries = list(read_journal(run_dir / "results.jsonl"))
    assert sorted(entry.row_number for entry in entries) == list(range(1, GENERIC_ROWS + 1))  # each once
    for entry in entries:
        assert entry.success == (GENERIC_NAMES[entry.row_number - 1] != "bogus"), entry
    return entries, stats, run_dir


def _small_jobs(job: Path) -> Path:
    spec = yaml.safe_load(job.read_text())
    spec["request"]["bulk_job"] |= {"max_rows": 3, "poll": {"first_seconds": 0.02, "max_seconds": 0.05}}
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


@pytest.mark.slow
def test_kill_9_loop_over_generic_jobs_with_paged_json_results(tmp_path: Path) -> None:
    """Killed while paging too: a job's results are journaled once all its pages are read, so the
    re-run reads them again; each row journaled once, none in two jobs that ran."""

    def write(base: Path, url: str) -> Path:
        job = write_generic_job(base, url, GENERIC_NAMES)
        spec = yaml.safe_load(job.read_text())
        steps = generic_json_steps()
        for result_set in steps["results"]:
            result_set["pages"] = {"next": "/nextRecordsUrl"}
        spec["request"]["bulk_job"]["steps"] = steps
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        return _small_jobs(job)

    plan = {"bulk": {"delay_ms": 15, "polls_to_complete": 3, "results_page_size": 1}}
    _, stats, _ = generic_kill_loop(tmp_path, plan, write, kills=3, seed=42)
    assert stats["bulk_rows_in_two_jobs"] == 0, stats


@pytest.mark.slow
def test_kill_9_loop_over_submitted_batches_runs_twice_only_rows_of_lost_submits(tmp_path: Path) -> None:
    """Mailchimp-like batches (no create, resubmit: safe) with archived results: each row journaled
    once; an operation run by two batches only when its first batch was lost between its submit and
    its `created` record (journaled `aborted`, its rows submitted again)."""

    def write(base: Path, url: str) -> Path:
        return _small_jobs(write_batches_job(base, url, GENERIC_NAMES, submit=True))

    plan = {"batch_ops": {"delay_ms": 15, "polls_to_complete": 3, "members_size": 1}}
    _, stats, run_dir = generic_kill_loop(tmp_path, plan, write, kills=3, seed=43)
    records = list(read_job_records(run_dir / "results.jsonl"))
    submitted = {r["bulk_job"]: r["keys"] for r in records if r["event"] == "submitting"}
    lost = {r["bulk_job"] for r in records if r["event"] == "aborted"} - {
        r["bulk_job"] for r in records if r["event"] == "created"
    }
    resent = sum(len(submitted[number]) for number in lost)
    assert stats["batch_ops_in_two_batches"] <= resent, (stats, lost)
