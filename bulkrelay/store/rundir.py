"""The run directory: its manifest (`run.json`), its lock, and the run's state machine.

.bulkrelay/runs/<run-id>/
├── run.json          manifest: ids, state, fingerprints, paths, parent run
├── checkpoint.json   counters and the committed journal frontier
├── results.jsonl     the journal: one final result per row
├── summary.json      counts, latency percentiles, rate
└── lock              held (flock) by the process that owns the run
"""

from __future__ import annotations

import enum
import fcntl
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bulkrelay._version import __version__
from bulkrelay.errors import (
    JournalCorrupt,
    NotFound,
    RunLocked,
    RunLockNotOurs,
    RunNotResumable,
    RunsDirUnwritable,
)
from bulkrelay.private import PRIVATE_DIR_MODE, make_private_dir, open_private, refuse_links
from bulkrelay.store.atomic import read_json, write_json_atomic
from bulkrelay.store.storage import Storage

MANIFEST = "run.json"
CHECKPOINT = "checkpoint.json"
JOURNAL = "results.jsonl"
SUMMARY = "summary.json"
LOCK = "lock"


class RunState(enum.StrEnum):
    """The state a run's manifest records. The values are on disk (run.json) and in envelopes and
    the metrics file: never change one. `running` is neither final nor resumable by its name alone:
    it is a live run, or a crashed one, which only the lock tells (`is_locked`)."""

    RUNNING = "running"
    STOPPED = "stopped"  # stopped at a safe point
    FORCED = "forced"  # stopped with rows in flight cancelled
    COMPLETED = "completed"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    CANCELLED = "cancelled"  # by `job cancel`

    @property
    def final(self) -> bool:
        """Nothing more happens to the run: it cannot be resumed, only retried or run afresh."""
        return self in _FINAL

    @property
    def resumable(self) -> bool:
        """Stopped before its end, on purpose: `resume` continues it."""
        return self in _STOPPED_EARLY

    @property
    def every_row_ended(self) -> bool:
        """Every row has a final result (some may have failed)."""
        return self in _EVERY_ROW_ENDED


_FINAL = frozenset({RunState.COMPLETED, RunState.COMPLETED_WITH_FAILURES, RunState.CANCELLED})
_STOPPED_EARLY = frozenset({RunState.STOPPED, RunState.FORCED})
_EVERY_ROW_ENDED = frozenset({RunState.COMPLETED, RunState.COMPLETED_WITH_FAILURES})
_STATE_VALUES = frozenset(state.value for state in RunState)

ALPHA = "alpha"  # the format (and listed state) of a run directory the public alpha made


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
    def state(self) -> RunState:
        return RunState(self.manifest["state"])

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL

    @classmethod
    def create(
        cls,
        runs_dir: Path,
        manifest: dict[str, Any],
        storage: Storage | None = None,
        *,
        staging: Path | None = None,
        before_publish: Callable[[RunDir, Path], None] | None = None,
    ) -> RunDir:
        """Make a new run directory with its manifest in state `running`, all or nothing.

        The run is built under a temporary name (in `staging`, else hidden in `runs_dir`), then
        `before_publish(run, final_path)` completes it there (the invocation index is written last),
        and only then is it renamed into place: a crash at any point leaves the whole run or none."""
        storage = storage or Storage()
        run_id = new_run_id()
        building = (staging / f"new-{run_id}") if staging is not None else runs_dir / f".new-{run_id}"
        try:
            make_private_dir(runs_dir)
            building.mkdir(mode=PRIVATE_DIR_MODE)
        except OSError as exc:
            raise runs_dir_unwritable(runs_dir, exc) from None
        now = utc_now()
        full = {
            "version": 1,
            "run_id": run_id,
            "state": RunState.RUNNING,
            "created_at": now,
            "updated_at": now,
            "tool_version": __version__,
            **manifest,
        }
        run = cls(path=building, manifest=full, storage=storage)
        # The journal exists as long as the run does (made before run.json), so a resume can tell a
        # journal deleted later from one never written to.
        storage.close(storage.open_new(run.journal_path))
        run.save()
        final = runs_dir / run_id
        if before_publish is not None:
            before_publish(run, final)
        storage.replace(building, final)
        if building.parent != runs_dir:
            storage.fsync_dir(building.parent)
        storage.fsync_dir(runs_dir)
        run.path = final
        return run

    @property
    def format(self) -> str:
        return ALPHA if is_alpha_manifest(self.manifest) else "v1"

    @classmethod
    def open(cls, path: Path, storage: Storage | None = None, *, alpha_ok: bool = False) -> RunDir:
        """The run at `path`; an alpha run only when `alpha_ok` (listing), else `RunNotResumable`."""
        manifest_path = path / MANIFEST
        refuse_links(path)  # before anything is read from it: a link could point anywhere
        if not manifest_path.is_file():
            raise NotFound(f"no run directory at {path} (missing {MANIFEST})", context={"run_dir": str(path)})
        manifest = read_json(manifest_path)
        if is_alpha_manifest(manifest):
            if not alpha_ok:
                raise alpha_run_refused(path, manifest)
        elif str(manifest.get("state")) not in _STATE_VALUES:  # a damaged or hand-edited run.json
            raise JournalCorrupt(
                f"{manifest_path}: its state {manifest.get('state')!r} is none of {', '.join(RunState)}",
                context={"path": str(manifest_path), "field": "state", "state": manifest.get("state")},
            )
        return cls(path=path, manifest=manifest, storage=storage or Storage())

    def save(self) -> None:
        self.manifest["updated_at"] = utc_now()
        write_json_atomic(self.path / MANIFEST, self.manifest, self.storage)

    def set_state(self, state: RunState, **extra: Any) -> None:
        self.manifest["state"] = RunState(state)
        self.manifest.update(extra)
        self.save()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run's lock for the duration; the OS releases it if the process dies."""
        try:
            fd = open_private(self.path / LOCK, os.O_RDWR | os.O_CREAT)
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


def runs_dir_unwritable(runs_dir: Path, exc: OSError) -> RunsDirUnwritable:
    return RunsDirUnwritable(
        f"cannot create a run directory under {runs_dir}: {exc.strerror or exc}",
        context={"runs_dir": str(runs_dir), "errno": exc.errno, "os_error": exc.strerror},
        suggestion="use a writable directory: --runs-dir DIR or BULKRELAY_RUNS_DIR",
    )


def is_alpha_manifest(manifest: dict[str, Any]) -> bool:
    """The public alpha's `run.json`: a `schema_version` and flat `input_*` fields, no `input` block."""
    return (
        "schema_version" in manifest
        and "version" not in manifest
        and not isinstance(manifest.get("input"), dict)
    )


def alpha_run_refused(path: Path, manifest: dict[str, Any]) -> RunNotResumable:
    """Why a run of the public alpha cannot be resumed, retried, exported or shown, and what to do."""
    config = manifest.get("config_path") or "JOB"
    return RunNotResumable(
        f"{path} is a run directory of the public alpha (state {manifest.get('state')!r}); "
        "this BulkRelay cannot resume, retry, export or show it: its journal has no checksums and "
        "its manifest no fingerprints this version can verify",
        context={"run_dir": str(path), "format": ALPHA, "alpha_state": manifest.get("state")},
        suggestion=(
            "finish it with the alpha (its `bulkrelay resume` of this directory), or start over with "
            f"this version: `bulkrelay run {config}` (rows the alpha already sent are sent again, "
            "unless the target deduplicates them)"
        ),
    )


def is_locked(path: Path) -> bool:
    """Whether some process holds the run's lock right now (read-only probe)."""
    return lock_is_held(path / LOCK)


def lock_is_held(lock_file: Path) -> bool:
    """Whether some process holds an flock on `lock_file` (probed without keeping it)."""
    try:
        fd = open_private(lock_file, os.O_RDONLY)
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


def run_dirs(runs_dir: Path) -> list[Path]:
    """Every directory under `runs_dir` that holds a manifest, newest first; nothing is read yet."""
    if not runs_dir.is_dir():
        return []
    return [
        child
        for child in sorted(runs_dir.iterdir(), reverse=True)
        if not child.name.startswith(".") and (child / MANIFEST).is_file()  # hidden: being created
    ]


def list_runs(runs_dir: Path) -> list[RunDir]:
    """Every run under `runs_dir`, newest first, the public alpha's included (see `RunDir.format`);
    directories without a manifest, and hidden ones (being created), are skipped."""
    return [RunDir.open(child, alpha_ok=True) for child in run_dirs(runs_dir)]
