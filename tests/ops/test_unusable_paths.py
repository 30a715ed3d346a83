"""Paths BulkRelay cannot use: each gets its own error code, message and exit code, never a traceback.

Tests run as root here, and root reads and writes anything. So the child drops the two capabilities
that let root ignore file permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) from its bounding set:
after exec it is held to permission bits like anyone else. Not as root, the bits apply already.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import cli_env, run_cli
from tests.taggedjobs import journal, run_job, target_ids, write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_NOBODY = 65534


def _held_to_permissions() -> None:
    """preexec_fn: the child obeys file permission bits, even as root."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_an_unreadable_job_file_is_job_file_unreadable(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    job.chmod(0)
    result = run_cli("validate", job, cwd=tmp_path, preexec_fn=_held_to_permissions)
    assert result.exit_code == ExitCode.NOT_FOUND, result.envelope
    assert result.error_code == "JOB_FILE_UNREADABLE"
    assert str(job) in result.envelope["error"]["message"]
    assert "ermission denied" in result.envelope["error"]["message"]


def test_a_runs_dir_that_cannot_be_made_is_runs_dir_unwritable(tmp_path: Path) -> None:
    in_the_way = tmp_path / "not-a-dir"
    in_the_way.write_text("a file where the runs dir's parent should be\n")
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        result = run_cli("run", job, "--budget", "0", "--runs-dir", in_the_way / "runs", cwd=tmp_path)
        assert target.stats()["requests"] == 0
    assert result.exit_code == ExitCode.PRECONDITION, result.envelope
    assert result.error_code == "RUNS_DIR_UNWRITABLE"
    assert result.envelope["error"]["context"]["runs_dir"] == str(in_the_way / "runs")
    assert "--runs-dir" in result.envelope["error"]["suggestion"]


def test_a_runs_dir_without_write_permission_is_runs_dir_unwritable(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    runs.chmod(0o555)
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    result = run_cli(
        "run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path, preexec_fn=_held_to_permissions
    )
    assert result.exit_code == ExitCode.PRECONDITION, result.envelope
    assert result.error_code == "RUNS_DIR_UNWRITABLE"
    assert "ermission denied" in result.envelope["error"]["message"]


def test_a_state_dir_that_cannot_be_made_or_written_is_state_dir_unwritable(tmp_path: Path) -> None:
    in_the_way = tmp_path / "not-a-dir"
    in_the_way.write_text("")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    for state in (in_the_way / "state", read_only):
        env = cli_env(BULKRELAY_STATE_DIR=str(state))
        for args in (("run", job, "--budget", "5s"), ("job", "status", "run-0123456789")):
            result = run_cli(*args, cwd=tmp_path, env=env, preexec_fn=_held_to_permissions)
            assert result.exit_code == ExitCode.PRECONDITION, result.envelope
            assert result.error_code == "STATE_DIR_UNWRITABLE"
            assert str(state) in result.envelope["error"]["message"]


def test_a_lock_of_another_user_is_run_lock_not_ours(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"after": 2, "status": 401}]}) as target:
        job = write_job(tmp_path, target.url, rows=10, execution={"concurrency": 1})
        halted = run_job(job)
        assert halted.data["state"] == "stopped", halted.envelope
        run_dir = Path(halted.data["run_dir"])
        lock = run_dir / "lock"
        if os.geteuid() == 0:
            os.chown(lock, _NOBODY, _NOBODY)  # another user's run, as far as its lock says
        lock.chmod(0o600 if os.geteuid() == 0 else 0)
        target.reset()
        refused = run_cli("resume", run_dir, "--budget", "0", cwd=tmp_path, preexec_fn=_held_to_permissions)
        assert target.stats()["requests"] == 0
    status = run_cli("status", run_dir, preexec_fn=_held_to_permissions)
    assert status.exit_code == ExitCode.SUCCESS and status.data["live"] is True  # cannot tell: assume held
    assert refused.exit_code == ExitCode.CONFLICT, refused.envelope
    assert refused.error_code == "RUN_LOCK_NOT_OURS"
    context = refused.envelope["error"]["context"]
    assert context["owner_uid"] == lock.stat().st_uid and context["run_dir"] == str(run_dir)


def _small_files_only() -> None:
    """preexec_fn: no file may grow past 8 KiB (EFBIG instead of SIGXFSZ), as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))


def test_storage_failed_names_the_run_and_the_command_that_continues(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=300)
        runs = tmp_path / "runs"
        failed = run_cli(
            "run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path, preexec_fn=_small_files_only
        )
        assert failed.exit_code == ExitCode.GENERAL_ERROR, failed.envelope
        assert failed.error_code == "STORAGE_FAILED"
        run_dir = failed.data["run_dir"]
        assert failed.data["continue_command"] == f"bulkrelay resume {run_dir}"
        assert Path(run_dir).parent == runs and failed.data["run_id"] == Path(run_dir).name
        first = set(target_ids(target))
        committed_before = len(journal(run_dir))  # what the small file let through before the write failed

        resumed = run_cli(*failed.data["continue_command"].split()[1:], "--budget", "0", cwd=tmp_path)
    assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
    assert sorted(e["row_number"] for e in journal(run_dir)) == list(range(1, 301))
    # The run stopped short of its journal's end; how many requests had gone out by then depends on the
    # machine's load (all 300, at times), so only that some had is asserted of the target.
    assert committed_before < 300 and len(first) > 0
