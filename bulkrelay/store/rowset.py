"""A set of row numbers 1..size as a bitset: one bit per row, so a million rows take 125 KB."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

_NOT_FULL = re.compile(rb"[^\xff]")  # bytes with at least one missing row; the regex scan runs in C


class RowSet:
    """Row numbers 1..size. Bit 0 and the padding bits past `size` are kept set, so they never
    show up as missing and a full byte is always 0xFF."""

    __slots__ = ("_bits", "_count", "size")

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"RowSet size must be >= 0, got {size}")
        self.size = size
        self._bits = bytearray(size // 8 + 1)
        self._count = 0
        self._bits[0] |= 1  # row 0 does not exist
        for n in range(size + 1, len(self._bits) * 8):
            self._bits[n >> 3] |= 1 << (n & 7)

    def add(self, row: int) -> bool:
        """Add `row`; True if it was not in the set yet."""
        return self.add_all((row,)) is None

    def add_all(self, rows: Iterable[int]) -> int | None:
        """Add `rows` (a committed batch's, once a batch); the first row that was in the set already
        (the rows after it are not added), or None."""
        bits, size, added = self._bits, self.size, 0
        try:
            for row in rows:
                if not 1 <= row <= size:
                    raise ValueError(f"row {row} is outside 1..{size}")
                index, mask = row >> 3, 1 << (row & 7)
                byte = bits[index]
                if byte & mask:
                    return row
                bits[index] = byte | mask
                added += 1
        finally:
            self._count += added
        return None

    def discard(self, row: int) -> None:
        """Take `row` out of the set, if it is in it (a replay giving back an uncommitted group's rows)."""
        if row in self:
            self._bits[row >> 3] &= ~(1 << (row & 7)) & 0xFF
            self._count -= 1

    def __contains__(self, row: object) -> bool:
        if type(row) is not int or not 1 <= row <= self.size:
            return False
        return bool(self._bits[row >> 3] & (1 << (row & 7)))

    def __len__(self) -> int:
        return self._count

    @property
    def count(self) -> int:
        return self._count

    def highest(self) -> int:
        """The highest row in the set; 0 when it is empty."""
        value = int.from_bytes(self._bits, "little") & ((1 << (self.size + 1)) - 2)  # no bit 0, no padding
        return value.bit_length() - 1 if value else 0

    def missing(self) -> Iterator[int]:
        """The rows not in the set, ascending. Full bytes are skipped without a Python-level step."""
        for match in _NOT_FULL.finditer(self._bits):
            index = match.start()
            byte = match.group()[0]
            base = index << 3
            for bit in range(8):
                if not byte & (1 << bit):
                    yield base + bit

    def missing_by_stripe(self, stripe: int, stripes: int) -> list[int]:
        """How many rows are missing from each of `stripes` interleaved stripes of `stripe` rows (a
        multiple of 8): stripe `i` holds rows `i * stripe + 1` to `(i + 1) * stripe`, then every
        `stripes * stripe` rows on. Counted a byte slice at a time, never a row at a time."""
        if stripe % 8 or stripe <= 0 or stripes <= 0:
            raise ValueError(f"stripes of {stripe} rows: a positive multiple of 8 is needed")
        top = 1 << (len(self._bits) * 8 - 1)  # shifted in empty: past `size`, like the padding, it is set
        rows = ((int.from_bytes(self._bits, "little") >> 1) | top).to_bytes(len(self._bits), "little")
        width, step = stripe // 8, stripe // 8 * stripes  # row r now at bit r - 1: a stripe is whole bytes
        missing = []
        for index in range(stripes):
            parts = [rows[index * width + offset :: step] for offset in range(width)]
            missing.append(sum(8 * len(part) - int.from_bytes(part, "little").bit_count() for part in parts))
        return missing

    def _padding(self) -> int:
        return len(self._bits) * 8 - self.size  # bit 0 and the bits past `size`, always set

    @classmethod
    def _from_int(cls, size: int, value: int) -> RowSet:
        rows = cls(size)
        rows._bits = bytearray(value.to_bytes(len(rows._bits), "little"))
        rows._count = value.bit_count() - rows._padding()
        return rows

    def union(self, other: RowSet) -> RowSet:
        """Rows in either set, computed a machine word at a time rather than a row at a time."""
        if other.size != self.size:
            raise ValueError(f"cannot merge row sets of sizes {self.size} and {other.size}")
        value = int.from_bytes(self._bits, "little") | int.from_bytes(other._bits, "little")
        return RowSet._from_int(self.size, value)

    def complement(self) -> RowSet:
        """Rows not in this set."""
        full = (1 << (len(self._bits) * 8)) - 1
        padding = int.from_bytes(RowSet(self.size)._bits, "little")
        value = (full ^ int.from_bytes(self._bits, "little")) | padding
        return RowSet._from_int(self.size, value)

    def to_bytes(self) -> bytes:
        return bytes(self._bits)

    @classmethod
    def from_bytes(cls, size: int, data: bytes) -> RowSet:
        rows = cls(size)
        if len(data) != len(rows._bits):
            raise ValueError(f"a row set of {size} rows takes {len(rows._bits)} bytes, got {len(data)}")
        return RowSet._from_int(size, int.from_bytes(data, "little") | int.from_bytes(rows._bits, "little"))
