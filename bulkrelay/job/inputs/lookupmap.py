"""A lookup's key -> value map held compactly: a million keys in ~60 MB instead of a dict's ~175 MB.
A map of more than `COMPACT_ABOVE` entries is held so; a smaller one as a dict (`held`).

A dict holds three objects an entry (the key, the value, the table's slot), ~175 bytes for keys and
values of ~20 characters. Here every key (UTF-8) and value (its JSON bytes) sit one after the other in
one buffer, their offsets in two arrays, and an open-addressing table of entry numbers finds them by
the key's hash: ~60 bytes an entry, no object an entry. A read costs one hash, one slice compared and
one `orjson.loads` of the value (about a microsecond more than a dict's; docs/chains.md "Memory and
speed"). Each read returns a fresh value, so no row can change what the next one reads."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson

_EMPTY = -1
Conflict = Callable[[str, Any, Any], None]  # (key, value kept, value given again): raise to refuse


class CompactMap(Mapping[str, Any]):
    """An immutable map of text keys to JSON values (see the module's docstring)."""

    __slots__ = ("_blob", "_dropped", "_key_ends", "_mask", "_slots", "_starts")

    def __init__(self, pairs: Iterable[tuple[str, Any]], conflict: Conflict | None = None) -> None:
        """The map of `pairs`; a key given again with another value calls `conflict` (else: the first
        value stays)."""
        blob, starts, key_ends = bytearray(), array("Q"), array("Q")
        for key, value in pairs:
            starts.append(len(blob))
            blob += key.encode("utf-8", "surrogatepass")
            key_ends.append(len(blob))
            blob += orjson.dumps(value)
        starts.append(len(blob))  # the end of the last value
        self._blob, self._starts, self._key_ends = blob, starts, key_ends
        capacity = 8
        while capacity < 2 * len(key_ends):  # at most half full: short probes
            capacity *= 2
        self._mask = capacity - 1
        self._slots = array("i", [_EMPTY]) * capacity
        self._dropped: set[int] = set()  # entries whose key an earlier entry holds
        for entry in range(len(key_ends)):
            self._place(entry, conflict)

    def _place(self, entry: int, conflict: Conflict | None) -> None:
        blob, starts, key_ends, slots = self._blob, self._starts, self._key_ends, self._slots
        key = bytes(blob[starts[entry] : key_ends[entry]])
        index = hash(key) & self._mask
        while (other := slots[index]) != _EMPTY:
            if blob[starts[other] : key_ends[other]] == key:
                kept, again = self._value(other), self._value(entry)
                if conflict is not None and kept != again:
                    conflict(key.decode("utf-8", "surrogatepass"), kept, again)
                self._dropped.add(entry)  # the same key again: the first entry stays
                return
            index = (index + 1) & self._mask
        slots[index] = entry

    def _value(self, entry: int) -> Any:
        return orjson.loads(self._blob[self._key_ends[entry] : self._starts[entry + 1]])

    def _find(self, key: str) -> int:
        """The entry of `key`, or -1."""
        data = key.encode("utf-8", "surrogatepass")
        blob, starts, key_ends, slots = self._blob, self._starts, self._key_ends, self._slots
        mask = self._mask
        index = hash(data) & mask
        while (entry := slots[index]) != _EMPTY:
            if blob[starts[entry] : key_ends[entry]] == data:
                return entry
            index = (index + 1) & mask
        return _EMPTY

    def get(self, key: str, default: Any = None) -> Any:
        """The hot path (a lookup leaf's read): `_find` and `_value` written inline."""
        if key.__class__ is not str:
            return default
        data = key.encode("utf-8", "surrogatepass")
        blob, starts, key_ends, slots = self._blob, self._starts, self._key_ends, self._slots
        mask = self._mask
        index = hash(data) & mask
        while (entry := slots[index]) != _EMPTY:
            end = key_ends[entry]
            if blob[starts[entry] : end] == data:
                return orjson.loads(blob[end : starts[entry + 1]])
            index = (index + 1) & mask
        return default

    def __getitem__(self, key: str) -> Any:
        entry = self._find(key) if isinstance(key, str) else _EMPTY
        if entry == _EMPTY:
            raise KeyError(key)
        return self._value(entry)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._find(key) != _EMPTY

    def __len__(self) -> int:
        return len(self._key_ends) - len(self._dropped)

    def __iter__(self) -> Iterator[str]:
        """The keys, in the order first given."""
        for entry, _ in self._entries():
            yield self._blob[self._starts[entry] : self._key_ends[entry]].decode("utf-8", "surrogatepass")

    def pairs(self) -> Iterator[tuple[str, Any]]:
        """(key, value) in the order first given, without a lookup each (what `freeze` writes)."""
        for entry, key in self._entries():
            yield key, self._value(entry)

    def _entries(self) -> Iterator[tuple[int, str]]:
        """The entries the table holds (a key given twice holds its first), in order."""
        blob, starts, key_ends = self._blob, self._starts, self._key_ends
        for entry in range(len(key_ends)):
            if entry not in self._dropped:
                yield entry, blob[starts[entry] : key_ends[entry]].decode("utf-8", "surrogatepass")


COMPACT_ABOVE = 100_000  # entries: a smaller map is a dict (~17 MB at most), its reads ~1 us cheaper


def held(compact: CompactMap) -> Mapping[str, Any]:
    """How a run holds a map: a small one as a dict, a large one as it is."""
    return compact if len(compact) > COMPACT_ABOVE else dict(compact.pairs())


def map_pairs(table: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """A map's (key, value) pairs, a compact map's without a lookup each."""
    return table.pairs() if isinstance(table, CompactMap) else iter(table.items())
