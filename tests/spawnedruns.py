"""A `bulkrelay run` in a process of its own, for tests that act on it while it runs (a signal, a
kill -9, a look at its status): start it, find the run directory it holds, wait for its progress,
and read its envelope once it ends.

    proc = start_run(job)  # runs in `runs/` beside the job file, stdout and stderr captured
    wait_for(lambda: journal_has_lines(job), "the first committed rows")
    proc.send_signal(signal.SIGINT)
    result = finish(proc)

`spawn_run(cwd, job)` starts one in `cwd` (its runs in `.bulkrelay/runs`) with its output discarded,
for a test that kills it; `run_held_by` names the run directory it locked.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import orjson

from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.rundir import is_locked
from tests.clirun import CliResult, start_cli
from tests.waiting import HANG_S


def start_run(job: Path) -> subprocess.Popen[bytes]:
    """`bulkrelay run JOB --budget 0` with its runs in `runs/` beside the job file; read it with `finish`."""
    return start_cli("run", job, "--budget", "0", "--runs-dir", job.parent / "runs", cwd=job.parent)


def run_dir_of(job: Path) -> Path:
    """The one run directory of `start_run(job)`."""
    found = [p for p in (job.parent / "runs").glob("2*") if (p / "run.json").exists()]
    assert len(found) == 1, found
    return found[0]


def journal_has_lines(job: Path) -> bool:
    runs = list((job.parent / "runs").glob("2*/results.jsonl"))
    return bool(runs) and runs[0].stat().st_size > 0


def finish(proc: subprocess.Popen[bytes]) -> CliResult:
    """The envelope of a run started by `start_run`, once it has ended."""
    stdout, stderr = proc.communicate(timeout=HANG_S)
    envelope = orjson.loads(stdout)
    assert envelope["meta"]["exit_code"] == proc.returncode
    return CliResult(proc.returncode, envelope, stderr.decode(errors="replace"), stdout)


def spawn_run(cwd: Path, job: Path) -> subprocess.Popen[bytes]:
    """`bulkrelay run JOB --budget 0` in `cwd`, its output discarded (a test that kills it)."""
    return start_cli("run", job, "--budget", "0", cwd=cwd, output="discarded")


def run_held_by(runs_root: Path, proc: subprocess.Popen[bytes], timeout: float = HANG_S) -> Path:
    """The run directory whose lock `proc` holds, once it has taken it."""
    pid = str(proc.pid).encode()
    deadline = time.monotonic() + timeout
    while True:
        for lock in runs_root.glob("*/lock"):
            try:
                if lock.read_bytes().strip() == pid:
                    return lock.parent
            except FileNotFoundError:
                pass
        assert proc.poll() is None, f"the run ended on its own (exit {proc.returncode}) before the kill"
        assert time.monotonic() < deadline, "the run never took its lock"
        time.sleep(0.005)


def wait_for_frontier_past(run_dir: Path, offset: int, proc: subprocess.Popen[bytes]) -> None:
    """Until the run's checkpoint has moved past `offset` (the frontier of the last kill)."""
    deadline = time.monotonic() + 60
    while True:
        checkpoint = read_checkpoint(run_dir)
        if checkpoint is not None and checkpoint.offset > offset:
            return
        assert proc.poll() is None, f"the run ended on its own (exit {proc.returncode}) before the kill"
        assert time.monotonic() < deadline, "the checkpoint never moved past the last kill's"
        time.sleep(0.005)


def wait_for_lock(run_dir: Path, proc: subprocess.Popen[bytes], timeout: float = HANG_S) -> None:
    """Wait until `proc` holds the run's lock."""
    deadline = time.monotonic() + timeout
    while not (is_locked(run_dir) and (run_dir / "lock").read_bytes().strip() == str(proc.pid).encode()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the resume never took the lock"
        time.sleep(0.01)


def kill_9_loop(cwd: Path, job: Path, kills: int, rng: random.Random) -> None:
    """Start `bulkrelay run JOB` `kills` times, each killed with SIGKILL a moment (0-150 ms, drawn from
    `rng`) after its checkpoint moved past the last one's: each run got somewhere before it died."""
    runs_root = cwd / ".bulkrelay" / "runs"
    frontier = 0
    for kill in range(kills):
        proc = spawn_run(cwd, job)
        run_dir = run_held_by(runs_root, proc)
        wait_for_frontier_past(run_dir, frontier, proc)
        time.sleep(rng.uniform(0.0, 0.15))
        assert proc.poll() is None, f"kill {kill}: the run ended on its own (exit {proc.returncode})"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        checkpoint = read_checkpoint(run_dir)
        frontier = checkpoint.offset if checkpoint is not None else 0


def committed_prefix(run_dir: Path) -> bytes:
    """The journal up to the checkpoint's frontier."""
    checkpoint = read_checkpoint(run_dir)
    if checkpoint is None:
        return b""
    with (run_dir / "results.jsonl").open("rb") as journal:
        return journal.read(checkpoint.offset)
