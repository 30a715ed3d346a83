"""The two values that flow through the pipeline: a record read from the input, and its request."""

from __future__ import annotations

from typing import Any, NamedTuple


class Record(NamedTuple):
    """One input record. `row_number` counts records from 1; `line` is where it starts in the source file.

    A NamedTuple rather than a frozen dataclass: one is built per row, and tuples build fastest.
    """

    row_number: int
    line: int
    fields: dict[str, Any]


class PreparedRequest(NamedTuple):
    """Exactly what goes on the wire for one row (secrets already substituted). A NamedTuple, like
    `Record`: preflight builds one per row."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes | None


def row_identity(record: Record, key_field: str | None) -> str:
    """What names a row across runs: its `input.key` value, else its row number."""
    if key_field is not None:
        return f"key:{record.fields.get(key_field)}"
    return f"row:{record.row_number}"
