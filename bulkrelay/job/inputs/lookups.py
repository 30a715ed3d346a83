"""`lookups:`: the key -> value maps a job's `{lookup: NAME, key: ..., on_miss: ...}` leaves read.

A map is built once per run by the caller (ops/lookups.py: another job's results, a query) from
(key, value) pairs (`build_map`: a key given twice with two values is refused naming both), frozen as
JSON Lines into the run directory (`{"key": ..., "value": ...}` a line) and read back from there by
`resume` and the identical re-run (`read_frozen`). A large map is held as a `CompactMap`
(job/inputs/lookupmap.py): no object an entry, about a microsecond more a read; a small one as a dict."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from bulkrelay.errors import InputInvalid, Problem
from bulkrelay.job.config import JsonLookup
from bulkrelay.job.digest import key_text
from bulkrelay.job.inputs.lookupmap import CompactMap, held, map_pairs
from bulkrelay.job.inputs.query import json_line
from bulkrelay.job.inputs.results_of import write_frozen
from bulkrelay.job.template import RenderError

LookupMap = Mapping[str, Any]
_MISS = object()


class LookupMissed(RenderError):
    """A row whose key a lookup with `on_miss: skip` lacks: journaled as not sent (`lookup_miss`)."""


def build_map(name: str, pairs: Iterable[tuple[Any, Any]], source: str) -> LookupMap:
    """The map of `pairs` (keys as text); a key given twice with different values is INPUT_INVALID
    naming the lookup, the key and both values."""

    def refuse(key: str, known: Any, value: Any) -> None:
        message = f"lookup {name}: key {key!r} has two values, {known!r} and {value!r} ({source})"
        raise InputInvalid([Problem(message, file=source, field=name)])

    return held(CompactMap(((key_text(key), value) for key, value in pairs), refuse))


def freeze(path: Path, table: Mapping[str, Any]) -> int:
    """`table` as JSON Lines in a new private file `path`, fsynced; its size in entries."""
    return write_frozen(path, _entries(table))


def map_record(table: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's plan records of a map (docs/chains.md): the sha256 of the bytes `freeze` writes of
    it (the frozen file's own digest) and its size in entries."""
    digest = hashlib.sha256()
    for entry in _entries(table):
        digest.update(json_line(entry))
    return {"sha256": digest.hexdigest(), "entries": len(table)}


def _entries(table: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    return ({"key": key, "value": value} for key, value in map_pairs(table))


def read_frozen(path: Path) -> LookupMap:
    """A map frozen by `freeze`."""
    with path.open("rb") as stream:
        return held(CompactMap((entry["key"], entry["value"]) for entry in map(orjson.loads, stream)))


def lookup_getter(
    leaf: JsonLookup, maps: Mapping[str, LookupMap], key_of: Callable[[Any], Any]
) -> Callable[[Any], Any]:
    """The leaf's value for a record's fields: the map's value for its key, else as `on_miss` says
    (fail: the row's error, null: None, skip: `LookupMissed`). A null key finds nothing: it is no
    key, not the text `null` a map may hold."""
    name, on_miss, field = leaf.lookup, leaf.on_miss, leaf.key.from_
    table = maps.get(name)

    def get(fields: Any) -> Any:
        if table is None:
            raise RenderError(field, f"lookup {name} was not built for this call")
        key = key_of(fields)
        value = table.get(key if key.__class__ is str else key_text(key), _MISS) if key is not None else _MISS
        if value is not _MISS:
            return value
        if on_miss == "null":
            return None
        error = LookupMissed if on_miss == "skip" else RenderError
        raise error(field, f"lookup {name} has no key {key_text(key)!r} (on_miss: {on_miss})")

    return get
