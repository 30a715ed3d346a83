"""Run data is private and fails closed (docs/running.md, "Files and permissions"), with real processes:
run and job directories are 0700 and their files 0600 whatever the umask loosens; a run directory
whose files are links is refused without touching what the links point to; nothing read from stdin
outlives the command that read it unless a run or job owns it, and messages call it `<stdin>`."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode, RunDirUnsafe
from bulkrelay.private import make_private_dir, open_private
from bulkrelay.store.atomic import read_json
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.storage import Storage
from tests.clirun import CliResult, cli_env, run_cli
from tests.jobfiles import write_job
from tests.runplans import run_plan
from tests.runsteps import resume, run_job
from tests.targetproc import TargetProcess

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = [pytest.mark.slow, pytest.mark.target_plan({"rules": [{"after": 10, "status": 401}]})]

RECORDS = b"id,email,name\n1,a@example.com,A\n2,b@example.com,B\n"
BAD_RECORDS = b"id,email,name\n1,a@example.com,A\n2,b@example.com\n"  # row 2 lacks a field


def _halted_run(tmp_path: Path, target: TargetProcess) -> tuple[Path, Path]:
    """A job and its stopped run; the target is healthy again, so following a link would go on writing."""
    job = write_job(tmp_path, target.url, rows=50, execution={"concurrency": 2})
    halted = run_job(tmp_path, job)
    assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
    assert halted.data["state"] == "stopped"
    target.set_plan({})
    return job, Path(halted.data["run_dir"])


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The umask of this process, inherited by every command (and background worker) it starts."""
    previous = os.umask(request.param)
    yield int(request.param)
    os.umask(previous)


def _loose_modes(root: Path) -> dict[str, str]:
    """Every directory under `root` (itself included) that is not 0700 and every file that is not 0600."""
    loose: dict[str, str] = {}
    for path in [root, *root.rglob("*")]:
        info = path.lstat()
        wanted = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
        if stat.S_IMODE(info.st_mode) != wanted:
            loose[str(path.relative_to(root.parent))] = oct(stat.S_IMODE(info.st_mode))
    return loose


def _run_in_background(tmp_path: Path, job: Path, records: bytes) -> CliResult:
    """`run --input -` as a background job, and the job's own final answer however long it takes."""
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    result = run_cli("run", job, "--input", "-", "--budget", "1s", cwd=tmp_path, env=env, stdin=records)
    if result.exit_code == ExitCode.INCOMPLETE:  # a busy machine: wait for the job, not for a clock
        result = run_cli("job", "wait", result.data["job_id"], "--budget", "10m", cwd=tmp_path, env=env)
    return result


def _spools(*folders: Path) -> list[Path]:
    return [path for folder in folders if folder.is_dir() for path in folder.iterdir()]


# ---------------------------------------------------------------- modes


def test_a_run_leaves_only_private_directories_and_files(tmp_path: Path, umask: int) -> None:
    with TargetProcess() as server:
        job = write_job(tmp_path, server.url, rows=1)
        result = run_cli("run", job, "--input", "-", "--budget", "0", cwd=tmp_path, stdin=RECORDS)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    run_dir = Path(result.data["run_dir"])
    assert {p.name for p in run_dir.iterdir()} >= {"run.json", "results.jsonl", "lock", "input.csv"}
    assert _loose_modes(tmp_path / ".bulkrelay") == {}


def test_a_background_job_leaves_only_private_directories_and_files(tmp_path: Path, umask: int) -> None:
    with TargetProcess() as server:
        job = write_job(tmp_path, server.url, rows=1)
        result = _run_in_background(tmp_path, job, RECORDS)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    (job_dir,) = (tmp_path / "state" / "jobs").glob("run-*")
    assert {p.name for p in job_dir.iterdir()} >= {"spec.json", "status.json", "result.json", "log", "stdin"}
    assert _loose_modes(tmp_path / "state") == {}
    assert _loose_modes(tmp_path / ".bulkrelay") == {}


def test_a_runs_directory_the_user_made_keeps_its_mode(tmp_path: Path) -> None:
    runs_dir = tmp_path / "shared-runs"
    runs_dir.mkdir()
    runs_dir.chmod(0o755)
    with TargetProcess() as server:
        job = write_job(tmp_path, server.url, rows=2)
        result = run_job(tmp_path, job, "--runs-dir", str(runs_dir))
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert stat.S_IMODE(runs_dir.stat().st_mode) == 0o755
    assert _loose_modes(Path(result.data["run_dir"])) == {}


def test_a_stricter_umask_wins_over_the_private_modes(tmp_path: Path) -> None:
    previous = os.umask(0o277)
    try:
        make_private_dir(tmp_path / "strict")
        fd = open_private(tmp_path / "strict.bin", os.O_WRONLY | os.O_CREAT)
        os.close(fd)
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "strict").stat().st_mode) == 0o500  # never widened to 0700
    assert stat.S_IMODE((tmp_path / "strict.bin").stat().st_mode) == 0o400  # never widened to 0600


def test_make_private_dir_makes_each_missing_level_private_and_leaves_the_rest(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.mkdir()
    users.chmod(0o755)
    previous = os.umask(0o022)
    try:
        make_private_dir(users / "a" / "b")
        make_private_dir(users / "a" / "b")  # already there: nothing to do
    finally:
        os.umask(previous)
    assert stat.S_IMODE(users.stat().st_mode) == 0o755
    assert _loose_modes(users / "a") == {}


# ---------------------------------------------------------------- links in a run directory


def test_the_storage_seam_never_opens_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "results.jsonl"
    link.symlink_to(victim)
    with pytest.raises(RunDirUnsafe, match=r"results\.jsonl .* is a symbolic link") as refused:
        Storage().open_append(link)
    assert refused.value.context["file"] == str(link)
    with pytest.raises(RunDirUnsafe):
        read_json(link)
    assert victim.read_bytes() == b"precious"


def test_a_lock_linked_after_the_run_was_opened_is_refused(tmp_path: Path) -> None:
    """The check at open is not the only guard: the lock itself is opened without following links."""
    run = RunDir.create(tmp_path / "runs", run_plan(name="x"))
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (run.path / "lock").symlink_to(victim)
    with pytest.raises(RunDirUnsafe, match="lock"), run.locked():
        pass
    assert victim.read_bytes() == b"precious"


def _link_to_victim(run_dir: Path, name: str, victim: Path) -> bytes:
    """Replace the run's file `name` by a link to `victim`, which holds the file's own bytes."""
    original = run_dir / name
    victim.write_bytes(original.read_bytes())
    original.unlink()
    original.symlink_to(victim)
    return victim.read_bytes()


def _assert_refused(result: CliResult, name: str) -> None:
    assert result.exit_code == ExitCode.PRECONDITION, result.envelope
    assert result.error_code == "RUN_DIR_UNSAFE"
    assert name in result.envelope["error"]["message"]
    assert result.envelope["error"]["context"]["file"].endswith(name)


@pytest.mark.parametrize("name", ["lock", "results.jsonl", "checkpoint.json", "run.json"])
def test_resume_refuses_a_linked_run_file_and_leaves_its_target_alone(
    tmp_path: Path, target: TargetProcess, name: str
) -> None:
    _, run_dir = _halted_run(tmp_path, target)
    victim = tmp_path / "victim"
    before = _link_to_victim(run_dir, name, victim)
    _assert_refused(resume(tmp_path, run_dir), name)
    assert victim.read_bytes() == before
    assert (run_dir / name).is_symlink()


def test_a_linked_journal_without_a_checkpoint_is_not_overwritten(
    tmp_path: Path, target: TargetProcess
) -> None:
    _, run_dir = _halted_run(tmp_path, target)
    (run_dir / "checkpoint.json").unlink()
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"someone else's data\nnot a journal\n")
    (run_dir / "results.jsonl").unlink()
    (run_dir / "results.jsonl").symlink_to(victim)
    _assert_refused(resume(tmp_path, run_dir), "results.jsonl")
    assert victim.read_bytes() == b"someone else's data\nnot a journal\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("precious")) == ["precious.txt"]


def test_the_identical_rerun_refuses_a_run_with_a_linked_journal(
    tmp_path: Path, target: TargetProcess
) -> None:
    job, run_dir = _halted_run(tmp_path, target)
    before = _link_to_victim(run_dir, "results.jsonl", tmp_path / "victim")
    _assert_refused(run_job(tmp_path, job), "results.jsonl")
    assert (tmp_path / "victim").read_bytes() == before


# ---------------------------------------------------------------- stdin spools


def _stdin_job(tmp_path: Path) -> Path:
    return write_job(tmp_path, "http://127.0.0.1:9", rows=1)


def _assert_names_stdin(result: CliResult) -> None:
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    assert result.error_code == "INPUT_INVALID"
    assert result.envelope["error"]["message"].startswith("<stdin>:3"), result.envelope["error"]
    assert result.envelope["error"]["context"]["problems"][0]["file"] == "<stdin>"
    assert b".spool" not in result.stdout and b"stdin-" not in result.stdout


@pytest.mark.parametrize("command", [("validate",), ("render", "--rows", "1-2")])
def test_validate_and_render_from_stdin_leave_no_spool(tmp_path: Path, command: tuple[str, ...]) -> None:
    job = _stdin_job(tmp_path)
    spool_dir = tmp_path / ".bulkrelay" / "runs" / ".spool"
    good = run_cli(command[0], job, *command[1:], "--input", "-", cwd=tmp_path, stdin=RECORDS)
    assert good.exit_code == ExitCode.SUCCESS, good.envelope
    assert b".spool" not in good.stdout
    bad = run_cli(command[0], job, *command[1:], "--input", "-", cwd=tmp_path, stdin=BAD_RECORDS)
    _assert_names_stdin(bad)
    assert _spools(spool_dir) == []


def test_validate_from_stdin_names_it_in_its_data(tmp_path: Path) -> None:
    result = run_cli("validate", _stdin_job(tmp_path), "--input", "-", cwd=tmp_path, stdin=RECORDS)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert result.data["input"]["path"] == "<stdin>"


def test_a_run_from_stdin_that_fails_preflight_leaves_no_spool(tmp_path: Path) -> None:
    job = _stdin_job(tmp_path)
    result = run_cli("run", job, "--input", "-", "--budget", "0", cwd=tmp_path, stdin=BAD_RECORDS)
    _assert_names_stdin(result)
    assert _spools(tmp_path / ".bulkrelay" / "runs" / ".spool") == []
    assert not any((tmp_path / ".bulkrelay" / "runs").glob("2*"))  # no run was created either


def test_a_background_run_from_stdin_that_fails_preflight_leaves_only_its_jobs_copy(tmp_path: Path) -> None:
    job = _stdin_job(tmp_path)
    result = _run_in_background(tmp_path, job, BAD_RECORDS)
    _assert_names_stdin(result)
    jobs = tmp_path / "state" / "jobs"
    assert _spools(tmp_path / ".bulkrelay" / "runs" / ".spool", jobs / ".spool") == []
    (job_dir,) = jobs.glob("run-*")
    assert (job_dir / "stdin").read_bytes() == BAD_RECORDS  # owned by the job, removed with it


def test_a_directory_that_is_no_run_is_not_found_whatever_links_it_holds(tmp_path: Path) -> None:
    """`bulkrelay status ~` names no run: it must not advise replacing the links of a home directory."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").symlink_to(tmp_path / "dotfiles-bashrc")
    for command in ("status", "resume", "export"):
        result = run_cli(command, home, cwd=tmp_path)
        assert result.exit_code == ExitCode.NOT_FOUND, (command, result.envelope)
        assert "missing run.json" in result.envelope["error"]["message"]
