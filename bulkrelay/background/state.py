"""A background job on disk: its directory under the per-user state directory, and who is alive.

State dir: BULKRELAY_STATE_DIR, else $XDG_STATE_HOME/bulkrelay, else ~/.local/state/bulkrelay.

<state-dir>/jobs/
├── index/<invocation-key>        holds the id of that invocation's newest job
├── index.lock                    serializes "find or start the job of this invocation"
└── <job-id>/
    ├── spec.json                 the command's argv (never a secret), cwd, key, deadline
    ├── status.json               state, progress {done, total, unit}, run_dir, updated_at
    ├── result.json               the final envelope and exit code, written before the job is marked ended
    ├── log                       the worker's stdout and stderr
    ├── stdin                     the spooled standard input, when the command read `--input -`
    ├── cancel                    present once `job cancel` asked the job to stop
    └── lock                      flock held by the worker for its whole life; holds its pid

Liveness is the lock: the OS drops it when the worker dies however it dies, so a pid is never trusted
on its own. Every JSON file is replaced atomically. Directories are made 0700 and files 0600, never
through a link (bulkrelay.store.storage).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bulkrelay.errors import BulkRelayError, NotFound, StateDirUnwritable, UsageError
from bulkrelay.private import PRIVATE_DIR_MODE, make_private_dir, open_private
from bulkrelay.store.atomic import read_json, write_atomic, write_json_atomic
from bulkrelay.store.rundir import lock_is_held

RETENTION_ENV = "BULKRELAY_JOB_RETENTION_SECONDS"
DEFAULT_RETENTION_SECONDS = 24 * 3600.0


class JobState(enum.StrEnum):
    """A background job's state, as status.json and the `job` envelopes name it. The values are on
    disk and on the wire: never change one."""

    RUNNING = "running"  # its worker holds the job's lock
    CANCELLING = "cancelling"  # running, and `job cancel` asked it to stop
    ENDED = "ended"  # its worker wrote the result and exited
    CANCELLED = "cancelled"  # ended, and its run was cancelled (the answer of `job cancel`)
    LOST = "lost"  # its worker exited without a result

    @property
    def final(self) -> bool:
        """The worker is gone: the job will not change any more."""
        return self not in (JobState.RUNNING, JobState.CANCELLING)


_JOB_ID = re.compile(r"^[a-z][a-z-]*-[0-9a-f]{10}$")


def is_job_id(text: str) -> bool:
    return _JOB_ID.fullmatch(text) is not None


def state_dir() -> Path:
    explicit = os.environ.get("BULKRELAY_STATE_DIR")
    if explicit:
        return Path(explicit).resolve()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return (base / "bulkrelay").resolve()


def jobs_root() -> Path:
    root = state_dir() / "jobs"
    try:
        make_private_dir(root)  # the state dir too, when BulkRelay is the one making it
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(13, os.strerror(13))
    except OSError as exc:
        raise StateDirUnwritable(
            f"cannot use the job state directory {root}: {exc.strerror or exc}",
            context={"state_dir": str(root.parent), "errno": exc.errno, "os_error": exc.strerror},
            suggestion="set BULKRELAY_STATE_DIR (or XDG_STATE_HOME) to a directory you can write",
        ) from None
    return root


@dataclass(frozen=True)
class JobDir:
    """One job's directory; every read goes to disk, nothing is cached."""

    path: Path

    @property
    def job_id(self) -> str:
        return self.path.name

    @property
    def log_path(self) -> Path:
        return self.path / "log"

    @property
    def stdin_path(self) -> Path:
        return self.path / "stdin"

    @property
    def lock_path(self) -> Path:
        return self.path / "lock"

    @classmethod
    def create(cls, command: str, spec: dict[str, Any]) -> JobDir:
        job_id = f"{command}-{secrets.token_hex(5)}"
        path = jobs_root() / job_id
        path.mkdir(mode=PRIVATE_DIR_MODE)
        job = cls(path)
        write_json_atomic(path / "spec.json", {"job_id": job_id, **spec})
        job.write_status({"state": JobState.RUNNING, "progress": None, "run_dir": None})
        return job

    @classmethod
    def open(cls, job_id: str) -> JobDir:
        """A malformed id is a usage error checked before it comes near a path; a well-formed one
        without a job is NOT_FOUND."""
        if not is_job_id(job_id):
            raise UsageError(
                f"{job_id!r} is not a job id: a job id looks like run-0123456789",
                context={"job_id": job_id},
                suggestion="use the job_id of the envelope that started the job",
            )
        path = jobs_root() / job_id
        if not (path / "spec.json").is_file():
            raise NotFound(f"no job {job_id!r}", context={"job_id": job_id, "jobs_dir": str(path.parent)})
        return cls(path)

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = read_json(self.path / "spec.json", invalid=BulkRelayError)
        return spec

    def status(self) -> dict[str, Any]:
        with contextlib.suppress(NotFound):
            status: dict[str, Any] = read_json(self.path / "status.json", invalid=BulkRelayError)
            return status
        return {"state": JobState.RUNNING, "progress": None, "run_dir": None}

    def write_status(self, status: dict[str, Any]) -> None:
        write_json_atomic(self.path / "status.json", {**status, "updated_at": time.time()})

    def result(self) -> dict[str, Any] | None:
        """The stored final answer: {envelope, exit_code, kind, ended_at}, or None while there is none."""
        try:
            result: dict[str, Any] = read_json(self.path / "result.json", invalid=BulkRelayError)
        except NotFound:
            return None
        return result

    def write_result(self, result: dict[str, Any]) -> None:
        write_json_atomic(self.path / "result.json", result)

    def request_cancel(self) -> None:
        write_atomic(self.path / "cancel", b"cancel\n")

    @property
    def cancel_requested(self) -> bool:
        return (self.path / "cancel").exists()

    def is_live(self) -> bool:
        """Whether a worker holds the job's lock right now."""
        return lock_is_held(self.lock_path)

    def state(self) -> JobState:
        """`running`, `ended` or `lost`. Liveness is read first: a worker writes its result before
        it lets go of the lock, so a dead lock with no result really means the worker died."""
        live = self.is_live()
        if self.result() is not None:
            return JobState.ENDED
        return JobState.RUNNING if live else JobState.LOST

    def worker_pid(self) -> int | None:
        try:
            text = self.lock_path.read_text().strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def log_tail(self, max_bytes: int = 2000) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - max_bytes))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


def acquire_lock(job: JobDir) -> int:
    """Take the job's lock for a worker about to start; returns the descriptor that holds it."""
    fd = open_private(job.lock_path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


def record_pid(lock_fd: int, pid: int) -> None:
    os.ftruncate(lock_fd, 0)
    os.pwrite(lock_fd, f"{pid}\n".encode(), 0)


@contextlib.contextmanager
def index_locked() -> Iterator[None]:
    """One process at a time finds or starts the job of an invocation, so two never start two."""
    fd = open_private(jobs_root() / "index.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def job_for_key(key: str) -> JobDir | None:
    try:
        job_id = (jobs_root() / "index" / key).read_text().strip()
    except FileNotFoundError:
        return None
    if not is_job_id(job_id):  # a damaged index entry: as if there were none
        return None
    try:
        return JobDir.open(job_id)
    except NotFound:
        return None


def remember_job(key: str, job: JobDir) -> None:
    index = jobs_root() / "index"
    make_private_dir(index)
    write_atomic(index / key, job.job_id.encode())


def retention_seconds() -> float:
    raw = os.environ.get(RETENTION_ENV)
    try:
        return float(raw) if raw else DEFAULT_RETENTION_SECONDS
    except ValueError:
        return DEFAULT_RETENTION_SECONDS


def remove_expired(now: float | None = None) -> list[str]:
    """Remove job directories that ended (or died) longer than the retention period ago.

    Call it with `index_locked()` held, so a job being set up is never mistaken for an old one."""
    now = time.time() if now is None else now
    keep_for = retention_seconds()
    root = jobs_root()
    removed = []
    for path in root.iterdir():
        if not is_job_id(path.name):
            continue
        with contextlib.suppress(OSError, BulkRelayError):
            if _expired(JobDir(path), now, keep_for):
                shutil.rmtree(path)
                removed.append(path.name)
    _prune_index(root)
    return removed


def _expired(job: JobDir, now: float, keep_for: float) -> bool:
    if job.is_live():
        return False
    return now - _ended_at(job) >= keep_for


def _ended_at(job: JobDir) -> float:
    """When the job ended; for a lost worker, a job being set up or a damaged result, its last sign of
    life. A damaged job must never stop every later call, which all clean up expired jobs first."""
    result = job.result()
    try:
        if result is not None:
            return float(result["ended_at"])
        return float(job.status().get("updated_at") or job.path.stat().st_mtime)
    except (KeyError, TypeError, ValueError):
        return job.path.stat().st_mtime


def _prune_index(root: Path) -> None:
    index = root / "index"
    if not index.is_dir():
        return
    for entry in index.iterdir():
        with contextlib.suppress(OSError):
            if not (root / entry.read_text().strip()).is_dir():
                entry.unlink()
