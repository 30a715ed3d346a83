"""A batch job's requests (`request.batch`, docs/batching.md): each row's item, and one request for many.

Built once per job. `item(record)` renders one row's item: its bytes, its stable id (`{meta: item_id}`,
the row's idempotency key: the same across retries, resumes and re-runs of unchanged data) and the row's
part as a delta sync digests it. `size(count, item_bytes)` is the exact size of a body of `count` items
whose bytes add up to `item_bytes`, so a batch can be closed before the item that would cross
`max_bytes` without encoding it first. `request(items)` is the one request for those items, with the
batch's idempotency key (derived from its items' ids) in the configured header.

    json     the body is `[item,item,...]`, alone or at `items_at` inside the envelope
    ndjson   each item is one line (or `item_lines` lines), each line ending with "\\n"
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from bulkrelay.errors import ConfigInvalid, Problem
from bulkrelay.job.compression import CONTENT_ENCODING, GzipMeter, gzip_pieces
from bulkrelay.job.config import (
    MAX_BODY_BYTES,
    BatchConfig,
    ItemNode,
    JobConfig,
    JsonField,
    JsonMeta,
    JsonNode,
    JsonValue,
    Nulls,
)
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.job.request import RenderError, RequestRenderer, RowRequests, json_renderer

__all__ = ["BatchRenderer", "Item", "batch_key"]

# The item id reaches the item's tree as this pseudo-field: no CSV column or JSON key holds a NUL.
_META_FIELD = "\0item_id"
_MARKER = "\0bulkrelay-items\0"  # where the items go in the envelope's encoding (no JSON text holds it)
_BATCH_KEY_SCHEME = b"bulkrelay-batch-v1\0"
_CONTENT_TYPES = {"json": "application/json", "ndjson": "application/x-ndjson"}
_new_tuple = tuple.__new__  # PreparedRequest(...) would go through a Python-level __new__
# What the transport reads of a batch's answer: at least MAX_BODY_BYTES, and this much an item (an
# Elasticsearch _bulk answer is ~190 bytes an item applied, ~400 an item refused with its reason).
ANSWER_BYTES_PER_ITEM = 4096


class Item(NamedTuple):
    """One row's part of a batch. A NamedTuple built with `tuple.__new__` (one is made per row: a frozen
    dataclass cost 0.77 µs, this 0.14)."""

    record: Record
    item_id: str
    data: bytes  # json: one JSON value; ndjson: its line(s), each ending with "\n"
    request: PreparedRequest  # the batch's URL and headers with this item as the body (delta digests it)

    @property
    def row_number(self) -> int:
        return self.record.row_number


def batch_key(item_ids: Sequence[str], delivery: str | None = None, retry: int | None = None) -> str:
    """The idempotency key of a request carrying these items, in this order: 32 hex characters.
    A batch formed again from the same items (after a crash) carries the same key. `delivery` (a delta
    or mirror job's delivering run, as for a row's key: docs/delta.md) scopes it to one delivery, so a
    revert A -> B -> A is sent under a key the target has not answered yet; a `retry-failed` run's
    requests are scoped to that run too (relay/engine.py `_batch_scope`). `retry` numbers a request
    of rows an answer left retryable (store/batchretries.py): under the first request's key, a target
    that keeps keys would replay its answer."""
    digest = hashlib.sha256(_BATCH_KEY_SCHEME)
    if delivery is not None:
        digest.update(delivery.encode() + b"\0\0")
    if retry is not None:
        digest.update(b"retry %d\0\0" % retry)
    for item_id in item_ids:
        digest.update(item_id.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


class BatchRenderer:
    """Renders rows into batch items and items into requests, for one job."""

    splits = True  # a whole-batch 4xx may bisect it (job/groups.py's groups never are)

    def __init__(
        self,
        config: BatchConfig,
        renderer: RequestRenderer,
        config_fingerprint: str,
        key_field: str | None,
        *,
        sorted_json: bool = False,
        gzip: bool = False,
        nulls: Nulls | None = None,
    ) -> None:
        self.gzip = gzip  # request.compression: gzip (job/compression.py)
        self.max_items = config.max_items
        self.max_bytes = config.max_bytes
        self.encoding = config.encoding
        self._renderer = renderer
        self._rows = RowRequests(renderer, config_fingerprint, key_field)  # the item id: the row's key
        nodes = [node for _, node in config.item_nodes()]
        self._lines = tuple(
            json_renderer(_as_json_node(node), sorted_json=sorted_json, nulls=nulls, lookups=renderer.lookups)
            for node in nodes
        )
        self._uses_meta = any(_mentions_meta(node) for node in nodes)
        self._fields = sorted({name for node in nodes for name in _fields_of(node)})
        base = renderer.render(Record(0, 0, {}))  # the URL and headers hold no field in batch mode
        headers = base.headers
        if not any(name.lower() == "content-type" for name, _ in headers):
            headers = (*headers, ("Content-Type", _CONTENT_TYPES[config.encoding]))
        if gzip:
            headers = (*headers, CONTENT_ENCODING)
        self._base = PreparedRequest(base.method, base.url, headers, None)
        self._head, self._tail = _frame(config, sorted_json)
        self._separator = 1 if config.encoding == "json" else 0
        self._framing = len(self._head) + len(self._tail)  # the body's bytes around its items

    @classmethod
    def of_job(
        cls, config: JobConfig, renderer: RequestRenderer, config_fingerprint: str
    ) -> BatchRenderer | None:
        """The job's batch renderer; None when the job sends one row per request."""
        if config.request.batch is None:
            return None
        sorted_json = config.execution.sync != "full"
        gzip = config.request.compression == "gzip"
        return cls(
            config.request.batch,
            renderer,
            config_fingerprint,
            config.input.key,
            sorted_json=sorted_json,
            gzip=gzip,
            nulls=config.request.nulls,
        )

    def group_of(self, record: Record) -> bytes | None:
        """The value whose change closes a batch (a grouped job's, job/groups.py); None: size alone."""
        return None

    @property
    def answer_bytes(self) -> int:
        """The most of an answer the transport reads: sized from the batch, so that the answer of a full
        batch is read whole (a fixed 1 MiB cut an Elasticsearch answer of 5,500 items)."""
        return max(MAX_BODY_BYTES, self.max_items * ANSWER_BYTES_PER_ITEM)

    @property
    def idempotency_header(self) -> str | None:
        return self._renderer.idempotency_header

    def item(self, record: Record) -> Item:
        """The row's item; raises `RenderError` naming the field that does not fit, or the largest field
        when the item alone would make a body over `max_bytes`."""
        base = self._base
        if not self._uses_meta:  # the common case: the item's request is what its id hashes
            data = self._encode(record.fields)
            if self._framing + len(data) > self.max_bytes:  # size(1, len(data)), inline
                raise RenderError(self._largest_field(record.fields), self._too_large(len(data)))
            request = _new_tuple(PreparedRequest, (base.method, base.url, base.headers, data))
            return _new_tuple(Item, (record, self._rows.key(record, request), data, request))
        blank = self._encode({**record.fields, _META_FIELD: ""})
        item_id = self._rows.key(record, PreparedRequest(base.method, base.url, base.headers, blank))
        data = self._encode({**record.fields, _META_FIELD: item_id})
        if self.size(1, len(data)) > self.max_bytes:
            raise RenderError(self._largest_field(record.fields), self._too_large(len(data)))
        return Item(record, item_id, data, PreparedRequest(base.method, base.url, base.headers, data))

    def item_request(self, record: Record) -> PreparedRequest:
        """`item(record).request`, what preflight checks and a delta sync digests, without the item's id
        (a hash a row) unless the item carries it ({meta: item_id}); raises as `item` does."""
        if self._uses_meta:
            return self.item(record).request
        data = self._encode(record.fields)
        if self._framing + len(data) > self.max_bytes:  # size(1, len(data)), inline
            raise RenderError(self._largest_field(record.fields), self._too_large(len(data)))
        base = self._base
        return _new_tuple(PreparedRequest, (base.method, base.url, base.headers, data))

    def size(self, count: int, item_bytes: int) -> int:
        """The encoded body's size for `count` items whose bytes add up to `item_bytes`."""
        return self._framing + item_bytes + self._separator * max(count - 1, 0)

    def fits(self, count: int, item_bytes: int, item: Item) -> bool:
        """Whether `item` may join a batch of `count` items whose bytes add up to `item_bytes`: a batch
        closes before the item that would take it over `max_items` or its body over `max_bytes`."""
        return self.fits_bytes(count, item_bytes, len(item.data))

    def fits_bytes(self, count: int, item_bytes: int, length: int, max_bytes: int | None = None) -> bool:
        """`fits` for an item of `length` bytes; `max_bytes`: a body size a 413 taught, below the job's."""
        if count == 0:
            return True
        if count >= self.max_items:
            return False
        # size(count + 1, item_bytes + length), inline: this runs once a row
        limit = self.max_bytes if max_bytes is None else max_bytes
        return self._framing + item_bytes + length + self._separator * count <= limit

    def meter(self) -> GzipMeter | None:
        """A gzip job's measure of a batch's compressed body (`fits_gzip`); None without compression."""
        return GzipMeter(self._head, self._tail) if self.gzip else None

    def fits_gzip(self, meter: GzipMeter, count: int, data: bytes, max_bytes: int | None = None) -> bool:
        """`fits_bytes` for a gzip job, counted by compressed bytes: the item joins `meter`'s body when
        it does (a batch's first item always does)."""
        if count >= self.max_items and count:
            return False
        piece = b"," + data if count and self._separator else data
        return meter.add_if_fits(piece, self.max_bytes if max_bytes is None else max_bytes, force=not count)

    def request(
        self, items: Sequence[Item], delivery: str | None = None, retry: int | None = None
    ) -> tuple[PreparedRequest, str]:
        """The one request carrying `items`, in order, and its idempotency key (in the configured header,
        if any), scoped to a delta job's `delivery` and numbered by its `retry` (batch_key)."""
        joiner = b"," if self._separator else b""
        if self.gzip:  # the very bytes GzipMeter measured when the batch was formed
            pieces = (joiner + item.data if index else item.data for index, item in enumerate(items))
            body = gzip_pieces(self._head, pieces, self._tail)
        else:
            body = self._head + joiner.join(item.data for item in items) + self._tail
        key = batch_key([item.item_id for item in items], delivery, retry)
        base = self._base
        request = PreparedRequest(base.method, base.url, base.headers, body)
        return self._renderer.with_idempotency_key(request, key), key

    def redact(self, request: PreparedRequest) -> dict[str, Any]:
        return self._renderer.redact(request)

    def _encode(self, fields: Mapping[str, Any]) -> bytes:
        if self.encoding == "json":
            return self._lines[0](fields)
        return b"".join(line(fields) + b"\n" for line in self._lines)

    def _largest_field(self, fields: Mapping[str, Any]) -> str:
        def size(name: str) -> int:
            value = fields.get(name)
            return len(value) if isinstance(value, str) else len(orjson.dumps(value))

        return max(self._fields, key=size) if self._fields else "request.batch.item"

    def _too_large(self, item_bytes: int) -> str:
        alone = self.size(1, item_bytes)
        return (
            f"makes a batch item whose request alone is {alone} bytes, over request.batch.max_bytes "
            f"{self.max_bytes}"
        )


def _frame(config: BatchConfig, sorted_json: bool) -> tuple[bytes, bytes]:
    """The bytes before the first item and after the last: `[` and `]`, around them the envelope."""
    if config.encoding == "ndjson":
        return b"", b""
    if config.items_at is None:
        return b"[", b"]"
    envelope = _constant(config.envelope or {})
    _place(envelope, config.items_at, _MARKER)
    option = orjson.OPT_SORT_KEYS if sorted_json else 0
    text = orjson.dumps(envelope, option=option)
    head, _, tail = text.partition(orjson.dumps(_MARKER))
    return head + b"[", b"]" + tail


def _place(envelope: dict[str, Any], pointer: str, value: Any) -> None:
    tokens = [raw.replace("~1", "/").replace("~0", "~") for raw in pointer[1:].split("/")]
    node = envelope
    for token in tokens[:-1]:
        child = node.setdefault(token, {})
        if not isinstance(child, dict):
            raise _items_at_problem(pointer, f"{token!r} holds a value in the envelope, not an object")
        node = child
    if tokens[-1] in node:
        raise _items_at_problem(pointer, "the envelope already has a value there")
    node[tokens[-1]] = value


def _items_at_problem(pointer: str, why: str) -> ConfigInvalid:
    return ConfigInvalid([Problem(f"request.batch.items_at {pointer}: {why}", path="request.batch.items_at")])


def _constant(node: Mapping[str, ItemNode]) -> dict[str, Any]:
    """The envelope as a value (its leaves are all `{value: ...}`, checked when the job was loaded)."""
    out: dict[str, Any] = {}
    for key, child in node.items():
        if isinstance(child, JsonValue):
            out[key] = child.value
        elif isinstance(child, dict):
            out[key] = _constant(child)
    return out


def _as_json_node(node: ItemNode) -> JsonNode:
    """The item's tree in request.json's grammar: `{meta: item_id}` becomes the item id's pseudo-field."""
    if isinstance(node, JsonMeta):
        return JsonField.model_validate({"from": _META_FIELD})
    if isinstance(node, dict):
        return {key: _as_json_node(child) for key, child in node.items()}
    return node


def _mentions_meta(node: ItemNode) -> bool:
    if isinstance(node, dict):
        return any(_mentions_meta(child) for child in node.values())
    return isinstance(node, JsonMeta)


def _fields_of(node: ItemNode) -> list[str]:
    if isinstance(node, dict):
        return [name for child in node.values() for name in _fields_of(child)]
    return [node.from_] if isinstance(node, JsonField) else []
