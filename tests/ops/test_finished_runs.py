"""A run that completed or was cancelled keeps no `checkpoint.json` (REQ-C-035, issue 22 item 17);
its journal and summary stay, and every command that reads a finished run still works from them.
Real processes against a loopback target."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import is_commit_marker
from tests.clirun import CliResult, cli_env, run_cli
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_S, wait_for

_FAILING = {"rules": [{"match": {"path_contains": f"/items/{row}"}, "status": 422} for row in (3, 7)]}


def _cli(tmp_path: Path, *args: str | Path) -> CliResult:
    return run_cli(*args, cwd=tmp_path, env=cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state")))


@pytest.mark.slow
def test_a_finished_run_keeps_no_checkpoint_and_every_reader_still_works(tmp_path: Path) -> None:
    with TargetProcess(_FAILING) as target:
        job = write_job(tmp_path, target.url, rows=10)
        finished = _cli(tmp_path, "run", job, "--budget", "0")
        assert finished.exit_code == ExitCode.PARTIAL_FAILURE, finished.envelope
        run_dir = Path(finished.data["run_dir"])
        assert not (run_dir / "checkpoint.json").exists()
        assert (run_dir / "results.jsonl").stat().st_size > 0 and (run_dir / "summary.json").exists()

        status = _cli(tmp_path, "status", run_dir)
        progress = status.data["progress"]
        assert (progress["done"], progress["ok"], progress["failed"]) == (10, 8, 2), status.data
        (row,) = _cli(tmp_path, "runs").data["runs"]
        assert (row["done"], row["total"], row["failed"]) == (10, 10, 2)
        exported = _cli(tmp_path, "export", run_dir, "--failed", "-o", tmp_path / "failed.csv")
        assert exported.exit_code == ExitCode.SUCCESS and exported.data["rows"] == 2, exported.envelope
        failures = _cli(tmp_path, "failures", run_dir)
        assert failures.exit_code == ExitCode.SUCCESS and failures.data["failed"] == 2
        refused = _cli(tmp_path, "resume", run_dir, "--budget", "0")
        assert (
            refused.error_code == "RUN_NOT_RESUMABLE"
            and "completed_with_failures" in refused.envelope["error"]["message"]
        )

        target.reset()
        retried = _cli(tmp_path, "retry-failed", run_dir, "--budget", "0")
        assert retried.exit_code == ExitCode.PARTIAL_FAILURE, retried.envelope
        assert target.stats()["requests"] == 2  # the failed rows, read from the journal alone
        assert not (Path(retried.data["run_dir"]) / "checkpoint.json").exists()

        again = _cli(tmp_path, "run", job, "--budget", "0")  # the identical invocation starts fresh
        assert again.data["run_id"] != finished.data["run_id"]
        assert again.data["progress"]["done"] == 10
        pruned = _cli(tmp_path, "prune", "--keep", "1")
        assert pruned.exit_code == ExitCode.SUCCESS, pruned.envelope


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["a_whole_group_gone", "the_last_group_cut"])
def test_a_damaged_journal_of_a_finished_run_is_still_refused_without_a_checkpoint(
    tmp_path: Path, damage: str
) -> None:
    # The checkpoint used to catch a journal shorter than it; now the summary and the markers do.
    with TargetProcess(_FAILING) as target:
        job = write_job(tmp_path, target.url, rows=30, execution={"concurrency": 1})
        finished = _cli(tmp_path, "run", job, "--budget", "0")
    journal = Path(finished.data["run_dir"]) / "results.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    markers = [index for index, line in enumerate(lines) if is_commit_marker(line)]
    assert markers and markers[-1] == len(lines) - 1
    # How many groups the writer made depends on timing: without the last one, the journal holds what
    # the groups before it did (nothing, when the run was committed as one group).
    before_last = markers[-2] + 1 if len(markers) >= 2 else 0
    if damage == "a_whole_group_gone":
        journal.write_bytes(b"".join(lines[:before_last]))
    else:  # the marker and half the row before it: torn whether or not the run made more groups (a
        # journal of one group without its marker reads as an older version's, all its rows whole)
        last_row = lines[-2]
        journal.write_bytes(b"".join(lines[:-2]) + last_row[: len(last_row) // 2])
    for command in ("export", "failures"):
        refused = _cli(tmp_path, command, finished.data["run_dir"], "-o", tmp_path / "out.csv")
        if command == "failures":
            refused = _cli(tmp_path, command, finished.data["run_dir"])
        assert refused.exit_code == ExitCode.PRECONDITION, refused.envelope
        assert refused.error_code == "JOURNAL_CORRUPT"


@pytest.mark.slow
def test_a_cancelled_run_keeps_no_checkpoint(tmp_path: Path) -> None:
    with TargetProcess(
        {"rules": [{"delay_ms": int(HANG_S * 1000), "match": {"path_contains": "/items/5"}}]}
    ) as target:
        # Cancel waits for the request in flight (a safe point): the read timeout answers it. The
        # cancel is sent once row 5 is in flight, and the timeout is long enough for a loaded machine
        # to start `job cancel` before it runs out (with 2 s, the run sometimes ended first).
        execution = {"concurrency": 1, "timeout": {"read_seconds": 8}}
        job = write_job(tmp_path, target.url, rows=8, execution=execution, retry={"max_attempts": 1})
        handed_off = _cli(tmp_path, "run", job, "--budget", "1s")
        assert handed_off.exit_code == ExitCode.INCOMPLETE, handed_off.envelope
        job_id = handed_off.data["job_id"]
        wait_for(lambda: target.stats()["requests"] >= 5, "row 5 in flight")  # arrivals, answered or not
        cancelled = _cli(tmp_path, "job", "cancel", job_id, "--budget", HANG_BUDGET)
        assert cancelled.data["run_state"] == "cancelled", cancelled.envelope
    run_dir = Path(cancelled.data["run_dir"])
    assert not (run_dir / "checkpoint.json").exists()
    status = _cli(tmp_path, "status", run_dir)
    assert status.data["state"] == "cancelled" and status.data["progress"]["done"] == 5, status.data


@pytest.mark.slow
@pytest.mark.parametrize("journal", ["whole", "a_whole_group_gone"])
def test_a_completed_run_without_its_summary_is_refused_not_read_as_nothing_done(
    tmp_path: Path, journal: str
) -> None:
    # A completed run writes summary.json before its state and then drops its checkpoint, so no crash
    # leaves it without both. Read anyway, status said 0 of 10 done, and export wrote the rows of a
    # lost group as never sent.
    with TargetProcess({}) as target:
        job = write_job(tmp_path, target.url, rows=10, execution={"concurrency": 1})
        finished = _cli(tmp_path, "run", job, "--budget", "0")
    assert finished.exit_code == ExitCode.SUCCESS, finished.envelope
    run_dir = Path(finished.data["run_dir"])
    (run_dir / "summary.json").unlink()
    if journal == "a_whole_group_gone":
        lines = (run_dir / "results.jsonl").read_bytes().splitlines(keepends=True)
        markers = [index for index, line in enumerate(lines) if is_commit_marker(line)]
        kept = lines[: markers[-2] + 1] if len(markers) > 1 else []
        (run_dir / "results.jsonl").write_bytes(b"".join(kept))
    for args in (("status", run_dir), ("export", run_dir, "-o", tmp_path / "out.csv"), ("failures", run_dir)):
        refused = _cli(tmp_path, *args)
        assert refused.exit_code == ExitCode.PRECONDITION, refused.envelope
        assert refused.error_code == "JOURNAL_CORRUPT", refused.envelope
        assert "summary.json" in refused.envelope["error"]["message"]
    assert not (tmp_path / "out.csv").exists()
