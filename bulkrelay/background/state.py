"""A background job on disk: its directory under the per-user state directory, and who is alive.

State dir: BULKRELAY_STATE_DIR, else $XDG_STATE_HOME/bulkrelay, else ~/.local/state/bulkrelay.

<state-dir>/jobs/
├── index/<invocation-key>        holds the id of that invocation's newest job
├── index.lock                    serializes "find or start the job of this invocation"
└── <job-id>/
    ├── spec.json                 the command's argv (never a secret) and its typed call, cwd, key, deadline
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bulkrelay.background.call import Call, CallFormInvalid, call_from_json
from bulkrelay.errors import BulkRelayError, NotFound, StateDirUnwritable, UsageError
from bulkrelay.private import PRIVATE_DIR_MODE, make_private_dir, open_private
from bulkrelay.store.atomic import read_json, write_atomic, write_json_atomic
from bulkrelay.store.jsonfields import JsonFields
from bulkrelay.store.rundir import lock_is_held

RETENTION_ENV = "BULKRELAY_JOB_RETENTION_SECONDS"
DEFAULT_RETENTION_SECONDS = 24 * 3600.0


class BackgroundJobState(enum.StrEnum):
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
        return self not in (BackgroundJobState.RUNNING, BackgroundJobState.CANCELLING)


@dataclass(frozen=True)
class BackgroundJobSpec:
    """`spec.json`: the command line a background job runs, where, and the bounds of its work."""

    command: str
    argv: tuple[str, ...]  # never a secret: secrets come from the environment
    cwd: str
    key: str  # the invocation key, so the identical invocation attaches to the job
    created_at: float  # when the work began; a lost job's continuation keeps its predecessor's
    deadline: float | None = None  # absolute, from --timeout
    previous_job: str | None = None  # the lost job this one continues
    stdin_rest: bool = False  # the call's stdin was still open at the hand-off: the worker reads the rest
    # The typed call the worker runs, stored as the JSON of its fields; None in a job an earlier version
    # wrote, whose worker parses its `argv` again as that version did.
    call: Call | None = None

    @classmethod
    def from_json(cls, path: Path, data: object) -> BackgroundJobSpec:
        fields = JsonFields(path, data, BulkRelayError)
        argv = tuple(fields.texts("argv"))
        call = None
        if fields.has("call"):
            try:
                call = call_from_json(fields.raw_object("call"), argv)
            except CallFormInvalid as invalid:
                raise fields.refuse(invalid.field, invalid.want, invalid.value) from None
        return cls(
            command=fields.text("command"),
            argv=argv,
            cwd=fields.text("cwd"),
            key=fields.text("key"),
            created_at=fields.number("created_at"),
            deadline=fields.optional_number("deadline"),
            previous_job=fields.optional_text("previous_job"),
            stdin_rest=fields.has("stdin_rest") and fields.flag("stdin_rest"),  # absent: an older job
            call=call,
        )

    def to_json(self, job_id: str) -> dict[str, Any]:
        data: dict[str, Any] = {
            "job_id": job_id,
            "command": self.command,
            "argv": list(self.argv),
            "cwd": self.cwd,
            "key": self.key,
            "created_at": self.created_at,
            "deadline": self.deadline,
            "previous_job": self.previous_job,
            "stdin_rest": self.stdin_rest,
        }
        if self.call is not None:
            data["call"] = self.call.to_json()
        return data


@dataclass(frozen=True)
class WorkerReport:
    """What the worker adds to a job's status once it runs: its stage, preflight's rows, warnings, pid."""

    stage: str  # starting, preflight, relay
    rows_read: int | None
    warnings: tuple[dict[str, Any], ...]  # envelope warnings, recorded as they arise
    pid: int


@dataclass(frozen=True)
class BackgroundJobStatus:
    """`status.json`: a background job's state and progress as last written (by the front, the worker)."""

    state: BackgroundJobState
    progress: dict[str, Any] | None = None  # committed progress {done, total, unit, ok, failed}
    run_dir: str | None = None
    worker: WorkerReport | None = None
    exit_code: int | None = None  # once the worker has ended
    updated_at: float | None = None  # stamped when written

    @classmethod
    def from_json(cls, path: Path, data: object) -> BackgroundJobStatus:
        fields = JsonFields(path, data, BulkRelayError)
        state = fields.text("state")
        if state not in _JOB_STATES:
            raise fields.refuse("state", f"one of {', '.join(BackgroundJobState)}", state)
        worker = None
        if fields.has("pid"):
            worker = WorkerReport(
                stage=fields.text("stage"),
                rows_read=fields.optional_integer("rows_read"),
                warnings=tuple(fields.objects("warnings")),
                pid=fields.integer("pid"),
            )
        return cls(
            state=BackgroundJobState(state),
            progress=fields.raw_object("progress", optional=True),
            run_dir=fields.optional_text("run_dir"),
            worker=worker,
            exit_code=fields.optional_integer("exit_code"),
            updated_at=fields.optional_number("updated_at"),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"state": self.state.value, "progress": self.progress, "run_dir": self.run_dir}
        if self.worker is not None:
            data.update(
                stage=self.worker.stage,
                rows_read=self.worker.rows_read,
                warnings=list(self.worker.warnings),
                pid=self.worker.pid,
            )
        if self.exit_code is not None:
            data["exit_code"] = self.exit_code
        data["updated_at"] = self.updated_at
        return data


@dataclass(frozen=True)
class BackgroundJobResult:
    """`result.json`: the job's final envelope and exit code, written before the job is marked ended."""

    envelope: dict[str, Any]  # exactly as the command's own call would have printed it
    exit_code: int
    kind: str = "generic"  # how the CLI renders it
    ended_at: float | None = None  # None only in a result damaged or written by hand

    @classmethod
    def from_json(cls, path: Path, data: object) -> BackgroundJobResult:
        fields = JsonFields(path, data, BulkRelayError)
        envelope = fields.raw_object("envelope")
        assert envelope is not None
        return cls(
            envelope=envelope,
            exit_code=fields.integer("exit_code"),
            kind=fields.optional_text("kind") or "generic",
            ended_at=fields.optional_number("ended_at"),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"envelope": self.envelope, "exit_code": self.exit_code, "kind": self.kind}
        if self.ended_at is not None:
            data["ended_at"] = self.ended_at
        return data


_JOB_STATES = frozenset(state.value for state in BackgroundJobState)
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


def background_jobs_root() -> Path:
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
class BackgroundJob:
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
    def create(cls, spec: BackgroundJobSpec, status: BackgroundJobStatus | None = None) -> BackgroundJob:
        """A new job directory with its spec and first status (by default: running, nothing known)."""
        job_id = f"{spec.command}-{secrets.token_hex(5)}"
        path = background_jobs_root() / job_id
        path.mkdir(mode=PRIVATE_DIR_MODE)
        background = cls(path)
        write_json_atomic(path / "spec.json", spec.to_json(job_id))
        background.write_status(status or BackgroundJobStatus(BackgroundJobState.RUNNING))
        return background

    @classmethod
    def open(cls, job_id: str) -> BackgroundJob:
        """A malformed id is a usage error checked before it comes near a path; a well-formed one
        without a job is NOT_FOUND."""
        if not is_job_id(job_id):
            raise UsageError(
                f"{job_id!r} is not a job id: a job id looks like run-0123456789",
                context={"job_id": job_id},
                suggestion="use the job_id of the envelope that started the job",
            )
        path = background_jobs_root() / job_id
        if not (path / "spec.json").is_file():
            raise NotFound(f"no job {job_id!r}", context={"job_id": job_id, "jobs_dir": str(path.parent)})
        return cls(path)

    def spec(self) -> BackgroundJobSpec:
        path = self.path / "spec.json"
        return BackgroundJobSpec.from_json(path, read_json(path, invalid=BulkRelayError))

    def status(self) -> BackgroundJobStatus:
        path = self.path / "status.json"
        with contextlib.suppress(NotFound):
            return BackgroundJobStatus.from_json(path, read_json(path, invalid=BulkRelayError))
        return BackgroundJobStatus(BackgroundJobState.RUNNING)

    def write_status(self, status: BackgroundJobStatus) -> None:
        stamped = replace(status, updated_at=time.time())
        write_json_atomic(self.path / "status.json", stamped.to_json())

    def result(self) -> BackgroundJobResult | None:
        """The stored final answer, or None while there is none."""
        path = self.path / "result.json"
        try:
            return BackgroundJobResult.from_json(path, read_json(path, invalid=BulkRelayError))
        except NotFound:
            return None

    def write_result(self, result: BackgroundJobResult) -> None:
        write_json_atomic(self.path / "result.json", result.to_json())

    def request_cancel(self) -> None:
        write_atomic(self.path / "cancel", b"cancel\n")

    @property
    def cancel_requested(self) -> bool:
        return (self.path / "cancel").exists()

    def is_live(self) -> bool:
        """Whether a worker holds the job's lock right now."""
        return lock_is_held(self.lock_path)

    def state(self) -> BackgroundJobState:
        """`running`, `ended` or `lost`. Liveness is read first: a worker writes its result before
        it lets go of the lock, so a dead lock with no result really means the worker died."""
        live = self.is_live()
        if self.result() is not None:
            return BackgroundJobState.ENDED
        return BackgroundJobState.RUNNING if live else BackgroundJobState.LOST

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


def acquire_lock(background: BackgroundJob) -> int:
    """Take the job's lock for a worker about to start; returns the descriptor that holds it."""
    fd = open_private(background.lock_path, os.O_RDWR | os.O_CREAT)
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
def index_locked(*, wait: bool = True) -> Iterator[bool]:
    """One process at a time finds or starts the job of an invocation, so two never start two. Yields
    True once the index is this process's; with `wait=False`, False at once when another holds it."""
    fd = open_private(background_jobs_root() / "index.lock", os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


def background_job_for_key(key: str) -> BackgroundJob | None:
    try:
        job_id = (background_jobs_root() / "index" / key).read_text().strip()
    except FileNotFoundError:
        return None
    if not is_job_id(job_id):  # a damaged index entry: as if there were none
        return None
    try:
        return BackgroundJob.open(job_id)
    except NotFound:
        return None


def remember_background_job(key: str, background: BackgroundJob) -> None:
    index = background_jobs_root() / "index"
    make_private_dir(index)
    write_atomic(index / key, background.job_id.encode())


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
    root = background_jobs_root()
    removed = []
    for path in root.iterdir():
        if not is_job_id(path.name):
            continue
        with contextlib.suppress(OSError, BulkRelayError):
            if _expired(BackgroundJob(path), now, keep_for):
                shutil.rmtree(path)
                removed.append(path.name)
    _prune_index(root)
    return removed


def _expired(background: BackgroundJob, now: float, keep_for: float) -> bool:
    if background.is_live():
        return False
    return now - _ended_at(background) >= keep_for


def _ended_at(background: BackgroundJob) -> float:
    """When the job ended; for a lost worker, a job being set up or a damaged result, its last sign of
    life. A damaged job must never stop every later call, which all clean up expired jobs first."""
    try:
        result = background.result()
        ended = background.status().updated_at if result is None else result.ended_at
    except BulkRelayError:  # a damaged spec, status or result
        ended = None
    return background.path.stat().st_mtime if ended is None else ended


def _prune_index(root: Path) -> None:
    index = root / "index"
    if not index.is_dir():
        return
    for entry in index.iterdir():
        with contextlib.suppress(OSError):
            if not (root / entry.read_text().strip()).is_dir():
                entry.unlink()
