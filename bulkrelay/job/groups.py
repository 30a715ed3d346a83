"""Grouped jobs (`request.group: { by: FIELD }`): consecutive rows with the same value make one request.

A group is a batch whose members the input fixes: the relay forms, sends, journals (one line a row, in
one journal group), resumes and retries it with the batch machinery (relay/batches.py), closing a batch
where the group's value changes instead of at a size. `GroupRenderer` is that machinery's renderer: a
group's URL, headers and body are its first row's, with the `{rows: ...}` leaf's list made of one entry
a row of the group; its idempotency key follows from its rows' keys (`batch_key`). `GroupCheck` is
preflight's: an input whose groups are not consecutive, or a group over `max_group_rows`, is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from bulkrelay.errors import Problem
from bulkrelay.job.batch import BatchRenderer, Item, batch_key
from bulkrelay.job.compression import gzip_request
from bulkrelay.job.config import MAX_BATCH_BYTES, GroupConfig, JobConfig, JsonNode, RowsLeaf
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.job.request import RequestRenderer, RowRequests, json_renderer
from bulkrelay.job.values import ROWS_MARKER

__all__ = ["GroupCheck", "GroupRenderer", "batch_renderer"]

_new_tuple = tuple.__new__


def batch_renderer(
    config: JobConfig, renderer: RequestRenderer, config_fingerprint: str
) -> BatchRenderer | None:
    """The renderer of a job's many-rows requests: a grouped job's, a batch job's, else None."""
    group = config.request.group
    if group is None:
        return BatchRenderer.of_job(config, renderer, config_fingerprint)
    sorted_json = config.execution.sync != "full"
    rows = _rows_node(config.request.json_)
    return GroupRenderer(
        group,
        renderer,
        config_fingerprint,
        config.input.key,
        rows,
        sorted_json=sorted_json,
        nulls=config.request.nulls,
        gzip=config.request.compression == "gzip",
    )


def _rows_node(node: Any) -> JsonNode | None:
    if isinstance(node, RowsLeaf):
        return node.rows
    if isinstance(node, dict):
        for child in node.values():
            if (found := _rows_node(child)) is not None:
                return found
    return None


class GroupRenderer(BatchRenderer):
    """Renders a grouped job's rows into items and each group into its one request."""

    splits = False  # a group's request is never bisected: its rows are one thing to the target

    def __init__(
        self,
        config: GroupConfig,
        renderer: RequestRenderer,
        config_fingerprint: str,
        key_field: str | None,
        rows: JsonNode | None,
        *,
        sorted_json: bool = False,
        nulls: Any = None,
        gzip: bool = False,
    ) -> None:
        # Not BatchRenderer.__init__: a group's URL, headers and frame are its first row's, not constant.
        self.gzip = gzip  # each group's request compressed whole (its value closes it, not its size)
        self.max_items = config.max_group_rows
        self.max_bytes = MAX_BATCH_BYTES
        self.encoding = "json"
        self.group_by = config.by
        self._renderer = renderer
        self._rows = RowRequests(renderer, config_fingerprint, key_field)  # the item id: the row's key
        self._entry = None if rows is None else json_renderer(rows, sorted_json=sorted_json, nulls=nulls)
        self._marker = orjson.dumps(ROWS_MARKER)

    def group_of(self, record: Record) -> bytes:
        return orjson.dumps(record.fields.get(self.group_by))

    def item(self, record: Record) -> Item:
        """The row's entry of its group's list, and the request of a group of this row alone (what its
        idempotency key hashes); raises `RenderError` naming the field that does not fit."""
        data = b"" if self._entry is None else self._entry(record.fields)
        request = self._framed(record, [data])
        return _new_tuple(Item, (record, self._rows.key(record, request), data, request))

    def item_request(self, record: Record) -> PreparedRequest:
        return self.item(record).request

    def size(self, count: int, item_bytes: int) -> int:
        return item_bytes + count + 1  # near enough for the stats: the frame is each group's own

    def meter(self) -> None:
        return None  # a group is not closed by its compressed size (fits_bytes)

    def fits_bytes(self, count: int, item_bytes: int, length: int, max_bytes: int | None = None) -> bool:
        return count < self.max_items  # the group's value closes it (relay/batches.py); preflight its size

    def request(
        self, items: Sequence[Item], delivery: str | None = None, retry: int | None = None
    ) -> tuple[PreparedRequest, str]:
        key = batch_key([item.item_id for item in items], delivery, retry)
        request = self._framed(items[0].record, [item.data for item in items])
        request = self._renderer.with_idempotency_key(request, key)
        return (gzip_request(request) if self.gzip else request), key

    def _framed(self, first: Record, entries: list[bytes]) -> PreparedRequest:
        """The first row's request with the entries as the `{rows: ...}` list."""
        request = self._renderer.render(first)
        head, found, tail = (request.body or b"").partition(self._marker)
        if not found:
            return request  # no rows leaf (or none chosen): the first row's request as it is
        body = head + b"[" + b",".join(entries) + b"]" + tail
        return _new_tuple(PreparedRequest, (request.method, request.url, request.headers, body))


class GroupCheck:
    """Preflight's check of a grouped input: each value's rows are consecutive, and at most
    `max_group_rows` of them. Keeps a 16-byte digest of each finished group's value."""

    def __init__(self, config: GroupConfig, file: str) -> None:
        self._by = config.by
        self._max = config.max_group_rows
        self._file = file
        self._value: bytes | None = None
        self._began = self._last = self._count = 0
        self._ended: dict[bytes, tuple[int, int]] = {}  # a finished group's value -> its first and last row

    def add(self, record: Record) -> Problem | None:
        fields: Mapping[str, Any] = record.fields
        if self._by not in fields:
            return self._problem(record, "missing from the record (request.group.by)")
        value = orjson.dumps(fields[self._by], option=orjson.OPT_SORT_KEYS)
        row = record.row_number
        if value == self._value:
            self._count += 1
            self._last = row
            if self._count == self._max + 1:
                return self._problem(
                    record,
                    f"{_shown(value)}: the group that began at row {self._began} has more than "
                    f"request.group.max_group_rows ({self._max}) rows",
                )
            return None
        if self._value is not None:
            self._ended[_digest(self._value)] = (self._began, self._last)
        self._value, self._began, self._last, self._count = value, row, row, 1
        earlier = self._ended.get(_digest(value))
        if earlier is None:
            return None
        return self._problem(
            record,
            f"{_shown(value)} comes back after another group: its group was rows {earlier[0]}-{earlier[1]}, "
            f"and row {row} is not next to them (sort the input by {self._by})",
        )

    def _problem(self, record: Record, message: str) -> Problem:
        return Problem(message, file=self._file, line=record.line, row=record.row_number, field=self._by)


def _digest(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=16).digest()


def _shown(value: bytes) -> str:
    text = value.decode()
    return text if len(text) <= 40 else f"{text[:37]}..."
