"""`input.results_of`: another job's results as this job's records, and the frozen files (a chained
job's snapshot, a lookup's map) that a run keeps of what it read.

A record is the parent's input fields (when its input is still there as it read it), then `key` (the
parent row's key, or its row number) and `captured` (what the parent captured from the target's
answer). The journals are read by the caller (`ops/`): this module knows no run directory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from bulkrelay.job.inputs.query import json_line, write_private


def wanted(success: bool, where: str | None) -> bool:
    """Whether a parent row whose outcome is `success` is a record under `where` (None: success)."""
    return where == "all" or success == (where in (None, "success"))


def chain_record(
    fields: Mapping[str, Any] | None, key: str, captured: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A chained job's record: the parent's input fields, its key and its captured values. A parent
    field named `key` or `captured` is overridden by the parent row's own (docs/chains.md)."""
    return {**(fields or {}), "key": key, "captured": dict(captured or {})}


def write_frozen(dest: Path, records: Iterable[Mapping[str, Any]]) -> int:
    """`records` as JSON Lines in a new private (0600) file `dest`, fsynced; the count."""

    def write(out: BinaryIO) -> int:
        count = 0
        for count, record in enumerate(records, 1):  # noqa: B007 - the count is returned
            out.write(json_line(record))
        return count

    return write_private(dest, write)
