"""`failures RUN`: a run's failed rows at a glance, grouped by status and classification.

Each group has its count and up to `EXAMPLES` example rows with their error and failure body.
The bodies are the journal's own, which were redacted before they were written (see `response.py`),
so nothing here can show a secret. The journal is streamed once; memory grows with the groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bulkrelay.envelope import Result
from bulkrelay.store.journal import JournalEntry, read_journal
from bulkrelay.store.rundir import RunDir

EXAMPLES = 3


@dataclass
class _Group:
    status_code: int | None
    classification: str
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def add(self, entry: JournalEntry) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append(
                {
                    "row_number": entry.row_number,
                    "attempts": entry.attempts,
                    "error": entry.error,
                    "body": entry.response_body,
                }
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "status_code": self.status_code,
            "classification": self.classification,
            "count": self.count,
            "examples": self.examples,
        }


def _failed_entries(journal: Path) -> Iterator[JournalEntry]:
    """The committed failed entries, in journal order (a run records each row once)."""
    return (entry for entry in read_journal(journal) if not entry.success)


def failures(run_dir: Path) -> Result:
    """The failed rows of one run, grouped by (status_code, classification), largest group first."""
    run = RunDir.open(run_dir)
    groups: dict[tuple[int | None, str], _Group] = {}
    failed = 0
    for entry in _failed_entries(run.journal_path):
        failed += 1
        key = (entry.status_code, entry.classification)
        groups.setdefault(key, _Group(*key)).add(entry)
    ordered = sorted(groups.values(), key=lambda g: (-g.count, str(g.status_code), g.classification))
    data = {
        "run_id": run.run_id,
        "run_dir": str(run.path),
        "state": run.state,
        "failed": failed,
        "groups": [group.to_dict() for group in ordered],
    }
    return Result(data=data, kind="failures")
