"""The commands' results: frozen typed values that the use cases return and the CLI renders.

Each value's `to_data()` is the `data` of its JSON envelope (docs/json-output.md), key for key and in
the same order, so the envelope is a contract kept in one place; the human view (cli/human.py) reads
the same value's attributes. The summary and pace mappings are the documents they come from
(`summary.json`, the limiter's state), carried as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bulkrelay.envelope import CommandData


@dataclass(frozen=True)
class InputFacts:
    """The input preflight read, as validate shows it."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ValidateResult(CommandData):
    kind = "validate"

    job: str
    record_count: int
    format: str
    gzip: bool
    input: InputFacts
    config_sha256: str

    def to_data(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "record_count": self.record_count,
            "format": self.format,
            "gzip": self.gzip,
            "input": {"path": self.input.path, "sha256": self.input.sha256, "size": self.input.size},
            "config_sha256": self.config_sha256,
        }


@dataclass(frozen=True)
class RenderedRequest:
    """One row's request as `render` shows it: secrets already `***`."""

    row_number: int
    line: int
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: str | None

    def to_data(self) -> dict[str, Any]:
        return {
            "row_number": self.row_number,
            "line": self.line,
            "method": self.method,
            "url": self.url,
            "headers": [[name, value] for name, value in self.headers],
            "body": self.body,
        }


@dataclass(frozen=True)
class RenderResult(CommandData):
    kind = "render"

    job: str
    requests: tuple[RenderedRequest, ...]

    def to_data(self) -> dict[str, Any]:
        return {"job": self.job, "requests": [request.to_data() for request in self.requests]}
