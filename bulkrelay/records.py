"""The two values that flow through the pipeline: a record read from the input, and its request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Record(NamedTuple):
    """One input record. `row_number` counts records from 1; `line` is where it starts in the source file.

    A NamedTuple rather than a frozen dataclass: one is built per row, and tuples build fastest.
    """

    row_number: int
    line: int
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """Exactly what goes on the wire for one row (secrets already substituted)."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes | None
