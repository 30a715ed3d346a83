"""Duplicate `input.key` values, found in memory that does not grow with the input.

The first pass puts each key value into a Bloom filter (16 MiB; three probes cut from one 64-bit
hash); a value whose probes are all set already *may* have been seen, and joins a small set of
candidates. Only when there are
candidates does a second pass over the input count them exactly, so every reported duplicate is
real and names the row where the value first appeared. With a million keys, about ten values are
false candidates: the second pass reads the input again, but holds only the candidates in memory.
"""

from __future__ import annotations

from typing import Any

from bulkrelay.errors import Problem
from bulkrelay.job.inputs import InputSpec, open_records
from bulkrelay.job.records import Record

_BITS_LOG2 = 27  # 2**27 bits = 16 MiB
_MASK = (1 << _BITS_LOG2) - 1
_SHIFTS = (0, 18, 37)  # three windows of the 64-bit hash, each _BITS_LOG2 wide


def _already_reported(problem: Problem) -> None:
    """Bad records were reported by the first pass; the second pass only skips them."""


def _key_text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if type(value) is str else str(value)
    return text or None


class DuplicateKeyFinder:
    def __init__(self, field: str, file: str) -> None:
        self.field = field
        self._file = file
        self._bits = bytearray(max(1, (_MASK + 1) >> 3))
        self._candidates: set[str] = set()

    def add(self, record: Record) -> Problem | None:
        """Note one record's key; a problem only when the key is missing or empty."""
        text = _key_text(record.fields.get(self.field))
        if text is None:
            return self._problem(record, "the key field is missing or empty")
        # Three probes from one hash: the slowest part of a keyed preflight, so kept inline and short.
        digest, bits, seen = hash(text), self._bits, True
        for shift in _SHIFTS:
            index = (digest >> shift) & _MASK
            byte, mask = index >> 3, 1 << (index & 7)
            if not bits[byte] & mask:
                seen = False
                bits[byte] |= mask
        if seen:
            self._candidates.add(text)
        return None

    def duplicates(self, spec: InputSpec) -> list[Problem]:
        """The second pass: every real duplicate among the candidates, with the row it repeats."""
        if not self._candidates:
            return []
        first_rows: dict[str, int] = {}
        problems: list[Problem] = []
        with open_records(spec, _already_reported) as stream:
            for record in stream:
                text = _key_text(record.fields.get(self.field))
                if text is None or text not in self._candidates:
                    continue
                first = first_rows.setdefault(text, record.row_number)
                if first != record.row_number:
                    problems.append(
                        self._problem(record, f"duplicate key value {text!r} (first at row {first})")
                    )
        return problems

    def _problem(self, record: Record, message: str) -> Problem:
        return Problem(message, file=self._file, line=record.line, row=record.row_number, field=self.field)
