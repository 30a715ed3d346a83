"""A run's failed rows grouped by status and classification, each with its first examples: what the
`failures` command answers and the run report shows, counted as the journal is streamed (memory grows
with the groups, not the rows). The bodies are the journal's own, redacted before they were written."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bulkrelay.store.journal import JournalEntry


@dataclass(frozen=True)
class FailureExample:
    """One failed row; `key` (its `input.key` value) appears in the envelope only when the job has one."""

    row_number: int
    attempts: int
    error: str | None
    body: str | None
    key: Any = None

    def to_data(self) -> dict[str, Any]:
        data = {
            "row_number": self.row_number,
            "attempts": self.attempts,
            "error": self.error,
            "body": self.body,
        }
        if self.key is not None:
            data["key"] = self.key
        return data


@dataclass(frozen=True)
class FailureGroup:
    """The failed rows of one (status, classification), with a few examples."""

    status_code: int | None
    classification: str
    count: int
    examples: tuple[FailureExample, ...]

    def to_data(self) -> dict[str, Any]:
        return {
            "status_code": self.status_code,
            "classification": self.classification,
            "count": self.count,
            "examples": [example.to_data() for example in self.examples],
        }


EXAMPLES = 3


@dataclass
class FailureTally:
    """A group as the journal is read: counted, with its first examples (`failures`, the run report)."""

    status_code: int | None
    classification: str
    count: int = 0
    examples: list[FailureExample] = field(default_factory=list)

    def add(self, entry: JournalEntry) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(
                FailureExample(
                    row_number=entry.row_number,
                    attempts=entry.attempts,
                    error=entry.error,
                    body=entry.response_body,
                    key=entry.key,
                )
            )

    def result(self) -> FailureGroup:
        return FailureGroup(self.status_code, self.classification, self.count, tuple(self.examples))


def largest_first(groups: Iterable[FailureTally]) -> tuple[FailureGroup, ...]:
    ordered = sorted(groups, key=lambda g: (-g.count, str(g.status_code), g.classification))
    return tuple(group.result() for group in ordered)
