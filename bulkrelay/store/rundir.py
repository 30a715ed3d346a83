"""The run directory: its manifest (`run.json`), its lock, and the run's state machine.

.bulkrelay/runs/<run-id>/
├── run.json          manifest: ids, state, fingerprints, paths, parent run
├── checkpoint.json   counters and the committed journal frontier (until the run completes or is cancelled)
├── results.jsonl     the journal: one final result per row
├── summary.json      counts, latency percentiles, rate
└── lock              held (flock) by the process that owns the run
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shlex
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from bulkrelay._version import __version__
from bulkrelay.errors import (
    NotFound,
    RunLocked,
    RunLockNotOurs,
    RunNotResumable,
    RunsDirUnwritable,
)
from bulkrelay.private import PRIVATE_DIR_MODE, make_private_dir, open_private, refuse_links
from bulkrelay.store.atomic import read_json, write_json_atomic
from bulkrelay.store.checkpoint import remove_checkpoint
from bulkrelay.store.manifest import AlphaManifest, RunManifest, RunPlan
from bulkrelay.store.manifest import RunState as RunState  # noqa: PLC0414 - re-exported: its home was here
from bulkrelay.store.storage import Storage

MANIFEST = "run.json"
CHECKPOINT = "checkpoint.json"
JOURNAL = "results.jsonl"
SUMMARY = "summary.json"
RUN_LOG = "run.log"  # written by ops/runlog.py, read by the reports
LOCK = "lock"


ALPHA = "alpha"  # the format (and listed state) of a run directory the public alpha made


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch(ts: object) -> float | None:
    """A run-log or manifest timestamp (`utc_now`: `2026-12-01T02:30:00.123456Z`) in epoch seconds."""
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# A run id: when the run was made (UTC, to the second), then 8 hex digits (`new_run_id`); the alpha's too.
_RUN_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")


def is_run_id(name: str) -> bool:
    return _RUN_ID.fullmatch(name) is not None


def new_run_id() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(4)}"


@dataclass
class RunDir:
    """A run directory on disk and its manifest as last read or written."""

    path: Path
    manifest: RunManifest
    storage: Storage

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    @property
    def state(self) -> RunState:
        return self.manifest.state

    @property
    def plan(self) -> RunPlan:
        """What the run was made to do: its job, input, fingerprints, parent, shard, sync."""
        return self.manifest.plan

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL

    format = "v1"  # the run directory format, as `runs` lists it (an alpha run is an `AlphaRun`)

    @classmethod
    def create(
        cls,
        runs_dir: Path,
        plan: RunPlan,
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
        manifest = RunManifest(run_id, RunState.RUNNING, now, now, __version__, plan)
        run = cls(path=building, manifest=manifest, storage=storage)
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

    @classmethod
    def open(cls, path: Path, storage: Storage | None = None) -> RunDir:
        """The run at `path`; an alpha run is `RunNotResumable`, a damaged manifest `JournalCorrupt`."""
        run = open_listed(path, storage)
        if isinstance(run, AlphaRun):
            raise alpha_run_refused(run)
        return run

    def save(self, manifest: RunManifest | None = None) -> None:
        """Write `manifest` (else the current one) as the run's, stamped with the time of writing."""
        self.manifest = replace(manifest or self.manifest, updated_at=utc_now())
        write_json_atomic(self.path / MANIFEST, self.manifest.to_json(), self.storage)

    def mark_running(self, pid: int) -> None:
        self.save(self.manifest.running(pid))

    def mark_ended(self, state: RunState, stop_reason: str | None) -> None:
        """Record how the run ended; a final one (completed, cancelled) then drops its checkpoint,
        after its state is on disk, so a crash between the two leaves a final run with a checkpoint
        (which no reader needs), never an unfinished run without one."""
        self.save(self.manifest.ended(state, stop_reason))
        if state.final:
            remove_checkpoint(self.path, self.storage)

    def remove(self) -> None:
        """Delete the run directory, its run.json last: a removal stopped midway (a file that cannot be
        unlinked) leaves a run that is still listed, and that the next `prune` removes, never a
        directory without its run.json that no command sees. Raises the OSError that stopped it."""
        for child in self.path.iterdir():
            if child.name in (MANIFEST, LOCK):
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        (self.path / MANIFEST).unlink()
        shutil.rmtree(self.path)  # the lock, which the remover holds, and the directory

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run's lock for the duration; the OS releases it if the process dies."""
        fd = self._open_lock()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunLocked(
                    f"run {self.run_id} is held by another process: {self.path}",
                    context={"run_dir": str(self.path)},
                    suggestion="wait for the other process, or see "
                    f"`bulkrelay status {shlex.quote(str(self.path))}`",
                ) from None
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def refuse_if_not_ours(self) -> None:
        """RUN_LOCK_NOT_OURS, before any work, when this user could not take the run's lock: the run
        is another user's to continue (whose runs directory this may be, a 1777 one)."""
        os.close(self._open_lock())

    def _open_lock(self) -> int:
        """The run's lock, opened to take it; RUN_LOCK_NOT_OURS when this user may not open it."""
        try:
            return open_private(self.path / LOCK, os.O_RDWR | os.O_CREAT)
        except PermissionError as exc:
            raise self.lock_not_ours(exc.strerror or str(exc)) from None

    def lock_not_ours(self, reason: str) -> RunLockNotOurs:
        """The run's lock cannot be opened by this user (`reason`): the run is another user's."""
        lock = self.path / LOCK
        try:
            owner: int | None = lock.stat().st_uid
        except OSError:
            owner = None
        return RunLockNotOurs(
            f"run {self.run_id}: cannot open its lock {lock}: {reason}; the run belongs to uid {owner}",
            context={"run_dir": str(self.path), "lock": str(lock), "owner_uid": owner, "uid": os.geteuid()},
            suggestion="continue the run as the user who owns it",
        )


def runs_dir_unwritable(runs_dir: Path, exc: OSError) -> RunsDirUnwritable:
    return RunsDirUnwritable(
        f"cannot create a run directory under {runs_dir}: {exc.strerror or exc}",
        context={"runs_dir": str(runs_dir), "errno": exc.errno, "os_error": exc.strerror},
        suggestion="use a writable directory: --runs-dir DIR or BULKRELAY_RUNS_DIR",
    )


@dataclass
class AlphaRun:
    """A run directory the public alpha made: listed by `runs`, never resumed, retried or pruned."""

    path: Path
    manifest: AlphaManifest

    format = ALPHA

    @property
    def run_id(self) -> str:
        return self.manifest.run_id


def holds_manifest(path: Path) -> bool:
    """Whether `path`, met in a listing of a runs directory, is a run directory: it holds a `run.json`.
    A directory this user may not look into (`chmod 000`, another user's) and named as runs are is a
    run that cannot be read, which opening it then says (JOURNAL_CORRUPT, `runs`' RUN_UNREADABLE);
    named otherwise (`lost+found`), it is no run."""
    try:
        return (path / MANIFEST).is_file()
    except PermissionError:
        return is_run_id(path.name)


def open_listed(path: Path, storage: Storage | None = None) -> RunDir | AlphaRun:
    """The run at `path`, the public alpha's included: what listing a runs directory meets."""
    manifest_path = path / MANIFEST
    # A directory without a manifest is no run, whatever links it holds (`status ~`): say so first.
    if os.path.lexists(manifest_path):
        refuse_links(path)  # before anything is read from it: a link could point anywhere
    try:
        present = manifest_path.is_file()
    except PermissionError:  # a directory this user may not enter: reading its manifest says so
        present = True
    if not present:
        raise NotFound(f"no run directory at {path} (missing {MANIFEST})", context={"run_dir": str(path)})
    data = read_json(manifest_path)
    if AlphaManifest.describes(data):
        return AlphaRun(path, AlphaManifest.from_json(manifest_path, data))
    return RunDir(path, RunManifest.from_json(manifest_path, data), storage or Storage())


def alpha_run_refused(run: AlphaRun) -> RunNotResumable:
    """Why a run of the public alpha cannot be resumed, retried, exported or shown, and what to do."""
    config = run.manifest.config_path or "JOB"
    return RunNotResumable(
        f"{run.path} is a run directory of the public alpha (state {run.manifest.state!r}); "
        "this BulkRelay cannot resume, retry, export or show it: its journal has no checksums and "
        "its manifest no fingerprints this version can verify",
        context={"run_dir": str(run.path), "format": ALPHA, "alpha_state": run.manifest.state},
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
    """Whether some process holds an flock on `lock_file` (probed without keeping it). Another user's
    lock, which this user cannot open, counts as held: what acts on a run must not guess it free."""
    return probe_lock(lock_file) is not False


def probe_lock(lock_file: Path) -> bool | None:
    """Whether some process holds an flock on `lock_file`; None when this user cannot tell (another
    user's lock, not readable here)."""
    try:  # O_NONBLOCK: a FIFO put there would hold the open until something writes to it
        fd = open_private(lock_file, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except PermissionError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # not a lock BulkRelay made: nothing to tell from it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
