"""The result of a command and the one JSON envelope it becomes.

Commands return a `Result`; they never print. Its `data` is the command's typed value, a frozen
`CommandData` (see `bulkrelay.ops.results`). The CLI turns a `Result` (or a raised `BulkRelayError`)
into the envelope `{"ok", "data", "error", "warnings", "meta"}`: all five keys always present,
`ok` true exactly when `meta.exit_code == 0`, `data` the value's `to_data()`.
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
    error: dict[str, Any] | None = None
    warnings: list[EnvelopeWarning] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    kind: str = "generic"  # tells the human renderer how to show `data`; a CommandData's own kind

    def __post_init__(self) -> None:
        if isinstance(self.data, CommandData):
            self.kind = self.data.kind

    def payload(self) -> dict[str, Any] | None:
        """`data` as the envelope carries it."""
        return self.data.to_data() if isinstance(self.data, CommandData) else self.data

    @classmethod
    def from_error(cls, exc: BulkRelayError, *, data: Any = None) -> Result:
        data = exc.data if data is None else data
        return cls(data=data, exit_code=exc.exit_code, error=exc.to_dict(), kind="error")

    @classmethod
    def from_unexpected(cls, exc: Exception) -> Result:
        """A failure nobody planned for, still as an answer: its type, message and traceback."""
        return cls(
            exit_code=ExitCode.GENERAL_ERROR,
            kind="error",
            error={
                "code": "GENERAL_ERROR",
                "message": f"unexpected {type(exc).__name__}: {exc}",
                "detail": traceback.format_exc(limit=8),
                "retryable": False,
            },
        )


def to_envelope(result: Result, *, duration_ms: int) -> dict[str, Any]:
    meta = {"exit_code": int(result.exit_code), "duration_ms": duration_ms, **result.meta}
    return {
        "ok": result.exit_code == ExitCode.SUCCESS,
        "data": result.payload(),
        "error": result.error,
        "warnings": [w.to_dict() for w in result.warnings],
        "meta": meta,
    }


def dumps_envelope(envelope: dict[str, Any]) -> bytes:
    # default=str keeps an unexpected Path or datetime from turning an answer into a crash.
    return orjson.dumps(envelope, default=str) + b"\n"
