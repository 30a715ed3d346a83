"""`prune` and the retention `run` applies from `.bulkrelay/config.yaml`: only finished runs go,
never a live or resumable one, never the newest run of a job."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.job.inputs import spool_file
from bulkrelay.ops.prune import prune
from bulkrelay.ops.settings import Retention
from bulkrelay.store.rundir import RunDir, RunState
from tests.alpharuns import write_alpha_run
from tests.clirun import cli_env, run_cli
from tests.jobfiles import write_job
from tests.runplans import run_plan
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def _make_run(runs: Path, job: str, state: RunState, days_old: float) -> RunDir:
    run = RunDir.create(runs, run_plan(job, name=Path(job).stem))
    created = datetime.now(UTC) - timedelta(days=days_old)
    run.save(replace(run.manifest, state=state, created_at=created.strftime("%Y-%m-%dT%H:%M:%S.%fZ")))
    return run


def _remaining(runs: Path) -> set[str]:
    return {p.name for p in runs.iterdir() if (p / "run.json").exists()}


class _LockHolder:
    """Another live process holding a run's lock, as a running `bulkrelay` would."""

    def __init__(self, run: RunDir) -> None:
        code = (
            "import fcntl, os, sys\n"
            f"fd = os.open({str(run.path / 'lock')!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "locked"  # waits for the lock, however long

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        self.proc.stdout.close()


def test_prune_keeps_the_newest_of_each_job_and_never_a_live_or_resumable_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    a = [
        _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=10 - n) for n in range(4)
    ]  # a[3] newest
    resumable = _make_run(runs, "/jobs/a.yaml", RunState.STOPPED, days_old=20)
    crashed = _make_run(runs, "/jobs/a.yaml", RunState.RUNNING, days_old=21)
    live = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED_WITH_FAILURES, days_old=22)
    only_b = _make_run(runs, "/jobs/b.yaml", RunState.COMPLETED, days_old=90)  # the last of its job
    holder = _LockHolder(live)
    try:
        report = prune(runs, Retention(keep=2))
    finally:
        holder.release()
    assert sorted(report.removed) == sorted([a[0].run_id, a[1].run_id])
    kept = [a[2], a[3], resumable, crashed, live, only_b]
    assert _remaining(runs) == {run.run_id for run in kept}
    again = prune(runs, Retention(keep=2))  # the lock is free now: the live run was finished
    assert again.removed == [live.run_id]


def test_prune_older_than_and_dry_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=40)
    recent = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=5)
    newest = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=1)
    dry = prune(runs, Retention(older_than="30d"), dry_run=True)
    assert dry.removed == [old.run_id]
    assert _remaining(runs) == {old.run_id, recent.run_id, newest.run_id}  # a dry run removes nothing
    answer = run_cli("prune", "--older-than", "30d", "--runs-dir", runs, cwd=tmp_path)
    assert answer.exit_code == ExitCode.SUCCESS, answer.envelope
    assert answer.data["removed"] == [old.run_id] and answer.data["kept"] == 2
    assert _remaining(runs) == {recent.run_id, newest.run_id}


def test_kept_counts_every_run_that_stays_unreadable_and_the_alphas_too(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    old = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=40)
    _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=1)
    damaged = _make_run(runs, "/jobs/b.yaml", RunState.COMPLETED, days_old=40)
    (damaged.path / "run.json").write_text("{not json")
    write_alpha_run(runs, write_job(tmp_path, "http://127.0.0.1:9/", job_name="alpha.yaml"))
    answer = run_cli("prune", "--older-than", "30d", "--runs-dir", runs, cwd=tmp_path)
    assert answer.exit_code == ExitCode.SUCCESS, answer.envelope
    assert answer.data["removed"] == [old.run_id]
    assert [w["code"] for w in answer.envelope["warnings"]] == ["RUN_UNREADABLE"]
    assert answer.data["kept"] == 3  # the newest of a.yaml, the damaged run, the alpha's run


def test_prune_without_a_rule_or_with_a_bad_one_is_a_usage_error(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for args in ([], ["--keep", "0"], ["--older-than", "soon"]):
        answer = run_cli("prune", *args, "--runs-dir", runs, cwd=tmp_path)
        assert answer.exit_code == ExitCode.ARG_ERROR, (args, answer.envelope)


def test_run_applies_retention_from_the_settings_file_at_its_end(tmp_path: Path) -> None:
    settings = tmp_path / ".bulkrelay" / "config.yaml"
    settings.parent.mkdir()
    settings.write_text("retention:\n  keep: 2\n")
    runs = tmp_path / ".bulkrelay" / "runs"
    made: list[str] = []
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, 3)
        for _ in range(3):
            run = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env())
            assert run.exit_code == ExitCode.SUCCESS, run.envelope
            made.append(run.data["run_id"])
    assert run.data["pruned"] == [made[0]]
    assert _remaining(runs) == set(made[1:])


def test_a_bad_settings_file_is_a_warning_at_the_end_of_a_run_and_an_error_for_prune(
    tmp_path: Path,
) -> None:
    settings = tmp_path / ".bulkrelay" / "config.yaml"
    settings.parent.mkdir()
    settings.write_text("retention:\n  keep: 2\n  kep: 3\n")
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, 2)
        run = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert run.exit_code == ExitCode.SUCCESS, run.envelope
    warning = next(w for w in run.envelope["warnings"] if w["code"] == "PRUNE_FAILED")
    assert "config.yaml:3" in warning["message"] and "kep" in warning["message"]
    answer = run_cli("prune", cwd=tmp_path)
    assert answer.exit_code == ExitCode.ARG_ERROR and answer.error_code == "CONFIG_INVALID"


@pytest.mark.slow
def test_an_age_needs_a_unit_as_a_flag_and_in_the_settings_file_alike(tmp_path: Path) -> None:
    """Before, `--older-than 30` meant 30 seconds (a dry run listed runs minutes old), and `older_than: 0`
    was refused in the settings file (not a string) but `--older-than 0` accepted."""
    runs = tmp_path / "runs"
    minutes_old = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=0.01)
    _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=0)
    settings = tmp_path / ".bulkrelay" / "config.yaml"
    settings.parent.mkdir()
    for bare in ("30", "0"):
        flag = run_cli("prune", "--older-than", bare, "--dry-run", "--runs-dir", runs, cwd=tmp_path)
        assert flag.exit_code == ExitCode.ARG_ERROR and flag.error_code == "USAGE_ERROR", flag.envelope
        assert "no unit" in flag.envelope["error"]["message"]
        assert flag.envelope["error"]["suggestion"] == f"--older-than {bare}d"
        settings.write_text(f"retention:\n  older_than: {bare}\n")
        filed = run_cli("prune", "--dry-run", "--runs-dir", runs, cwd=tmp_path)
        assert filed.exit_code == ExitCode.ARG_ERROR and filed.error_code == "CONFIG_INVALID", filed.envelope
        assert "config.yaml:2" in filed.envelope["error"]["message"]
        assert "no unit" in filed.envelope["error"]["message"]
    settings.write_text("retention:\n  older_than: 0d\n")
    aged = run_cli("prune", "--dry-run", "--runs-dir", runs, cwd=tmp_path)
    assert aged.exit_code == ExitCode.SUCCESS and aged.data["removed"] == [minutes_old.run_id], aged.envelope
    flagged = run_cli("prune", "--older-than", "30d", "--dry-run", "--runs-dir", runs, cwd=tmp_path)
    assert flagged.exit_code == ExitCode.SUCCESS and flagged.data["removed"] == [], flagged.envelope


@pytest.mark.slow
def test_a_settings_typo_gets_did_you_mean_naming_the_settings_key(tmp_path: Path) -> None:
    """Before, `kep` got no suggestion: the job file's check looked for it among job keys."""
    settings = tmp_path / ".bulkrelay" / "config.yaml"
    settings.parent.mkdir()
    settings.write_text("retension:\n  keep: 2\n")
    top = run_cli("prune", cwd=tmp_path)
    assert top.error_code == "CONFIG_INVALID", top.envelope
    assert "config.yaml:1" in top.envelope["error"]["message"]
    assert "did you mean 'retention'?" in top.envelope["error"]["message"]
    settings.write_text("retention:\n  keep: 2\n  older_then: 30d\n")
    inner = run_cli("prune", cwd=tmp_path)
    assert "config.yaml:3" in inner.envelope["error"]["message"]
    assert "did you mean 'older_than'?" in inner.envelope["error"]["message"]


@pytest.mark.slow
def test_prune_skips_a_linked_run_with_a_warning_and_reports_every_removal(tmp_path: Path) -> None:
    """Before, a run directory that was a symbolic link crashed prune (exit 1, `data: null`, rmtree on a
    link) after it had removed a real run, which no answer then reported."""
    runs = tmp_path / "runs"
    old = [_make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=30 - n) for n in range(3)]
    newest = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=1)
    archived = tmp_path / "archive" / old[1].run_id
    archived.parent.mkdir()
    old[1].path.rename(archived)
    (runs / old[1].run_id).symlink_to(archived)  # a run kept on another disk, linked in
    (runs / "nightly-latest").symlink_to(newest.path)  # an alias of a run listed beside it
    answer = run_cli("prune", "--keep", "1", "--runs-dir", runs, cwd=tmp_path)
    assert answer.exit_code == ExitCode.SUCCESS, answer.envelope
    assert sorted(answer.data["removed"]) == sorted([old[0].run_id, old[2].run_id])
    skipped = [w for w in answer.envelope["warnings"] if w["code"] == "RUN_LINK_SKIPPED"]
    assert [w["context"]["run_dir"] for w in skipped] == [str(runs / old[1].run_id)]
    assert archived.is_dir() and (runs / old[1].run_id).is_symlink()  # neither the link nor its target
    assert newest.path.is_dir()
    assert _remaining(runs) == {old[1].run_id, newest.run_id, "nightly-latest"}


def test_keep_counts_a_mirror_night_with_its_deletion_run(tmp_path: Path) -> None:
    """--keep 2 keeps two nights of a mirror job, each its run and the deletion run that followed it."""
    runs = tmp_path / "runs"
    nights = []
    for n in range(3):  # nights[2] newest
        night = _make_run(runs, "/jobs/m.yaml", RunState.COMPLETED, days_old=10 - n)
        deleted = RunDir.create(runs, run_plan("/jobs/m.yaml", mirror_deletes=True, mirror_of=night.run_id))
        created = datetime.now(UTC) - timedelta(days=10 - n - 0.5)
        stamp = created.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        deleted.save(replace(deleted.manifest, state=RunState.COMPLETED, created_at=stamp))
        nights.append((night.run_id, deleted.run_id))

    report = prune(runs, Retention(keep=2))

    assert sorted(report.removed) == sorted(nights[0])
    assert _remaining(runs) == {run for night in nights[1:] for run in night}


def test_prune_keeps_a_run_whose_directory_holds_the_input_of_a_run_that_stays(tmp_path: Path) -> None:
    """A run fed from stdin (or a query) keeps its input in its own directory, and a `retry-failed`
    child reads it there: removing the parent while the child runs (or may resume, or be exported)
    removed the child's input. The parent goes only with every run that reads its input."""
    runs = tmp_path / "runs"
    parent = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED_WITH_FAILURES, days_old=3)
    copy = parent.path / "input.csv"
    reads_parent = run_plan("/jobs/a.yaml", parent_run=parent.run_id).with_input_path(copy)
    copy.write_text("id\n1\n")
    child = RunDir.create(runs, reads_parent)  # running: a live or crashed retry-failed
    grandchild = RunDir.create(runs, replace(reads_parent, parent_run=child.run_id))
    unrelated = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=2)

    report = prune(runs, Retention(keep=1))

    assert report.removed == [unrelated.run_id]
    assert _remaining(runs) == {parent.run_id, child.run_id, grandchild.run_id}
    assert copy.is_file()

    for run in (child, grandchild):  # once every reader is finished and let go, the parent goes too
        run.save(replace(run.manifest, state=RunState.COMPLETED, created_at=parent.manifest.created_at))
    later = _make_run(runs, "/jobs/a.yaml", RunState.COMPLETED, days_old=0)
    again = prune(runs, Retention(keep=1))
    assert sorted(again.removed) == sorted([parent.run_id, child.run_id, grandchild.run_id])
    assert _remaining(runs) == {later.run_id}


def test_prune_removes_the_spool_files_of_ended_processes_and_never_a_live_ones(tmp_path: Path) -> None:
    """Issue 38 item 12: a run killed mid-snapshot leaves its spool file, which nothing removed. Here a
    dead process's file is one whose `.owner-<pid>` nobody holds; this process's own stays."""
    spool = tmp_path / "runs" / ".spool"
    live = spool_file(spool, "query", ".jsonl")
    live.write_bytes(b"{}\n")
    dead_pid = _ended_pid()
    (spool / f".owner-{dead_pid}").touch()
    left = [spool / f"query-{dead_pid}-1.jsonl", spool / f"parquet-{dead_pid}-2.jsonl"]
    for path in left:
        path.write_bytes(b"x" * 10)
    older = spool / f"stdin-{dead_pid}-3.csv"  # an earlier version's: no owner file, its pid gone
    older.write_bytes(b"y")

    dry = prune(tmp_path / "runs", Retention(keep=1), dry_run=True)
    assert sorted(path.name for path, _ in dry.spools) == sorted(p.name for p in [*left, older])
    assert sum(size for _, size in dry.spools) == 21 and all(p.exists() for p in [*left, older])

    pruned = prune(tmp_path / "runs", Retention(keep=1))
    assert len(pruned.spools) == 3
    assert sorted(p.name for p in spool.iterdir()) == sorted([live.name, f".owner-{os.getpid()}"])


def _ended_pid() -> int:
    """The pid of a process that has ended (and been reaped): no process has it now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
