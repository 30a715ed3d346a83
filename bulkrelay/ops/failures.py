"""`failures RUN`: a run's failed rows at a glance, grouped by status and classification.

Each group has its count and up to `EXAMPLES` example rows with their error and failure body.
The bodies are the journal's own, which were redacted before they were written (see `response.py`),
so nothing here can show a secret. The journal is streamed once; memory grows with the groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bulkrelay.envelope import Result
from bulkrelay.ops.damage import check_committed_journal
from bulkrelay.ops.results import FailuresResult
from bulkrelay.report.failuregroups import FailureTally, largest_first
from bulkrelay.store.journal import JournalEntry, read_journal
from bulkrelay.store.rundir import RunDir


def _failed_entries(journal: Path) -> Iterator[JournalEntry]:
    """The committed failed entries, in journal order (a run records each row once)."""
    return (entry for entry in read_journal(journal) if not entry.success)


def failures(run_dir: Path) -> Result:
    """The failed rows of one run, grouped by (status_code, classification), largest group first."""
    run = RunDir.open(run_dir)
    check_committed_journal(run, "failures")
    groups: dict[tuple[int | None, str], FailureTally] = {}
    failed = 0
    for entry in _failed_entries(run.journal_path):
        failed += 1
        key = (entry.status_code, entry.classification)
        groups.setdefault(key, FailureTally(*key)).add(entry)
    groups_found = largest_first(groups.values())
    return Result(data=FailuresResult(run.run_id, str(run.path), run.state, failed, groups_found))
