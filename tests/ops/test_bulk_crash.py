"""A bulk-job run (salesforce_bulk2, and named_import) killed with SIGKILL at random moments, over
create, upload, close, poll and fetch, then the identical invocation run to its end: every row journaled
exactly once, each with its own outcome, and the target counts no row processed in two jobs that both ran."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from bulkrelay.store.journal.jobrecords import read_job_records
from tests.clirun import cli_env, run_cli, start_cli
from tests.relay.bulkrun import write_bulk_job
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
