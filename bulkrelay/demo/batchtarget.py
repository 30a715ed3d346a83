"""The loopback target's batch endpoints, answering like the four shapes of docs/batching.md.

    POST .../batch/upsert   HubSpot: {"inputs": [...]}; 200, or 207 with `errors[]` naming the failed
                            inputs by the `objectWriteTraceId` they were sent with (context lists them)
    POST .../_bulk          Elasticsearch: NDJSON, an action line ({"index": {"_id": ...}}) and a document
                            line per item; 200 with `items[i].index.status` in request order (an item
                            applied answered with Elasticsearch's fields, ~190 bytes: `_shards`, ...)
    POST .../users/track    Braze: {"attributes": [...]}; 201 with `errors[]` naming failures by `index`
    POST .../batch/array    a plain JSON array; one status for all: 200, 400 when an item is poisoned

An item whose JSON holds `fail_contains` fails alone (HubSpot 207 error, Elasticsearch 400, Braze
error); one holding `retry_contains` gets an item 429 from Elasticsearch the first `retry_times` times
its id is seen; a plain array holding `reject_contains` is refused whole (400); more than `max_items`
items, or a body over `max_body_bytes`, is a 413 everywhere. Every item answered as applied counts in
`items_applied` by its id (HubSpot: `objectWriteTraceId`; Elasticsearch: `_id`; Braze: `external_id`;
array: `id`), so a test sees an item applied twice. The plan's `batch` object sets these options
(`delay_ms`: answer each batch that late, after applying it).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

_JSON = "application/json"


class BatchOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fail_contains: str = "bogus"  # never in a hex id
    retry_contains: str = "busy"
    retry_times: int = Field(default=1, ge=0)
    reject_contains: str = "poison"
    max_items: int = Field(default=1000, ge=1)
    delay_ms: int = Field(default=0, ge=0)  # answer a batch this late (after applying it)
    max_body_bytes: int | None = Field(default=None, ge=1)  # a larger body (as sent) is a 413


class BatchEndpoints:
    """Applies batches and answers them; keeps which items were applied, by id."""

    def __init__(self, options: BatchOptions) -> None:
        self.options = options
        self.applied: Counter[str] = Counter()
        self._retries: Counter[str] = Counter()

    @staticmethod
    def handles(path: str) -> bool:
        return path.endswith(("/batch/upsert", "/_bulk", "/users/track", "/batch/array"))

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, JSON body) for a batch request to `path`."""
        limit = self.options.max_body_bytes
        if limit is not None and len(body) > limit:
            return 413, orjson.dumps({"error": f"{len(body)} bytes, at most {limit}"})
        try:
            if path.endswith("/_bulk"):
                return self._bulk(body)
            document = orjson.loads(body)
            if path.endswith("/batch/upsert"):
                return self._upsert(document["inputs"])
            if path.endswith("/users/track"):
                return self._track(document["attributes"])
            return self._array(document)
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError) as exc:
            return 400, orjson.dumps({"error": f"malformed batch: {exc}"})

    def stats(self) -> dict[str, Any]:
        return {
            "items_applied": sum(self.applied.values()),
            "distinct_items_applied": len(self.applied),
            "items_applied_twice": sorted(item for item, times in self.applied.items() if times > 1),
        }

    def _too_many(self, count: int) -> tuple[int, bytes] | None:
        if count > self.options.max_items:
            return 413, orjson.dumps({"error": f"{count} items, at most {self.options.max_items}"})
        return None

    def _has(self, item: Any, word: str) -> bool:
        return bool(word) and word.encode() in orjson.dumps(item)

    def _upsert(self, inputs: list[Any]) -> tuple[int, bytes]:
        if (refused := self._too_many(len(inputs))) is not None:
            return refused
        results, errors = [], []
        for item in inputs:
            trace = item.get("objectWriteTraceId")
            if self._has(item, self.options.fail_contains):
                errors.append({
                    "status": "error",
                    "category": "VALIDATION_ERROR",
                    "message": f"Property values were not valid: {item.get('id')}",
                    "context": {"objectWriteTraceId": [trace]},
                })  # fmt: skip
                continue
            self.applied[str(trace)] += 1
            results.append({"id": str(len(self.applied)), "objectWriteTraceId": trace})
        answer = {"status": "COMPLETE", "results": results}
        if errors:
            answer["errors"] = errors
        return (207 if errors else 200), orjson.dumps(answer)

    def _bulk(self, body: bytes) -> tuple[int, bytes]:
        lines = [line for line in body.split(b"\n") if line.strip()]
        if len(lines) % 2:
            return 400, orjson.dumps({"error": "an action line without its document"})
        pairs = [(orjson.loads(lines[n]), orjson.loads(lines[n + 1])) for n in range(0, len(lines), 2)]
        if (refused := self._too_many(len(pairs))) is not None:
            return refused
        items, failed = [], False
        for action, document in pairs:
            item_id = str(action["index"]["_id"])
            status, error = 201, None
            if self._has(document, self.options.fail_contains):
                status, error = 400, {"type": "mapper_parsing_exception", "reason": "failed to parse"}
            elif self._has(document, self.options.retry_contains) and self._retries[item_id] < (
                self.options.retry_times
            ):
                self._retries[item_id] += 1
                status, error = 429, {"type": "es_rejected_execution_exception", "reason": "queue full"}
            else:
                self.applied[item_id] += 1
            failed = failed or error is not None
            entry: dict[str, Any] = {"_index": "customers", "_type": "_doc", "_id": item_id, "status": status}
            if error is not None:
                entry["error"] = error
            else:  # as Elasticsearch answers an item applied: some 190 bytes of JSON
                entry |= {"_version": 1, "result": "created", "_seq_no": len(self.applied) - 1}
                entry |= {"_shards": {"total": 2, "successful": 1, "failed": 0}, "_primary_term": 1}
            items.append({"index": entry})
        return 200, orjson.dumps({"took": 1, "errors": failed, "items": items})

    def _track(self, attributes: list[Any]) -> tuple[int, bytes]:
        if (refused := self._too_many(len(attributes))) is not None:
            return refused
        errors = []
        for index, item in enumerate(attributes):
            if self._has(item, self.options.fail_contains):
                errors.append(
                    {"type": "'email' is not a valid email", "input_array": "attributes", "index": index}
                )
            else:
                self.applied[str(item.get("external_id"))] += 1
        return 201, orjson.dumps(
            {"message": "success", "attributes_processed": len(attributes), "errors": errors}
        )

    def _array(self, items: list[Any]) -> tuple[int, bytes]:
        if (refused := self._too_many(len(items))) is not None:
            return refused
        if any(self._has(item, self.options.reject_contains) for item in items):
            return 400, orjson.dumps({"error": "one of the items is invalid"})
        for item in items:
            self.applied[str(item.get("id"))] += 1
        return 200, orjson.dumps({"accepted": len(items)})
