"""The result of a command and the one JSON envelope it becomes.

Commands return a `Result`; they never print. Its `data` is the command's typed value, a frozen
`CommandData` (see `bulkrelay.ops.results`). The CLI turns a `Result` (or a raised `BulkRelayError`)
into the envelope `{"ok", "data", "error", "warnings", "meta"}`: all five keys always present,
`ok` true exactly when `meta.exit_code == 0`, `data` the value's `to_data()`. The error and meta are
typed records too (`ErrorInfo`, `CallMeta`); what the CLI alone reads (`SideChannel`) never reaches
the envelope. Their dicts are made in one place, `to_envelope`.
"""

from __future__ import annotations

import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from bulkrelay.errors import BulkRelayError, ExitCode, Problem


@dataclass(frozen=True)
class EnvelopeWarning:
    """One warning: a stable code, a sentence, and where it applies."""

    code: str
    message: str
    context: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.context:
            out["context"] = self.context
        return out


def deprecation_warnings(notes: tuple[Problem, ...]) -> list[EnvelopeWarning]:
    """`DEPRECATED_KEY` warnings for a job file's old spellings, each placed by file, line and path."""
    return [
        EnvelopeWarning(
            "DEPRECATED_KEY", note.message, {k: v for k, v in note.to_dict().items() if k != "message"}
        )
        for note in notes
    ]


# The order of an error's keys as `BulkRelayError.to_dict` writes them; a few answers have always written
# theirs in another order (`ErrorInfo.order`), and the envelope is a contract to the byte.
ERROR_KEYS = ("code", "message", "retryable", "detail", "context", "suggestion", "phase")


@dataclass(frozen=True)
class ErrorInfo:
    """The envelope's `error`: a stable code, a sentence, whether trying again can help, and what to do.
    A key is written only when its value is set; `order` is the order the keys are written in."""

    code: str
    message: str
    retryable: bool
    detail: str | None = None
    context: dict[str, Any] | None = None
    suggestion: str | None = None
    phase: str | None = None
    order: tuple[str, ...] = field(default=ERROR_KEYS, compare=False)
    # Keys of a stored error this version does not know (a later version's, a hand edit), kept as written.
    more: dict[str, Any] | None = None

    @classmethod
    def of(cls, exc: BulkRelayError) -> ErrorInfo:
        return cls(
            exc.code,
            exc.message,
            exc.retryable,
            detail=exc.detail,
            context=exc.context or None,
            suggestion=exc.suggestion,
            phase=exc.phase,
        )

    @classmethod
    def from_dict(cls, stored: dict[str, Any]) -> ErrorInfo:
        """An error as an envelope holds it (a background job's stored answer): every key, its value
        and its place kept, so the answer reads back exactly as the job wrote it."""
        return cls(
            code=stored.get("code", ""),
            message=stored.get("message", ""),
            retryable=stored.get("retryable", False),
            detail=stored.get("detail"),
            context=stored.get("context"),
            suggestion=stored.get("suggestion"),
            phase=stored.get("phase"),
            order=tuple(stored),
            more={key: value for key, value in stored.items() if key not in ERROR_KEYS} or None,
        )

    def to_dict(self) -> dict[str, Any]:
        more = self.more or {}
        values = {key: more[key] if key in more else getattr(self, key) for key in self.order}
        return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class CallMeta:
    """The envelope's `meta` besides the exit code and duration: how the call ran. `job_id`: the
    background job that did the work; `budget_ms`: the call budget resolved (0 included)."""

    job_id: str | None = None
    budget_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        values = {"job_id": self.job_id, "budget_ms": self.budget_ms}
        return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class SideChannel:
    """What a result tells the CLI beside its envelope, never in it. `stdout_payload`: the whole answer
    for stdout (a completion script, a report page with `-o -`); `work_duration_ms`: a background job's
    own duration, which the envelope's `meta.duration_ms` then says instead of the call's."""

    stdout_payload: str | None = None
    work_duration_ms: int | None = None


class CommandData(ABC):
    """A command's typed result. Subclasses are frozen dataclasses; `to_data()` is the envelope's
    `data`, and `kind` names the human view (kept with a background job's stored envelope)."""

    kind: ClassVar[str] = "generic"

    @abstractmethod
    def to_data(self) -> dict[str, Any]: ...


@dataclass
class Result:
    """What a command hands back to the CLI: data, an exit code and, when it failed, an error.

    `data` is a `CommandData`, or a plain mapping where there is no type: an error's own data, and a
    background job's result read back from its stored envelope."""

    data: CommandData | dict[str, Any] | None = None
    exit_code: ExitCode = ExitCode.SUCCESS
    error: ErrorInfo | None = None
    warnings: list[EnvelopeWarning] = field(default_factory=list)
    meta: CallMeta = CallMeta()
    kind: str = "generic"  # tells the human renderer how to show `data`; a CommandData's own kind
    side: SideChannel = SideChannel()

    def __post_init__(self) -> None:
        if isinstance(self.data, CommandData):
            self.kind = self.data.kind

    def payload(self) -> dict[str, Any] | None:
        """`data` as the envelope carries it."""
        return self.data.to_data() if isinstance(self.data, CommandData) else self.data

    @classmethod
    def from_error(cls, exc: BulkRelayError, *, data: Any = None) -> Result:
        data = exc.data if data is None else data
        return cls(data=data, exit_code=exc.exit_code, error=ErrorInfo.of(exc), kind="error")

    @classmethod
    def from_unexpected(cls, exc: Exception) -> Result:
        """A failure nobody planned for, still as an answer: its type, message and traceback."""
        return cls(
            exit_code=ExitCode.GENERAL_ERROR,
            kind="error",
            error=ErrorInfo(
                "GENERAL_ERROR",
                f"unexpected {type(exc).__name__}: {exc}",
                retryable=False,
                detail=traceback.format_exc(limit=8),
                order=("code", "message", "detail", "retryable"),
            ),
        )


def to_envelope(result: Result, *, duration_ms: int) -> dict[str, Any]:
    """The one place a result becomes the envelope's dict (and the error and meta theirs)."""
    meta = {"exit_code": int(result.exit_code), "duration_ms": duration_ms, **result.meta.to_dict()}
    return {
        "ok": result.exit_code == ExitCode.SUCCESS,
        "data": result.payload(),
        "error": None if result.error is None else result.error.to_dict(),
        "warnings": [w.to_dict() for w in result.warnings],
        "meta": meta,
    }


def dumps_envelope(envelope: dict[str, Any]) -> bytes:
    # default=str keeps an unexpected Path or datetime from turning an answer into a crash.
    try:
        return orjson.dumps(envelope, default=str) + b"\n"
    except orjson.JSONEncodeError:  # a string that is not UTF-8 (a path from a Latin-1 directory name)
        return orjson.dumps(_utf8(envelope), default=str) + b"\n"


def _utf8(value: Any) -> Any:
    """`value` with every string made UTF-8: the bytes Python kept as lone surrogates (how it reads a
    file name or variable that is not UTF-8) shown as `\\xe9`, so the answer still names them."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_utf8(key): _utf8(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_utf8(item) for item in value]
    return value


def printable(text: str) -> str:
    """`text` as UTF-8 can carry it: undecodable bytes (lone surrogates) written `\\xNN`."""
    try:
        text.encode()
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no byte gave (`\ud800` from an escaped JSON string)
            return text.encode("utf-8", "backslashreplace").decode()
    return text
