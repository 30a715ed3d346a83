"""The CLI of background jobs with a state directory of the test's own (`<tmp_path>/state`), so a test
can count and read the job directories its calls made.

    status = cli(tmp_path, "job", "status", job_id)
    os.kill(worker_pid(tmp_path, job_id), signal.SIGKILL)
"""

from __future__ import annotations

from pathlib import Path

from tests.clirun import CliResult, cli_env, run_cli


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"), **extra)


def cli(tmp_path: Path, *args: str | Path, **extra_env: str) -> CliResult:
    return run_cli(*args, cwd=tmp_path, env=env(tmp_path, **extra_env))


def worker_pid(tmp_path: Path, job_id: str) -> int:
    """The pid of the job's worker, from the lock it holds."""
    return int((tmp_path / "state" / "jobs" / job_id / "lock").read_text())
