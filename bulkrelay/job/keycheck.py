"""Duplicate `input.key` values, found in memory that does not grow with the input.

The first pass puts each key value into a blocked Bloom filter: 16 MiB of 64-bit words; a value's
hash picks one word and a pattern of up to eight bits in it (two 4-bit patterns from small tables,
so setting or testing them is one word read, one OR and one compare). A value whose bits are all
set already *may* have been seen, and joins a small set of candidates. Only when there are
candidates does a second pass over the input count them exactly, so every reported duplicate is
real and names the row where the value first appeared. The second pass stops after the last row
that made a candidate: every repeat of a value is a candidate row, and its first row comes before.
Measured false candidates per run: about 0.1 with 600k distinct keys, about 1 with a million (the
former filter, three bits anywhere in the same 16 MiB, expected 1.4 and 11).

Keys that come in increasing order (an input sorted by its key) skip the filter altogether until
the first one out of order; see `DuplicateKeyFinder._add_function`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable
from functools import cache
from typing import Any

from bulkrelay.errors import Problem
from bulkrelay.job.inputs import InputSpec, open_records
from bulkrelay.job.records import Record

_MASK = (1 << 21) - 1  # 2**21 words of 64 bits = 16 MiB; a value's word is its hash & _MASK
_PATTERN_BITS = 12  # each table holds 2**12 patterns, picked by 12 bits of the hash above the word's
_BITS_PER_PATTERN = 4


def _already_reported(problem: Problem) -> None:
    """Bad records were reported by the first pass; the second pass only skips them."""


def _key_text(value: Any) -> str | None:
    if value is None:
        return None
    text = value if type(value) is str else str(value)
    return text or None


@cache
def _patterns(salt: bytes) -> array[int]:
    """2**_PATTERN_BITS words with _BITS_PER_PATTERN distinct bits set, the same in every process.
    An array, not a tuple of ints: 32 KiB in one piece, so a look-up costs one cache line."""
    stream = iter(hashlib.shake_128(salt).digest(1 << (_PATTERN_BITS + 4)))
    patterns = []
    for _ in range(1 << _PATTERN_BITS):
        bits: set[int] = set()
        while len(bits) < _BITS_PER_PATTERN:
            bits.add(next(stream) & 63)
        patterns.append(sum(1 << bit for bit in bits))
    return array("Q", patterns)


_Filter = tuple[memoryview, "array[int]", "array[int]"]  # the words, the low and the high patterns


def _new_filter() -> _Filter:
    """An empty filter: `_MASK + 1` words of zero bits, and the two pattern tables."""
    words = memoryview(bytearray(8 * (_MASK + 1))).cast("Q")
    return words, _patterns(b"bulkrelay keycheck low"), _patterns(b"bulkrelay keycheck high")


def _no_filter() -> _Filter:
    """Stands for the filter while keys come in order: never read."""
    return memoryview(b"").cast("Q"), array("Q"), array("Q")


class DuplicateKeyFinder:
    add: Callable[[Record], Problem | None]  # note one record's key (see `_add_function`)

    def __init__(self, field: str, file: str, spec: InputSpec | None = None) -> None:
        """`spec` (the input being read) allows the in-order shortcut: see `_add_function`."""
        self.field = field
        self._file = file
        self._spec = spec
        self._candidates: set[str] = set()
        self._last_candidate_row = 0
        self.add = self._add_function()

    def _add_function(self) -> Callable[[Record], Problem | None]:
        """`add`: note one record's key; a problem only when the key is missing or empty. A closure
        over the filter's parts: it runs once per row, the slowest step of a keyed preflight.

        Many inputs come sorted by their key (an export ordered by id). While every key is greater
        than the one before (shorter keys first, then by text: "9" < "10"), no two can be equal, so
        they need not enter the filter at all. The first key out of order puts every earlier row's
        key into the filter (one read of those rows again) and the finder carries on as a filter.
        The filter is made only then: a sorted input never pays its 16 MiB nor its tables."""
        field, mask, candidates = self.field, _MASK, self._candidates
        in_order = self._spec is not None
        words, low, high = _no_filter() if in_order else _new_filter()
        top, top_length = "", 0  # the greatest key so far, while in order

        def add(record: Record) -> Problem | None:
            nonlocal in_order, top, top_length, words, low, high
            text = record.fields.get(field)
            if type(text) is not str or not text:
                text = _key_text(text)
                if text is None:
                    return self._problem(record, "the key field is missing or empty")
            if in_order:
                length = len(text)
                if length > top_length or (length == top_length and text > top):
                    top, top_length = text, length
                    return None
                in_order = False
                words, low, high = _new_filter()
                self._fill_in(add, record.row_number)
            digest = hash(text)
            pattern = low[(digest >> 21) & 4095] | high[(digest >> 33) & 4095]
            index = digest & mask
            word = words[index]
            if word & pattern == pattern:
                candidates.add(text)
                self._last_candidate_row = record.row_number
            else:
                words[index] = word | pattern
            return None

        return add

    def _fill_in(self, add: Callable[[Record], Problem | None], row_number: int) -> None:
        """Put the keys of the rows before `row_number`, read again, into the filter (`add` no longer
        takes the in-order shortcut). Their problems were reported when they were first read."""
        assert self._spec is not None  # the shortcut is only taken with a spec
        with open_records(self._spec, _already_reported) as stream:
            for record in stream:
                if record.row_number >= row_number:
                    break
                add(record)

    def duplicates(self, spec: InputSpec) -> list[Problem]:
        """The second pass: every real duplicate among the candidates, with the row it repeats."""
        if not self._candidates:
            return []
        first_rows: dict[str, int] = {}
        problems: list[Problem] = []
        with open_records(spec, _already_reported) as stream:
            for record in stream:
                if record.row_number > self._last_candidate_row:
                    break
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
