"""Every error BulkRelay reports on purpose, and the exit code each one maps to.

    BulkRelayError                      code                 exit
    ├── UsageError                      USAGE_ERROR          2 ARG_ERROR
    ├── ConfigInvalid                   CONFIG_INVALID       2 ARG_ERROR
    ├── InputInvalid                    INPUT_INVALID        2 ARG_ERROR
    ├── NotFound                        NOT_FOUND            5 NOT_FOUND
    │   └── JobFileUnreadable           JOB_FILE_UNREADABLE
    ├── PreconditionFailed                                   4 PRECONDITION
    │   ├── SecretMissing               SECRET_MISSING
    │   ├── SecretInvalid               SECRET_INVALID
    │   ├── InputChanged                INPUT_CHANGED
    │   ├── ConfigChanged               CONFIG_CHANGED
    │   ├── JournalCorrupt              JOURNAL_CORRUPT
    │   ├── RunNotResumable             RUN_NOT_RESUMABLE
    │   ├── RunDirUnsafe                RUN_DIR_UNSAFE
    │   ├── TlsUnavailable              TLS_UNAVAILABLE
    │   ├── RunsDirUnwritable           RUNS_DIR_UNWRITABLE
    │   ├── RunsDirUnreadable           RUNS_DIR_UNREADABLE
    │   ├── StateDirUnwritable          STATE_DIR_UNWRITABLE
    │   ├── SyncStateMismatch           SYNC_STATE_MISMATCH
    │   ├── SyncStateCorrupt            SYNC_STATE_CORRUPT
    │   ├── TooManyDeletes              TOO_MANY_DELETES
    │   ├── MirrorKeyCollision          MIRROR_KEY_COLLISION
    │   └── RunSuperseded               RUN_SUPERSEDED
    ├── TargetAuthFailed                TARGET_AUTH_FAILED   8 AUTH_REQUIRED
    ├── TargetUnavailable               TARGET_UNAVAILABLE  12 UNAVAILABLE
    ├── InputUnavailable                INPUT_UNAVAILABLE   12 UNAVAILABLE
    ├── RunLocked                       RUN_LOCKED           6 CONFLICT
    │   └── RunLockNotOurs              RUN_LOCK_NOT_OURS
    ├── SyncStateBusy                   SYNC_STATE_BUSY      6 CONFLICT
    ├── StorageFailed                   STORAGE_FAILED       1 GENERAL_ERROR
    ├── OutputClosed                    OUTPUT_CLOSED        1 GENERAL_ERROR
    └── JobLost                         JOB_LOST             1 GENERAL_ERROR

A run that ends without relaying every row is not an exception: the engine returns
an outcome and the CLI maps it to PARTIAL_FAILURE, AUTH_REQUIRED, UNAVAILABLE,
TIMEOUT, INCOMPLETE or the signal codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    SUCCESS = 0
    GENERAL_ERROR = 1
    ARG_ERROR = 2
    PARTIAL_FAILURE = 3
    PRECONDITION = 4
    NOT_FOUND = 5
    CONFLICT = 6
    AUTH_REQUIRED = 8
    TIMEOUT = 10
    UNAVAILABLE = 12
    INCOMPLETE = 14
    SIGINT = 130
    SIGTERM = 143


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a job file or an input, with the place it was found."""

    message: str
    file: str | None = None
    line: int | None = None
    row: int | None = None
    field: str | None = None
    path: str | None = None  # dotted YAML path such as "request.json.age"

    def where(self) -> str:
        parts: list[str] = []
        if self.file is not None:
            parts.append(self.file if self.line is None else f"{self.file}:{self.line}")
        elif self.line is not None:
            parts.append(f"line {self.line}")
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.path is not None and not self.message.startswith(self.path):  # said once, where it names it
            parts.append(self.path)
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ", ".join(parts)

    def describe(self) -> str:
        place = self.where()
        return f"{place}: {self.message}" if place else self.message

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class BulkRelayError(Exception):
    code = "GENERAL_ERROR"
    exit_code = ExitCode.GENERAL_ERROR
    retryable = False
    data: dict[str, Any] | None = None  # the envelope's `data` when the error leaves something to act on

    def __init__(
        self,
        message: str,
        *,
        detail: str | None = None,
        context: dict[str, Any] | None = None,
        suggestion: str | None = None,
        phase: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.context = context or {}
        self.suggestion = suggestion
        self.phase = phase

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.detail is not None:
            out["detail"] = self.detail
        if self.context:
            out["context"] = self.context
        if self.suggestion is not None:
            out["suggestion"] = self.suggestion
        if self.phase is not None:
            out["phase"] = self.phase
        return out


class UsageError(BulkRelayError):
    code = "USAGE_ERROR"
    exit_code = ExitCode.ARG_ERROR


class _ProblemsError(BulkRelayError):
    """An error that carries the list of problems found, each with its place."""

    exit_code = ExitCode.ARG_ERROR

    def __init__(self, problems: list[Problem], *, total: int | None = None, **kwargs: Any) -> None:
        self.problems = problems
        self.total = total if total is not None else len(problems)
        first = problems[0].describe() if problems else "invalid"
        more = f" (and {self.total - 1} more)" if self.total > 1 else ""
        context = {"problems": [p.to_dict() for p in problems], "problem_count": self.total}
        super().__init__(first + more, context=context, **kwargs)


class ConfigInvalid(_ProblemsError):
    code = "CONFIG_INVALID"


class InputInvalid(_ProblemsError):
    code = "INPUT_INVALID"


class NotFound(BulkRelayError):
    code = "NOT_FOUND"
    exit_code = ExitCode.NOT_FOUND


class JobFileUnreadable(NotFound):
    """The job file exists but cannot be read (permission denied): for this user it is not there."""

    code = "JOB_FILE_UNREADABLE"


class PreconditionFailed(BulkRelayError):
    exit_code = ExitCode.PRECONDITION


class SecretMissing(PreconditionFailed):
    code = "SECRET_MISSING"


class SecretInvalid(PreconditionFailed):
    """A `${NAME}` secret holds what the transport cannot send (a line break in a header, say)."""

    code = "SECRET_INVALID"


class InputChanged(PreconditionFailed):
    code = "INPUT_CHANGED"


class ConfigChanged(PreconditionFailed):
    code = "CONFIG_CHANGED"


class JournalCorrupt(PreconditionFailed):
    code = "JOURNAL_CORRUPT"


class RunNotResumable(PreconditionFailed):
    code = "RUN_NOT_RESUMABLE"


class RunDirUnsafe(PreconditionFailed):
    """A file in a run (or job) directory is a symbolic link: BulkRelay never writes through one."""

    code = "RUN_DIR_UNSAFE"


class TlsUnavailable(PreconditionFailed):
    """No trusted CA certificate could be loaded, so no HTTP client can be made (even for http://)."""

    code = "TLS_UNAVAILABLE"


class RunsDirUnwritable(PreconditionFailed):
    """No run directory can be made under the runs dir (permission denied, a file in the way, ...)."""

    code = "RUNS_DIR_UNWRITABLE"


class RunsDirUnreadable(PreconditionFailed):
    """The runs dir, or its index of invocations, cannot be read (permission denied: another user's):
    no run in it can be found, so none is acted on, and no second run is started beside one."""

    code = "RUNS_DIR_UNREADABLE"


class StateDirUnwritable(PreconditionFailed):
    """The per-user state directory of background jobs cannot be made or written."""

    code = "STATE_DIR_UNWRITABLE"


class SyncStateMismatch(PreconditionFailed):
    """`sync-state verify`: a delta job's sync state differs from what its journals imply."""

    code = "SYNC_STATE_MISMATCH"


class SyncStateCorrupt(PreconditionFailed):
    """A delta job's sync state is not a readable SQLite database; `sync-state rebuild` remakes it."""

    code = "SYNC_STATE_CORRUPT"


class TooManyDeletes(PreconditionFailed):
    """`sync: mirror`: more keys gone from the input than `mirror.max_deletes` allows; nothing was sent."""

    code = "TOO_MANY_DELETES"


class TargetAuthFailed(BulkRelayError):
    """The OAuth2 token endpoint refused the client (`validate --check-auth`); a run halts instead."""

    code = "TARGET_AUTH_FAILED"
    exit_code = ExitCode.AUTH_REQUIRED


class TargetUnavailable(BulkRelayError):
    """The OAuth2 token endpoint could not be reached or kept failing (`validate --check-auth`)."""

    code = "TARGET_UNAVAILABLE"
    exit_code = ExitCode.UNAVAILABLE
    retryable = True


class InputUnavailable(BulkRelayError):
    """The database a query input reads cannot be reached (or refused us): nothing was read."""

    code = "INPUT_UNAVAILABLE"
    exit_code = ExitCode.UNAVAILABLE
    retryable = True


class MirrorKeyCollision(PreconditionFailed):
    """`sync: mirror` without `mirror.key_match`: a key to delete is one of tonight's keys in another case
    or Unicode form (`ABC` gone, `abc` upserted); nothing was sent."""

    code = "MIRROR_KEY_COLLISION"


class RunSuperseded(PreconditionFailed):
    """A delta run a newer run of its job has overtaken: continuing it would deliver its older rows
    over the newer run's deliveries (docs/delta.md)."""

    code = "RUN_SUPERSEDED"


class RunLocked(BulkRelayError):
    code = "RUN_LOCKED"
    exit_code = ExitCode.CONFLICT
    retryable = True


class RunLockNotOurs(RunLocked):
    """The run's lock file cannot even be opened: it belongs to another user, who owns the run."""

    code = "RUN_LOCK_NOT_OURS"
    retryable = False


class SyncStateBusy(BulkRelayError):
    """Another process kept a delta job's sync state locked for longer than the bounded wait."""

    code = "SYNC_STATE_BUSY"
    exit_code = ExitCode.CONFLICT
    retryable = True


class StorageFailed(BulkRelayError):
    """A write or fsync of run state failed. Fatal and never retried: the disk may have lost data."""

    code = "STORAGE_FAILED"


class OutputClosed(BulkRelayError):
    """The reader of `export -o -` closed the pipe before the last row (`| head`): the rows are cut short."""

    code = "OUTPUT_CLOSED"


class JobLost(BulkRelayError):
    code = "JOB_LOST"


def sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The BulkRelay error inside a task group's (nested) exception group, so that it reaches the CLI
    as itself with its own code and exit code; else a signal's exception inside it (the CLI's SIGTERM
    handler raises one while the relay starts, before the relay's own handlers are in place), so the
    CLI answers 143 rather than a traceback; the group itself when it holds neither."""
    found: BaseException | None = group.split(BulkRelayError)[0]
    if found is None:  # a BaseException that is no Exception: KeyboardInterrupt, the CLI's _Terminated
        found = group.split(lambda exc: not isinstance(exc, Exception | BaseExceptionGroup))[0]
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found if found is not None else group
