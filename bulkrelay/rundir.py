"""The run directory: its manifest (`run.json`), its lock, and the run's state machine.

.bulkrelay/runs/<run-id>/
├── run.json          manifest: ids, state, fingerprints, paths, parent run
├── checkpoint.json   counters and the committed journal frontier
├── results.jsonl     the journal: one final result per row
├── summary.json      counts, latency percentiles, rate
└── lock              held (flock) by the process that owns the run
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bulkrelay import __version__
from bulkrelay.atomic import read_json, write_json_atomic
from bulkrelay.errors import NotFound, RunLocked, RunLockNotOurs, RunsDirUnwritable
from bulkrelay.storage import Storage

MANIFEST = "run.json"
CHECKPOINT = "checkpoint.json"
JOURNAL = "results.jsonl"
SUMMARY = "summary.json"
LOCK = "lock"

RUNNING = "running"
STOPPED = "stopped"
FORCED = "forced"
COMPLETED = "completed"
COMPLETED_WITH_FAILURES = "completed_with_failures"
CANCELLED = "cancelled"
STATES = (RUNNING, STOPPED, FORCED, COMPLETED, COMPLETED_WITH_FAILURES, CANCELLED)
FINAL_STATES = frozenset({COMPLETED, COMPLETED_WITH_FAILURES, CANCELLED})


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_runs_dir(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit.resolve()
    env = os.environ.get("BULKRELAY_RUNS_DIR")
    return (Path(env) if env else Path(".bulkrelay") / "runs").resolve()


def new_run_id() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(4)}"


@dataclass
class RunDir:
    """A run directory on disk and its manifest as last read or written."""

    path: Path
    manifest: dict[str, Any]
    storage: Storage

    @property
    def run_id(self) -> str:
        return str(self.manifest["run_id"])

    @property
    def state(self) -> str:
        return str(self.manifest["state"])

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL

    @classmethod
    def create(cls, runs_dir: Path, manifest: dict[str, Any], storage: Storage | None = None) -> RunDir:
        """Make a new run directory with its manifest in state `running`."""
        storage = storage or Storage()
        run_id = new_run_id()
        path = runs_dir / run_id
        try:
            path.mkdir(parents=True, exist_ok=False)
        except OSError as exc:
            raise _runs_dir_unwritable(runs_dir, exc) from None
        storage.fsync_dir(runs_dir)
        now = utc_now()
        full = {
            "version": 1,
            "run_id": run_id,
            "state": RUNNING,
            "created_at": now,
            "updated_at": now,
            "tool_version": __version__,
            **manifest,
        }
        run = cls(path=path, manifest=full, storage=storage)
        run.save()
        return run

    @classmethod
    def open(cls, path: Path, storage: Storage | None = None) -> RunDir:
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise NotFound(f"no run directory at {path} (missing {MANIFEST})", context={"run_dir": str(path)})
        return cls(path=path, manifest=read_json(manifest_path), storage=storage or Storage())

    def save(self) -> None:
        self.manifest["updated_at"] = utc_now()
        write_json_atomic(self.path / MANIFEST, self.manifest, self.storage)

    def set_state(self, state: str, **extra: Any) -> None:
        assert state in STATES, state
        self.manifest["state"] = state
        self.manifest.update(extra)
        self.save()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run's lock for the duration; the OS releases it if the process dies."""
        try:
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError as exc:
            raise self._lock_not_ours(exc) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunLocked(
                    f"run {self.run_id} is held by another process",
                    context={"run_dir": str(self.path)},
                    suggestion="wait for the other process, or check `bulkrelay status` on this run",
                ) from None
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _lock_not_ours(self, exc: OSError) -> RunLockNotOurs:
        lock = self.path / LOCK
        try:
            owner: int | None = lock.stat().st_uid
        except OSError:
            owner = None
        return RunLockNotOurs(
            f"run {self.run_id}: cannot open its lock {lock}: {exc.strerror}; the run belongs to uid {owner}",
            context={"run_dir": str(self.path), "lock": str(lock), "owner_uid": owner, "uid": os.geteuid()},
            suggestion="continue the run as the user who owns it",
        )


def _runs_dir_unwritable(runs_dir: Path, exc: OSError) -> RunsDirUnwritable:
    return RunsDirUnwritable(
        f"cannot create a run directory under {runs_dir}: {exc.strerror or exc}",
        context={"runs_dir": str(runs_dir), "errno": exc.errno, "os_error": exc.strerror},
        suggestion="use a writable directory: --runs-dir DIR or BULKRELAY_RUNS_DIR",
    )


def is_locked(path: Path) -> bool:
    """Whether some process holds the run's lock right now (read-only probe)."""
    return lock_is_held(path / LOCK)


def lock_is_held(lock_file: Path) -> bool:
    """Whether some process holds an flock on `lock_file` (probed without keeping it)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except PermissionError:  # another user's lock: we cannot tell, so assume its owner holds it
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def list_runs(runs_dir: Path) -> list[RunDir]:
    """Every run under `runs_dir`, newest first; directories without a manifest are skipped."""
    if not runs_dir.is_dir():
        return []
    runs = []
    for child in sorted(runs_dir.iterdir(), reverse=True):
        if (child / MANIFEST).is_file():
            runs.append(RunDir.open(child))
    return runs
