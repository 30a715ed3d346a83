"""The loopback target's CRM endpoints, for chains (docs/chains.md, examples/chain/): the target, not
the client, assigns each record's id, and a record that names a parent the target never issued is
refused, as Salesforce and HubSpot refuse a contact whose account does not exist.

    POST .../crm/accounts   {"externalId": ...}                               -> 201 {"id": "acc-N"}
    POST .../crm/contacts   {"externalId": ..., "accountId": ...}             -> 201 {"id": "con-N"}
    POST .../crm/deals      {"externalId": ..., "accountId": ..., "contactId": ...} -> 201 {"id": "deal-N"}

An `accountId` or `contactId` the target did not issue is 422. Creations are counted by kind and
external id (`stats()["crm"]`), so a test sees a record created twice; with the plan's `"dedup": true`
a request whose Idempotency-Key was answered already gets its answer again and creates nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

_KINDS = {"accounts": "acc", "contacts": "con", "deals": "deal"}
_PARENTS = {"accounts": (), "contacts": ("accountId",), "deals": ("accountId", "contactId")}


class CrmEndpoints:
    """Creates records, issuing their ids; refuses a record whose parent id was never issued."""

    def __init__(self) -> None:
        self.issued: dict[str, dict[str, Any]] = {}  # id -> the record as created
        self.created: Counter[tuple[str, str]] = Counter()  # (kind, external id) -> creations
        self.refused = 0
        self.numbers: Counter[str] = Counter()  # ids issued so far, by kind

    @staticmethod
    def handles(path: str) -> bool:
        return (
            path.rstrip("/").rsplit("/", 2)[-2:-1] == ["crm"]
            and path.rstrip("/").rsplit("/", 1)[-1] in _KINDS
        )

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        kind = path.rstrip("/").rsplit("/", 1)[-1]
        try:
            record = orjson.loads(body)
        except orjson.JSONDecodeError:
            return 400, b'{"error":"not JSON"}'
        if not isinstance(record, dict):
            return 400, b'{"error":"not an object"}'
        unknown = [field for field in _PARENTS[kind] if record.get(field) not in self.issued]
        if unknown:
            self.refused += 1
            message = f"{unknown[0]} {record.get(unknown[0])!r} was never issued"
            return 422, orjson.dumps({"error": message})
        self.numbers[kind] += 1
        new_id = f"{_KINDS[kind]}-{self.numbers[kind]}"
        self.issued[new_id] = record
        self.created[kind, str(record.get("externalId"))] += 1
        return 201, orjson.dumps({"id": new_id})

    def stats(self) -> dict[str, Any]:
        by_kind = Counter(kind for kind, _ in self.created.elements())
        twice = sorted(f"{kind}/{external}" for (kind, external), times in self.created.items() if times > 1)
        return {"crm": {"created": dict(by_kind), "created_twice": twice, "refused": self.refused}}
