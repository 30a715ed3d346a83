"""The worker processes of a run started with `execution.workers` (ops/workers.py), found by their
parent's pid in /proc, for tests that signal or kill them."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bulkrelay.ops import workerfork
from tests.waiting import HANG_S

WORKER_MODULE = b"bulkrelay.ops.relayworker"  # a worker started as an interpreter
WORKER_NAME = workerfork.WORKER_NAME.decode()  # a worker forked from its parent


def workers_of(parent: int) -> list[int]:
    """The pids of `parent`'s worker processes alive now (its children running the worker module)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        name, after = stat.split("(", 1)[1].rsplit(")", 1)
        ppid = int(after.split()[1])
        worker = WORKER_MODULE in cmdline or name == WORKER_NAME
        if ppid == parent and worker and not _zombie(stat):
            found.append(int(entry.name))
    return sorted(found)


def wait_for_workers(proc: subprocess.Popen[bytes], count: int) -> list[int]:
    """Once `proc` runs `count` workers, their pids."""
    deadline = time.monotonic() + HANG_S
    while True:
        pids = workers_of(proc.pid)
        if len(pids) == count:
            return pids
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before its {count} workers ran"
        assert time.monotonic() < deadline, f"{len(pids)} of {count} workers after {HANG_S} s"
        time.sleep(0.01)


def wait_until_gone(pids: list[int]) -> None:
    """Until none of `pids` is alive (a zombie is gone: it sends nothing)."""
    deadline = time.monotonic() + HANG_S
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still alive after {HANG_S} s: {[p for p in pids if _alive(p)]}"
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        return not _zombie(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return False


def _zombie(stat: str) -> bool:
    return stat.rsplit(")", 1)[1].split(maxsplit=1)[0] in {"Z", "X"}


def kill_9(pid: int) -> None:
    os.kill(pid, 9)
