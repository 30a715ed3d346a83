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
from tests.clirun import CliResult, cli_env, run_cli
from tests.taggedjobs import journal, run_job, tag_rule, target_ids, write_job
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


def _latin1_dir(parent: Path) -> Path:
    """`parent/café` with its é written as the single byte E9 (Latin-1): a name that is not UTF-8."""
    made = parent / os.fsdecode(b"caf\xe9")
    try:
        made.mkdir()
    except OSError:  # a file system that takes only UTF-8 names (macOS)
        pytest.skip("this file system refuses a name that is not UTF-8")
    return made


def _refused(result: CliResult, shown: str, what: str) -> None:
    """A USAGE_ERROR naming the path the way UTF-8 can show it, what it is, why, and what to do."""
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    assert result.error_code == "USAGE_ERROR"
    error = result.envelope["error"]
    assert error["context"] == {"path": shown, "what": what}
    assert f"the {what} {shown} is not valid UTF-8" in error["message"]
    assert "resume" in error["message"] and "rename" in error["suggestion"]
    assert "Traceback" not in result.stdout.decode()


@pytest.mark.parametrize("budget", ["0", "30s"])
def test_a_run_from_a_directory_that_is_not_utf8_is_refused_before_anything(
    tmp_path: Path, target: TargetProcess, budget: str
) -> None:
    # Everything a run records (its manifest, its invocation key, a background job's spec) would hold
    # the lone surrogate Python reads the byte E9 as, which orjson refuses: once a GENERAL_ERROR with a
    # traceback. Now refused at once, naming the job file as a resume would have to read it back.
    here = _latin1_dir(tmp_path)
    write_job(here, target.url, rows=3)
    state = tmp_path / "state"
    result = run_cli(
        "run", "job.yaml", "--budget", budget, cwd=here, env=cli_env(BULKRELAY_STATE_DIR=str(state))
    )
    _refused(result, f"{tmp_path}/caf\\xe9/job.yaml", "job file")
    assert target.stats()["requests"] == 0
    assert not (here / ".bulkrelay").exists()  # no runs dir, no spool, no run
    assert not state.exists()  # no background job either


def test_a_runs_dir_from_the_environment_that_is_not_utf8_is_refused(
    tmp_path: Path, target: TargetProcess
) -> None:
    runs = _latin1_dir(tmp_path) / "runs"
    job = write_job(tmp_path, target.url, rows=3)
    result = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(BULKRELAY_RUNS_DIR=str(runs)))
    _refused(result, f"{tmp_path}/caf\\xe9/runs", "runs directory (BULKRELAY_RUNS_DIR)")
    assert target.stats()["requests"] == 0
    assert not runs.exists()


def test_the_working_directory_alone_not_utf8_is_refused(tmp_path: Path, target: TargetProcess) -> None:
    # Job, input and runs dir all named by UTF-8 paths: the run's manifest still records the cwd.
    here = _latin1_dir(tmp_path)
    job = write_job(tmp_path, target.url, rows=3)
    result = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=here)
    _refused(result, f"{tmp_path}/caf\\xe9", "working directory")
    assert "cd /" in result.envelope["error"]["suggestion"]
    assert target.stats()["requests"] == 0
    assert not (tmp_path / "runs").exists()


def _run_then_rename(tmp_path: Path, target: TargetProcess) -> tuple[Path, str]:
    """A run (one of its 3 rows failed) under `cafe/runs`, then `cafe` renamed to Latin-1 `caf\\xe9`:
    the runs directory (its new path) and the run's id. The job and its input stay where they were."""
    utf8 = tmp_path / "cafe"
    utf8.mkdir()
    job = write_job(tmp_path, target.url, rows=3, tags={2: "bad"})
    first = run_cli("run", job, "--budget", "0", "--runs-dir", utf8 / "runs", cwd=tmp_path)
    assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
    latin1 = tmp_path / os.fsdecode(b"caf\xe9")
    try:
        utf8.rename(latin1)
    except OSError:  # a file system that takes only UTF-8 names (macOS)
        pytest.skip("this file system refuses a name that is not UTF-8")
    return latin1 / "runs", str(first.data["run_id"])


@pytest.mark.target_plan({"rules": [tag_rule("bad", status=422)]})
def test_a_run_whose_directory_became_not_utf8_is_not_continued(
    tmp_path: Path, target: TargetProcess
) -> None:
    # A run made under a UTF-8 name whose directory was renamed since: retry-failed would make a run
    # beside it and resume would write in it, recording paths no JSON can hold.
    runs, run_id = _run_then_rename(tmp_path, target)
    target.reset()
    env = cli_env(BULKRELAY_RUNS_DIR=str(runs))
    for command in ("retry-failed", "resume"):
        result = run_cli(command, "latest", "--budget", "0", cwd=tmp_path, env=env)
        _refused(result, f"{tmp_path}/caf\\xe9/runs/{run_id}", "run directory")
    assert target.stats()["requests"] == 0
    assert [p.name for p in runs.iterdir() if not p.name.startswith(".")] == [run_id]


@pytest.mark.target_plan({"rules": [tag_rule("bad", status=422)]})
def test_the_readers_of_a_run_whose_directory_is_not_utf8_answer(
    tmp_path: Path, target: TargetProcess
) -> None:
    # Reading records nothing new: each answers, from inside the directory too; `report` once ended
    # in a traceback encoding its page, which names the run's directory (now as \\xe9, for people).
    runs, run_id = _run_then_rename(tmp_path, target)
    shown = f"{tmp_path}/caf\\xe9/runs/{run_id}"
    for args in (("status", "latest"), ("runs",), ("failures", "latest"), ("export", "latest", "--failed")):
        result = run_cli(*args, cwd=runs.parent, env=cli_env(BULKRELAY_RUNS_DIR="runs"))
        assert result.exit_code == ExitCode.SUCCESS, (args, result.envelope)
    written = run_cli("report", "latest", cwd=runs.parent, env=cli_env(BULKRELAY_RUNS_DIR="runs"))
    assert written.exit_code == ExitCode.SUCCESS, written.envelope
    assert written.data["run_dir"] == shown  # the envelope shows it as the page does
    assert shown in (runs / run_id / "report.html").read_text()


def test_a_run_directory_that_cannot_be_entered_is_named_not_a_traceback(tmp_path: Path) -> None:
    """A run directory this user may not enter (another user's, `chmod 000`): `runs` lists the others
    with a RUN_UNREADABLE warning naming it, `status` of it says it cannot be read (JOURNAL_CORRUPT), and
    `latest`, which it may be, is unknown rather than an older run. Before, each answered a
    PermissionError traceback (exit 1)."""
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        readable = run_job(job)
        closed = run_job(job, "--idempotency-key", "another-run")
    runs, closed_dir = tmp_path / "runs", Path(closed.data["run_dir"])
    closed_dir.chmod(0)
    try:
        listing = run_cli("runs", "--runs-dir", runs, cwd=tmp_path, preexec_fn=_held_to_permissions)
        status = run_cli("status", closed_dir, cwd=tmp_path, preexec_fn=_held_to_permissions)
        latest = run_cli(
            "status", "latest", "--runs-dir", runs, cwd=tmp_path, preexec_fn=_held_to_permissions
        )
    finally:
        closed_dir.chmod(0o700)
    assert listing.exit_code == ExitCode.SUCCESS, listing.envelope
    assert [run["run_id"] for run in listing.data["runs"]] == [readable.data["run_id"]]
    (warning,) = listing.envelope["warnings"]
    assert warning["code"] == "RUN_UNREADABLE" and warning["context"]["run_dir"] == str(closed_dir)
    assert status.exit_code == ExitCode.PRECONDITION, status.envelope
    assert status.error_code == "JOURNAL_CORRUPT"
    assert str(closed_dir) in status.envelope["error"]["message"]
    assert "ermission denied" in status.envelope["error"]["message"]
    assert latest.exit_code == ExitCode.PRECONDITION, latest.envelope  # `resume latest` continues none
    assert latest.error_code == "JOURNAL_CORRUPT"
    assert latest.envelope["error"]["context"]["run_dir"] == str(closed_dir)


def test_another_users_finished_run_is_shown_finished_not_live(tmp_path: Path) -> None:
    """A run whose lock this user cannot open (another user's run) counts as held by what acts on
    runs, but `status` of a run that ended for good says `finished`: no process works on it again."""
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        done = run_job(job)
    run_dir = Path(done.data["run_dir"])
    (run_dir / "lock").chmod(0)
    status = run_cli("status", run_dir, cwd=tmp_path, preexec_fn=_held_to_permissions)
    assert status.exit_code == ExitCode.SUCCESS, status.envelope
    assert status.data["state"] == "completed"
    assert (status.data["live"], status.data["liveness"]) == (False, "finished")


def _dropped(*args: str | Path, cwd: Path) -> CliResult:
    return run_cli(*args, cwd=cwd, preexec_fn=_held_to_permissions)


def test_runs_shared_with_another_user_are_never_guessed_at(tmp_path: Path) -> None:
    """A runs directory with another user's things in it: an unreadable directory not named as runs are
    (`lost+found`) is no run; a runs dir or index of invocations this user cannot read is
    RUNS_DIR_UNREADABLE, and nothing is sent; another user's run is RUN_LOCK_NOT_OURS to `retry-failed`,
    never a RUN_LOCKED to wait out; a FIFO where a lock should be does not hang `runs` or `status`."""
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        done = run_job(job)
        runs, run_dir = tmp_path / "runs", Path(done.data["run_dir"])
        (runs / "lost+found").mkdir(mode=0)
        listing = _dropped("runs", "--runs-dir", runs, cwd=tmp_path)
        (runs / ".invocations").chmod(0)
        again = _dropped("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
        (runs / ".invocations").chmod(0o700)
        sent = target.stats()["requests"]
    assert listing.exit_code == ExitCode.SUCCESS and listing.envelope["warnings"] == [], listing.envelope
    assert again.exit_code == ExitCode.PRECONDITION and again.error_code == "RUNS_DIR_UNREADABLE"
    assert sent == 3  # the first run's rows alone
    (run_dir / "lock").chmod(0)
    retried = _dropped("retry-failed", run_dir, "--budget", "0", cwd=tmp_path)
    assert retried.error_code == "RUN_LOCK_NOT_OURS" and retried.envelope["error"]["retryable"] is False
    (run_dir / "lock").unlink()
    os.mkfifo(run_dir / "lock")
    status = _dropped("status", run_dir, cwd=tmp_path)  # run_cli's timeout: a hang would fail here
    assert (status.exit_code, status.data["liveness"]) == (ExitCode.SUCCESS, "finished")
    runs.chmod(0o300)
    unlisted = _dropped("runs", "--runs-dir", runs, cwd=tmp_path)
    runs.chmod(0o700)
    assert unlisted.exit_code == ExitCode.PRECONDITION and unlisted.error_code == "RUNS_DIR_UNREADABLE"
    assert unlisted.envelope["error"]["context"]["path"] == str(runs)


def _given_to_nobody(path: Path) -> None:
    """`path` and all it holds become another user's, readable to everyone (as a user sharing it would)."""
    for item in [path, *path.rglob("*")]:
        os.chown(item, _NOBODY, _NOBODY)
        item.chmod(0o755 if item.is_dir() else 0o644)


@pytest.mark.skipif(os.geteuid() != 0, reason="making files another user's needs root")
def test_a_runs_dir_shared_with_another_user_names_whose_it_is(tmp_path: Path) -> None:
    """Another user's runs in a runs directory both may write (1777): the job's live lock is theirs, so
    this user's `run` of the same job says so (RUNS_DIR_UNWRITABLE naming the lock and its owner, not
    "cannot create a run directory"), and `resume` of their stopped run is RUN_LOCK_NOT_OURS: it is
    theirs to continue. Nothing is sent."""
    with TargetProcess({"rules": [{"after": 2, "status": 401}]}) as target:
        job = write_job(tmp_path, target.url, rows=10, execution={"concurrency": 1})
        halted = run_job(job)
        assert halted.data["state"] == "stopped", halted.envelope
        runs, run_dir = tmp_path / "runs", Path(halted.data["run_dir"])
        runs.chmod(0o1777)
        for path in runs.iterdir():
            _given_to_nobody(path)
        target.reset()
        again = _dropped("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
        resumed = _dropped("resume", run_dir, "--budget", "0", cwd=tmp_path)
        assert target.stats()["requests"] == 0
    assert again.exit_code == ExitCode.PRECONDITION, again.envelope
    assert again.error_code == "RUNS_DIR_UNWRITABLE"
    context = again.envelope["error"]["context"]
    assert context["owner_uid"] == _NOBODY and runs / ".live" in Path(context["path"]).parents
    assert "belongs to uid 65534" in again.envelope["error"]["message"]
    assert resumed.exit_code == ExitCode.CONFLICT, resumed.envelope
    assert resumed.error_code == "RUN_LOCK_NOT_OURS"
    assert resumed.envelope["error"]["context"]["owner_uid"] == _NOBODY
