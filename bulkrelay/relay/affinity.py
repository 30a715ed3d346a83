"""The relay's threads on one CPU (`execution.pin_cpu`, on by default).

A row crosses threads twice: the event loop hands its request to pyreqwest's Tokio thread, and Tokio
needs Python's lock (the GIL) to hand the answer back. On two CPUs every such hand-over wakes the other
core (an inter-processor interrupt, on a virtual machine a trip through the hypervisor) and moves the
objects both threads touch between the cores' caches. The threads take turns with the GIL anyway, so
one core does the same work with less of it: on the 2-core development machine, at a busy hour, a
per-row run took 118-131 µs of CPU a row on two cores and 64-88 on one (1.2-1.7 x the rows a second);
at a quiet hour the two were even (docs/performance.md, "One CPU for the relay").

While relaying, every thread of the process (those started later inherit it) is held to the CPU the
event loop runs on at the start, as the scheduler placed it; after the relay every thread gets its
former set of CPUs back. Where the process may run on one CPU only, or the system refuses (a
container without the right, a platform without `sched_setaffinity`), nothing changes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_TASKS = "/proc/self/task"


@contextmanager
def relay_cpu(pin: bool) -> Iterator[int | None]:
    """While relaying: with `pin`, every thread on the CPU this one runs on (yielded), else untouched
    (None yielded)."""
    cpu = _current_cpu() if pin else None
    before = _masks() if cpu is not None else {}
    own = before.get(threading.get_native_id(), set())
    if cpu is None or len(own) < 2:
        yield None
        return
    try:
        pinned = _set_all({}, {cpu})
        if not pinned:  # refused part way: every thread as it was before the relay starts
            _set_all(before, own)
        yield cpu if pinned else None
    finally:
        _set_all(before, own)  # threads started while relaying get this thread's former set


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
    """Every thread's CPUs: its own from `masks`, else `default`. False when the system refused any
    (the others are set all the same: a restore gives back what it can)."""
    refused = False
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, masks.get(tid, default))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except OSError:
            refused = True
    return not refused
