"""One live run per job and runs directory: a second relay of a job never starts beside a live one.

Whoever relays a run of a job holds the job's *live lock* for as long as it relays. Whoever wants to
relay one first takes the job's *decide lock*, blocking but brief, so "find or create the run, then
claim the live lock" is one step across processes: a second caller waits until the first has named
its run, then finds the live lock held and gets RUN_LOCKED naming that run.

    <runs-dir>/.live/<job-key>/      job-key: a digest of the job file's absolute path (a delta job's:
                                     of its sync state's identity, its name)
    ├── decide                       flock: one process at a time decides which run the job relays
    ├── live                         flock: held by the relaying process for its whole life; names the run
    └── new-<run-id>/                a run being created; renamed into the runs directory when complete

The OS drops both locks when a process dies, however it dies. A `new-*` directory left by a crash is
an unfinished creation (never a run: it was never renamed into place) and is removed by the next caller.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import orjson

from bulkrelay.errors import RunLocked, RunsDirUnwritable
from bulkrelay.private import make_private_dir, open_private
from bulkrelay.store.rundir import RunDir, runs_dir_unwritable

LIVE_DIR = ".live"
STAGING_PREFIX = "new-"


def job_key(job_path: Path, shard: str | None = None, shared: str | None = None) -> str:
    """The job's slot: its file's absolute path, and the shard (`K/N`) when it is one of several.

    `shared`: what the job shares with other job files, when it does (a delta job's sync state is
    kept under its name): the slot is then that, so two files of one name never relay together."""
    job = str(job_path.resolve()) if shared is None else f"shared\0{shared}"
    identity = job if shard is None else f"{job}\0shard {shard}"
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


class LiveSlot:
    """The right to relay one run of a job in a runs directory, held until the `live_slot` block ends."""

    def __init__(self, directory: Path, decide_fd: int, live_fd: int) -> None:
        self.directory = directory  # new runs of the job are built here, then renamed into place
        self._decide_fd: int | None = decide_fd
        self._live_fd = live_fd

    def claim(self, run: RunDir) -> None:
        """The job now relays `run`: name it in the live lock, then let the next caller decide."""
        holder = {"run_id": run.run_id, "run_dir": str(run.path), "pid": os.getpid()}
        os.ftruncate(self._live_fd, 0)
        os.pwrite(self._live_fd, orjson.dumps(holder) + b"\n", 0)
        self._release_decide()

    def _release_decide(self) -> None:
        if self._decide_fd is not None:
            os.close(self._decide_fd)
            self._decide_fd = None

    def release(self) -> None:
        self._release_decide()
        os.close(self._live_fd)


@contextmanager
def live_slot(
    runs_dir: Path, job_path: Path, shard: str | None = None, *, shared: str | None = None
) -> Iterator[LiveSlot]:
    """Hold the job's live lock for the block, or raise RunLocked naming the run another process relays.
    `shared`: see `job_key`."""
    directory = runs_dir / LIVE_DIR / job_key(job_path, shard, shared)
    try:
        make_private_dir(directory)
        decide_fd = _open_lock(directory / "decide")
    except OSError as exc:  # RunDirUnsafe (a link) is not an OSError: it goes up as it is
        raise _slot_unusable(runs_dir, directory / "decide", exc) from None
    try:
        fcntl.flock(decide_fd, fcntl.LOCK_EX)  # blocks only while another caller decides
        live_fd = _open_lock(directory / "live")
    except PermissionError as exc:
        os.close(decide_fd)
        raise _slot_unusable(runs_dir, directory / "live", exc) from None
    except BaseException:
        os.close(decide_fd)
        raise
    slot = LiveSlot(directory, decide_fd, live_fd)
    try:
        try:
            fcntl.flock(live_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _run_locked(live_fd, job_path, shared) from None
        _remove_unfinished_creations(directory)
        yield slot
    finally:
        slot.release()


def _open_lock(path: Path) -> int:
    return open_private(path, os.O_RDWR | os.O_CREAT)


def _slot_unusable(runs_dir: Path, lock: Path, exc: OSError) -> RunsDirUnwritable:
    """Why this user cannot take the job's lock `lock`: in a runs directory shared with another user
    (a 1777 one), most often that the lock, or a directory above it, is that user's."""
    me = os.geteuid()
    for path in (lock, lock.parent, lock.parent.parent, runs_dir):
        try:
            owner = path.stat().st_uid
        except OSError:
            continue
        if owner != me:
            return RunsDirUnwritable(
                f"cannot take the job's live lock in {runs_dir}: {path} belongs to uid {owner}, not to "
                f"this user (uid {me}); a runs directory is one user's",
                context={"runs_dir": str(runs_dir), "path": str(path), "owner_uid": owner, "uid": me},
                suggestion="use a runs directory of your own (--runs-dir DIR or BULKRELAY_RUNS_DIR), "
                f"or run the job as uid {owner}",
            )
    return runs_dir_unwritable(runs_dir, exc)


def _run_locked(live_fd: int, job_path: Path, shared: str | None) -> RunLocked:
    """Named from the live lock, which the holder wrote before it let anyone else decide."""
    holder: dict[str, object] = {}
    with suppress(ValueError):
        holder = orjson.loads(os.pread(live_fd, 4096, 0) or b"{}")
    run_id = holder.get("run_id", "(unknown)")
    job = f"job {job_path}" if shared is None else f"job {job_path} ({shared}, shared with its sync state)"
    run_dir = holder.get("run_dir")
    status = f"bulkrelay status {shlex.quote(str(run_dir))}" if run_dir else "bulkrelay status RUN_DIR"
    return RunLocked(
        f"{job} already has a live run, {run_id} (pid {holder.get('pid', '?')}) in {run_dir or '(unknown)'}; "
        "not starting a second one beside it",
        context={"run_dir": run_dir, "run_id": run_id, "pid": holder.get("pid")},
        suggestion=f"wait for that run to end, then run the same command again; `{status}` shows how far",
    )


def _remove_unfinished_creations(directory: Path) -> None:
    """Left by a process that died while creating a run (we hold the decide lock: nobody is creating)."""
    for child in directory.iterdir():
        if child.name.startswith(STAGING_PREFIX) and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
