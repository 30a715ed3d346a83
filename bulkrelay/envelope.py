"""The result of a command and the one JSON envelope it becomes.

Commands return a `Result`; they never print. The CLI turns a `Result` (or a raised
`BulkRelayError`) into the envelope `{"ok", "data", "error", "warnings", "meta"}`:
all five keys always present, `ok` true exactly when `meta.exit_code == 0`.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class Result:
    """What a command hands back to the CLI: data, an exit code and, when it failed, an error."""

    data: Any = None
    exit_code: ExitCode = ExitCode.SUCCESS
    error: dict[str, Any] | None = None
    warnings: list[EnvelopeWarning] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    kind: str = "generic"  # tells the human renderer how to show `data`

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
        "data": result.data,
        "error": result.error,
        "warnings": [w.to_dict() for w in result.warnings],
        "meta": meta,
    }


def dumps_envelope(envelope: dict[str, Any]) -> bytes:
    # default=str keeps an unexpected Path or datetime from turning an answer into a crash.
    return orjson.dumps(envelope, default=str) + b"\n"
