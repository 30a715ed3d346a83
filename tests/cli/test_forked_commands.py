"""`run_cli` forks its commands from a zygote that imported the CLI once (tests/zygote.py). A forked
command must meet the world `python -m bulkrelay` meets: the same answers, streams, exit codes, working
directory and environment, and the same end when it outlives its timeout."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import clirun
from tests.clirun import cli_env, run_cli, run_cli_raw
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.zygoteclient import Zygote

pytestmark = pytest.mark.slow  # real processes


def _started(*args: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """The command started as the program, for comparison."""
    return subprocess.run(
        [sys.executable, "-m", "bulkrelay", *map(str, args)],
        cwd=cwd,
        env=env,
        input=b"",
        capture_output=True,
        check=False,
    )


def _without_timings(stdout: bytes) -> Any:
    try:
        envelope = orjson.loads(stdout)
    except orjson.JSONDecodeError:
        return stdout  # text: --help, --human
    envelope["meta"].pop("duration_ms", None)
    return envelope


@pytest.mark.parametrize(
    "args",
    [
        ("validate", "job.yaml"),  # a relative path: the working directory is the test's
        ("validate", "missing.yaml"),
        ("render", "job.yaml", "--rows", "1-2"),
        ("run", "job.yaml", "--input", "-", "--budget", "0"),  # stdin: a pipe at its end
        ("job", "list"),  # the state directory, from the environment
        ("--version",),
        ("validate", "--help"),
    ],
    ids=" ".join,
)
def test_a_forked_command_answers_as_the_started_program(tmp_path: Path, args: tuple[str, ...]) -> None:
    write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"), TZ="Pacific/Kiritimati")
    forked = run_cli_raw(*args, cwd=tmp_path, env=env)
    started = _started(*args, cwd=tmp_path, env=env)
    assert (forked.returncode, _without_timings(forked.stdout)) == (
        started.returncode,
        _without_timings(started.stdout),
    )
    assert forked.stderr == started.stderr


def test_a_forked_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"delay_ms": 60_000}]}) as target:
        job = write_job(tmp_path, target.url, rows=2)
        runs = tmp_path / "marker-runs"
        with pytest.raises(subprocess.TimeoutExpired):
            run_cli_raw("run", job, "--budget", "0", "--runs-dir", runs, cwd=tmp_path, timeout=3)
        target.release()
    alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and str(runs).encode() in _cmdline(pid)]
    assert alive == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_commands_start_as_the_program_when_the_zygote_cannot_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = Zygote("cli")
    broken._broken = True
    monkeypatch.setattr(clirun, "_commands", broken)
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=3)
    assert run_cli("validate", job, cwd=tmp_path).exit_code == 0


def test_a_forked_command_has_the_test_process_s_umask(tmp_path: Path) -> None:
    """A stricter umask wins over the private modes (0700): the runs directory a run makes is 0500 under
    umask 0277, the test's, as a started command inherits it, not the zygote's from when it started."""
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=1, execution={"timeout": {"connect_seconds": 1}})
    run_cli_raw("--version")  # the zygote started before the umask changes, as in any longer session
    previous = os.umask(0o277)
    try:
        run_cli_raw("run", job, "--budget", "0", "--runs-dir", tmp_path / "forked", cwd=tmp_path)
        _started("run", job, "--budget", "0", "--runs-dir", tmp_path / "started", cwd=tmp_path, env=cli_env())
    finally:
        os.umask(previous)
    modes = {name: stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("forked", "started")}
    assert modes == {"forked": 0o500, "started": 0o500}
