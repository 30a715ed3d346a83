"""How a run's workers start (ops/workerfork.py): forked from the run's process, which has imported
everything already, whenever that process runs one thread, on a terminal too (the progress bar's
thread starts after them); as new interpreters when it runs more. Either way every row once, and a
forked worker holds nothing of its parent's but its memory: not the run's lock, not its pipes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.rundir import LOCK
from tests.clirun import cli_env
from tests.jobfiles import write_job
from tests.runsteps import assert_each_row_once
from tests.spawnedruns import run_dir_of
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S
from tests.workerprocs import WORKER_MODULE, WORKER_NAME, wait_for_workers, workers_of

# Every request answers 503 until the test lets the target succeed (`_finished`): until then no row
# ends, so the workers are there to look at however slow the machine. A hundred attempts at most 3 s
# apart last about as long as HANG_S, the bound of every wait of the tests.
HELD: dict[str, Any] = {"dedup": True, "rules": [{"status": 503}]}
pytestmark = [pytest.mark.slow, pytest.mark.target_plan(HELD)]

ROWS = 40

# A run whose process runs a second thread when it starts its workers (a library's, an earlier step's).
_WITH_A_THREAD = """\
import sys, threading
threading.Thread(target=threading.Event().wait, daemon=True).start()
from bulkrelay.cli.main import main
sys.exit(main())
"""


def _job(tmp_path: Path, url: str) -> Path:
    return write_job(
        tmp_path,
        url,
        rows=ROWS,
        input={"key": "id"},
        request={"idempotency_key": {"header": "Idempotency-Key"}},
        retry={"max_attempts": 100, "initial_backoff_seconds": 0.05, "max_backoff_seconds": 3},
        execution={"concurrency": 4, "workers": 2},
    )


@contextmanager
def _running(
    job: Path, program: list[str], stderr: int = subprocess.DEVNULL
) -> Iterator[subprocess.Popen[bytes]]:
    """`program run JOB` in a process of its own, its envelope on a pipe; killed (its workers with
    it) if the test ends first, so that a failed test leaves no run retrying behind it."""
    command = [*program, "run", str(job), "--budget", "0", "--runs-dir", str(job.parent / "runs")]
    proc = subprocess.Popen(
        command,
        cwd=job.parent,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _open_files(pid: int) -> dict[int, str]:
    """What `pid`'s descriptors point at, read while it runs."""
    found = {}
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found[int(entry.name)] = os.readlink(entry)
        except OSError:  # closed meanwhile
            continue
    return found


def _finished(proc: subprocess.Popen[bytes], target: TargetProcess) -> None:
    """Once the target answers, `proc` ends with every row journaled once and applied once."""
    target.set_plan({"dedup": True})
    stdout, _ = proc.communicate(timeout=HANG_S)
    envelope = orjson.loads(stdout)
    assert proc.returncode == ExitCode.SUCCESS, envelope
    assert_each_row_once(Path(envelope["data"]["run_dir"]), ROWS)
    stats = target.stats()
    assert (stats["effects"], stats["duplicates"]) == (ROWS, 0)


def test_workers_are_forked_from_the_run_and_hold_none_of_its_files(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = _job(tmp_path, target.url)
    with _running(job, [sys.executable, "-m", "bulkrelay"]) as proc:
        _look_at_forked_workers(job, proc)
        _finished(proc, target)


def _look_at_forked_workers(job: Path, proc: subprocess.Popen[bytes]) -> None:
    workers = wait_for_workers(proc, 2)  # named once their descriptors are theirs (ops/workerfork.py)
    run_dir = run_dir_of(job)
    lock = str(run_dir / LOCK)
    parents = set(_open_files(proc.pid).values())
    # What the parent holds that no one else may: the run's locks (its directory's, its key's in
    # runs/.live), its pipes and sockets (its output, the other workers' sockets). A pipe or socket
    # is one inode, whoever holds it.
    live = str(job.parent / "runs" / ".live")
    held = {path for path in parents if path == lock or path.startswith(("pipe:", "socket:", live))}

    assert lock in held and len(held) > 1 + 2  # the lock, the envelope's pipe, a socket to each worker
    for pid in workers:
        files = _open_files(pid)
        assert _name(pid) == WORKER_NAME and WORKER_MODULE not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert not held & set(files.values()), files  # none of them: no lock kept after a kill -9
        assert files[1] == files[2] and files[1].startswith(str(run_dir / "workers")), files  # its log
        assert files[0] == os.devnull, files  # not the parent's input


def test_a_run_that_runs_other_threads_starts_its_workers_as_interpreters(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = _job(tmp_path, target.url)
    with _running(job, [sys.executable, "-c", _WITH_A_THREAD]) as proc:
        workers = wait_for_workers(proc, 2)

        assert all(WORKER_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in workers)
        _finished(proc, target)


def test_on_a_terminal_the_workers_are_forked_before_the_progress_bar_draws(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = _job(tmp_path, target.url)
    terminal, seat = os.openpty()
    with _running(job, [sys.executable, "-m", "bulkrelay"], stderr=seat) as proc:  # the bar: on a terminal
        os.close(seat)
        drawn = bytearray()
        reader = threading.Thread(target=_drain, args=(terminal, drawn), daemon=True)  # it never blocks
        reader.start()
        workers = wait_for_workers(proc, 2)

        assert all(_name(pid) == WORKER_NAME for pid in workers)
        _finished(proc, target)
    reader.join(HANG_S)
    assert f"{ROWS}/{ROWS}".encode() in drawn  # the bar did draw, to the end


def _drain(terminal: int, into: bytearray) -> None:
    try:
        while chunk := os.read(terminal, 65536):
            into.extend(chunk)
    except OSError:  # EIO: the last process holding the terminal's other side ended
        pass
    finally:
        os.close(terminal)


# The pool of a run that fails after its workers were forked and before it started them (what fails
# there in a run is rare: the relay's CPU claim, the event loop's start), then closed by its owner.
_FORKED_THEN_CLOSED = """\
import sys
from pathlib import Path
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.ops.workers import LocalWorkers
from bulkrelay.relay.engine import StartPoint
from bulkrelay.store.rundir import RunDir
job = Path(sys.argv[1])
preflight = run_preflight(load_job(job), None)
pool = LocalWorkers(preflight, RunDir.create(job.parent / "runs", plan_for(preflight)), StartPoint(), 2)
print("forked", flush=True)
sys.stdin.readline()
pool.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def test_workers_forked_for_a_run_that_never_started_them_end_with_its_pool(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = _job(tmp_path, target.url)
    proc = subprocess.Popen(
        [sys.executable, "-c", _FORKED_THEN_CLOSED, str(job)],
        cwd=tmp_path,
        env=cli_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"forked\n"
        workers = wait_for_workers(proc, 2)
        assert all(_name(pid) == WORKER_NAME for pid in workers)
        proc.stdin.write(b"close\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"closed\n"
        assert workers_of(proc.pid) == []  # killed and reaped, while their parent lives on
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
        assert target.stats()["requests"] == 0  # none of them sent anything
    finally:
        proc.kill()
        proc.communicate()
