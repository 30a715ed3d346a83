"""The storage seam's fake: a real `Storage` that records what it is asked and fails where a test tells
it to, as a dying disk would. Failure tests use it instead of each subclassing `Storage` by hand (as
httpx ships `MockTransport` beside its real transports).

    storage = FaultyStorage(only="results.jsonl", fail_fsync_at=3)  # the journal's third fsync: EIO
    run = RunDir.create(runs_dir, plan, storage)
    ... StorageFailed, naming the journal; storage.synced_sizes: its size at each good fsync

A failure is the real one's error (`storage_failed` over an `OSError` EIO whose message says
"injected"), raised before the operation, or, for a write, after half of its bytes landed (a torn
write). Counting and failing apply to the files whose name ends with `only` (every file: None); the
others pass through unrecorded. Nothing here is used by BulkRelay itself.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

from bulkrelay.store.storage import Storage, storage_failed

_INJECTED = "Input/output error (injected)"


class FaultyStorage(Storage):
    """Records `calls` (write, fsync, replace, fsync_dir, in order), the bytes of each write, the file's
    size at each good fsync, the directories fsynced and the threads that wrote; fails the Nth write
    or fsync (from 1), every fsync once `fail_fsync_after_s` seconds have passed since it was made,
    or every rename; makes each fsync take `fsync_delay_s` longer."""

    def __init__(
        self,
        *,
        only: str | None = None,
        fail_write_at: int | None = None,
        fail_fsync_at: int | None = None,
        fail_fsync_after_s: float | None = None,
        fail_replace: bool = False,
        fsync_delay_s: float = 0.0,
    ) -> None:
        super().__init__()
        self._only = only
        self._fail_write_at = fail_write_at
        self._fail_fsync_at = fail_fsync_at
        self._fail_from = None if fail_fsync_after_s is None else time.monotonic() + fail_fsync_after_s
        self._fail_replace = fail_replace
        self._fsync_delay_s = fsync_delay_s
        self.calls: list[str] = []
        self.writes: list[bytes] = []
        self.fsyncs = 0
        self.synced_sizes: list[int] = []
        self.dir_fsyncs: list[Path] = []
        self.threads: set[int] = set()

    def write(self, fd: int, data: bytes) -> None:
        if not self._watched(self.name_of(fd)):
            super().write(fd, data)
            return
        self.calls.append("write")
        self.threads.add(threading.get_ident())
        self.writes.append(data)
        if len(self.writes) == self._fail_write_at:
            super().write(fd, data[: len(data) // 2])  # a short, torn write
            raise _injected("write", self.name_of(fd))
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        name = self.name_of(fd)
        if not self._watched(name):
            super().fsync(fd)
            return
        self.calls.append("fsync")
        self.fsyncs += 1
        if self.fsyncs == self._fail_fsync_at or (
            self._fail_from is not None and time.monotonic() >= self._fail_from
        ):
            raise _injected("fsync", name)
        time.sleep(self._fsync_delay_s)
        super().fsync(fd)
        self.synced_sizes.append(os.fstat(fd).st_size)

    def replace(self, source: Path, target: Path) -> None:
        if not self._watched(str(target)):
            super().replace(source, target)
            return
        self.calls.append("replace")
        if self._fail_replace:
            raise _injected("rename", f"{source} -> {target}")
        super().replace(source, target)

    def fsync_dir(self, path: Path) -> None:
        self.calls.append("fsync_dir")
        self.dir_fsyncs.append(path)
        super().fsync_dir(path)

    def _fsync_fails(self) -> bool:
        late = self._fail_from is not None and time.monotonic() >= self._fail_from
        return late or self.fsyncs == self._fail_fsync_at

    def _watched(self, name: str) -> bool:
        return self._only is None or name.endswith(self._only)


def _injected(operation: str, name: str) -> Exception:
    return storage_failed(operation, name, OSError(errno.EIO, _INJECTED))
