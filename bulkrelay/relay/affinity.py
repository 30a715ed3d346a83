"""The relay's threads on one CPU (`execution.pin_cpu`, on by default).

A row crosses threads twice: the event loop hands its request to pyreqwest's Tokio thread, and Tokio
needs Python's lock (the GIL) to hand the answer back. On two CPUs every such hand-over wakes the other
core (an inter-processor interrupt, on a virtual machine a trip through the hypervisor) and moves the
objects both threads touch between the cores' caches. The threads take turns with the GIL anyway, so
one core does the same work with less of it: on the 2-core development machine, at a busy hour, a
per-row run took 118-131 µs of CPU a row on two cores and 64-88 on one (1.2-1.7 x the rows a second);
at a quiet hour the two were even (docs/performance.md, "One CPU for the relay").

While relaying, every thread of the process (those started later inherit it) is held to one CPU that
no other BulkRelay process of the machine holds: the one the event loop runs on at the start, as the
scheduler placed it, unless another relay holds it. Two relays started together (two `--shard` runs)
were often placed on the same CPU and then ran slower than one. A CPU is held by an flock on its file
in a directory of the user's (`BULKRELAY_CPU_DIR`, else /tmp/bulkrelay-cpus-<uid>: the same for a
cron job and a login shell, which XDG_RUNTIME_DIR is not); the system releases it when the process
ends, even by kill -9. When every CPU is held, the relay is not pinned (the scheduler shares them);
where that directory cannot be used, it pins to its CPU unclaimed, as before claims. After the relay
every thread gets its former set of CPUs back.

A thread or a child process that works beside the relay without ever waiting on it or it on them (the
results sink's feeder, which decodes the committed lines and upserts them: store/sinkfeed.py) is
`spared`: held to the process's other CPUs instead, so its work takes nothing from the relay's CPU
(issue 39; pinned with it, the sink cost the relay its CPU time exactly). A spared process keeps its
CPUs after the relay: it ends with the run. Where the process may run on one CPU only, or the
system refuses (a container without the right, a platform without `sched_setaffinity`), nothing
changes.
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

_TASKS = "/proc/self/task"
CLAIMS_DIR_ENV = "BULKRELAY_CPU_DIR"


@contextmanager
def relay_cpu(pin: bool, spared: Collection[int] = ()) -> Iterator[int | None]:
    """While relaying: with `pin`, every thread on one CPU no other relay holds (yielded): the one this
    thread runs on if it is free; else untouched (None yielded). The threads whose native ids are
    `spared`, and the child processes whose ids are, run on the other CPUs this thread may use instead."""
    cpu = _current_cpu() if pin else None
    before = _masks() if cpu is not None else {}
    own = before.get(threading.get_native_id(), set())
    if cpu is None or len(own) < 2:
        yield None
        return
    with claimed_cpu(cpu, own) as claimed:
        if claimed is None:  # every CPU is another relay's: sharing them beats doubling up on one
            yield None
            return
        with _pinned(before, own, claimed, spared) as pinned:
            yield pinned


@contextmanager
def _pinned(
    before: dict[int, set[int]], own: set[int], cpu: int, spared: Collection[int]
) -> Iterator[int | None]:
    try:
        pinned = _set_all(dict.fromkeys(spared, own - {cpu}), {cpu})
        if not pinned:  # refused part way: every thread as it was before the relay starts
            _set_all(before, own)
        yield cpu if pinned else None
    finally:
        _set_all(before, own)  # threads started while relaying get this thread's former set


@contextmanager
def claimed_cpu(start: int, allowed: set[int]) -> Iterator[int | None]:
    """The first CPU of `allowed` (`start` first) that no other process holds, held until the end;
    None when every one is held; `start`, unclaimed, where claims cannot be made."""
    folder = claims_dir()
    if folder is None:
        yield start
        return
    for cpu in sorted(allowed, key=lambda each: (each != start, each)):
        fd = _lock(folder / f"cpu{cpu}")
        if fd is not None:
            try:
                yield cpu
            finally:
                os.close(fd)  # releases the lock (the system does the same when the process dies)
            return
    yield None


def claims_dir() -> Path | None:
    """The machine-wide directory of CPU claims, made if need be; None unless it is this user's own
    directory, writable by no one else (a directory in /tmp may have been made by someone else)."""
    explicit = os.environ.get(CLAIMS_DIR_ENV)
    folder = Path(explicit) if explicit else Path(f"/tmp/bulkrelay-cpus-{os.getuid()}")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = folder.lstat()
    except OSError:
        return None
    ours = stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()
    return folder if ours and not status.st_mode & 0o022 else None


def _lock(path: Path) -> int | None:
    """An open descriptor holding `path`'s exclusive flock, or None when another holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _current_cpu() -> int | None:
    """The CPU this thread runs on (field 39 of its stat), or None where that cannot be read."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        with open("/proc/thread-self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command, which may hold spaces
        return int(fields[36])
    except (OSError, IndexError, ValueError):
        return None


def _threads() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_TASKS)]
    except OSError:
        return []


def _masks() -> dict[int, set[int]]:
    """Each thread's set of CPUs; threads that end meanwhile are left out."""
    masks: dict[int, set[int]] = {}
    for tid in _threads():
        try:
            masks[tid] = os.sched_getaffinity(tid)
        except OSError:
            continue
    return masks


def _set_all(masks: dict[int, set[int]], default: set[int]) -> bool:
    """Every thread's CPUs, and those of the other processes `masks` names: its own from `masks`, else
    `default`. False when the system refused any (the others are set all the same: a restore gives
    back what it can)."""
    refused = False
    for tid in dict.fromkeys([*_threads(), *masks]):
        try:
            os.sched_setaffinity(tid, masks.get(tid, default))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except OSError:
            refused = True
    return not refused


AUTO_WORKERS_MAX = 8  # `execution.workers: auto` takes at most this many
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus() -> int:
    """The CPUs this process may use (`execution.workers: auto`): its affinity set, fewer when the
    cgroup's quota (`cpu.max`, cgroup v2: a container's CPU limit) allows less, at most
    AUTO_WORKERS_MAX, at least one."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # a platform without affinity
        allowed = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        allowed = min(allowed, quota)
    return max(1, min(allowed, AUTO_WORKERS_MAX))


def _cgroup_cpus() -> int | None:
    """Whole CPUs the cgroup's quota grants (a fraction rounds up: 1.5 CPUs is 2 processes); None
    without a quota, or where it cannot be read."""
    try:
        quota, period = _CGROUP_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, -(-int(quota) // int(period)))
    except (ValueError, ZeroDivisionError):
        return None
