"""The results sink's feeder processes (store/sinkfeed.py): those a process started, found by their
command line, and whether one has ended."""

from __future__ import annotations

import os
from pathlib import Path

_FEEDER = b"bulkrelay.store.sinkfeed"


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command (state first), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def feeders_of(parent: int) -> list[int]:
    """The ids of the live feeder processes whose parent is `parent`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat(int(name))
        if fields is None or int(fields[1]) != parent or fields[0] == b"Z":
            continue
        try:
            if _FEEDER in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            continue
    return found


def ended(pid: int) -> bool:
    """Whether the process has ended (a zombie nobody reaped yet counts)."""
    fields = _stat(pid)
    return fields is None or fields[0] == b"Z"
