"""The loopback target's named-import API, answering like HubSpot CRM imports (one request submits).

    POST .../crm/v3/imports               multipart: importRequest (JSON, its `name`) and the CSV file ->
                                          {"id": "…", "state": "STARTED"}; the rows are processed now
    GET  .../crm/v3/imports               {"results": [{id, importName, state}], "paging"} (page_size a page)
    GET  .../crm/v3/imports/{id}          its state: STARTED, then PROCESSING, then DONE after
                                          `polls_to_complete` polls (FAILED for a failed import)
    POST .../crm/v3/imports/{id}/cancel   CANCELED
    GET  .../crm/v3/imports/{id}/errors   {"results": [{errorType, invalidValue, sourceData: {rowData,
                                          lineNumber}}]}, shuffled

The plan's `imports` object sets the options: a row whose key cell holds `fail_contains` is an error;
every `fail_import_every`-th import is FAILED; `stuck` keeps imports PROCESSING; `hostile_errors:
unknown_key` adds an error for a key never sent; `delay_ms` answers each request that late, after acting
on it (a kill lands between the two). The key column is `key_column` (else the first). Stats count
imports and `import_rows_in_two_imports`: keys processed by more than one import (a relay that
submitted twice).
"""

from __future__ import annotations

import csv
import io
import random
from collections import Counter
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

_IMPORTS = "/crm/v3/imports"


class ImportOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key_column: str | None = None
    fail_contains: str = "bogus"
    fail_import_every: int = Field(default=0, ge=0)  # 0: no import fails
    polls_to_complete: int = Field(default=2, ge=1)
    stuck: bool = False
    hostile_errors: Literal["unknown_key"] | None = None
    page_size: int = Field(default=3, ge=1)  # imports a list page: the relay follows paging.next.after
    delay_ms: int = Field(default=0, ge=0)


@dataclass(slots=True)
class _Import:
    id: str
    name: str
    state: str = "STARTED"
    polls: int = 0
    failed: bool = False
    errors: list[dict[str, Any]] = field(default_factory=list)


class NamedImports:
    """Imports: submitted (and processed) at once, listed by name, polled, their errors fetched."""

    def __init__(self, options: ImportOptions) -> None:
        self.options = options
        self._imports: dict[str, _Import] = {}
        self.processed: Counter[str] = Counter()  # keys processed, by imports that ran
        self.fates: Counter[str] = Counter()

    @staticmethod
    def handles(path: str) -> bool:
        return _IMPORTS in path

    def stats(self) -> dict[str, Any]:
        return {
            "imports": dict(sorted({"submitted": len(self._imports), **self.fates}.items())),
            "import_rows_processed": sum(self.processed.values()),
            "import_rows_in_two_imports": sum(1 for times in self.processed.values() if times > 1),
        }

    def answer(
        self, method: str, path: str, query: str, body: bytes, content_type: str
    ) -> tuple[int, bytes, str]:
        """(status, body, content type) for a request to the imports API."""
        tail = path[path.index(_IMPORTS) + len(_IMPORTS) :].strip("/")
        if not tail:
            if method == "POST":
                return self._submit(body, content_type)
            return self._list(query) if method == "GET" else _error(405, "GET or POST")
        import_id, _, step = tail.partition("/")
        found = self._imports.get(import_id)
        if found is None:
            return _error(404, f"no import {import_id}")
        if step == "cancel" and method == "POST":
            if found.state in ("STARTED", "PROCESSING"):
                found.state = "CANCELED"
                self.fates["canceled"] += 1
            return 200, orjson.dumps({"id": found.id, "state": found.state}), "application/json"
        if not step and method == "GET":
            return self._poll(found)
        if step == "errors" and method == "GET":
            return 200, orjson.dumps({"results": found.errors}), "application/json"
        return _error(404, f"no {method} {path}")

    def _submit(self, body: bytes, content_type: str) -> tuple[int, bytes, str]:
        parts = _multipart(body, content_type)
        if "importRequest" not in parts or "files" not in parts:
            return _error(400, "a multipart body with importRequest and files")
        name = orjson.loads(parts["importRequest"]).get("name")
        found = _Import(f"{len(self._imports) + 1:08d}", str(name))
        self._imports[found.id] = found
        every = self.options.fail_import_every
        if every and len(self._imports) % every == 0:
            found.failed = True
        else:
            self._process(found, parts["files"])
        return 200, orjson.dumps({"id": found.id, "state": found.state}), "application/json"

    def _process(self, found: _Import, data: bytes) -> None:
        reader = csv.reader(io.StringIO(data.decode("utf-8", "replace"), newline=""))
        header = next(reader, [])
        key = header.index(self.options.key_column) if self.options.key_column in header else 0
        for line, cells in enumerate(reader, start=2):
            self.processed[cells[key]] += 1
            if self.options.fail_contains in cells[key]:
                found.errors.append(_row_error(cells, line, f"bad value in {cells[key]}"))
        if self.options.hostile_errors == "unknown_key":
            found.errors.append(_row_error(["never-sent", *header[1:]], 999, "a row never sent"))
        random.Random(found.id).shuffle(found.errors)

    def _list(self, query: str) -> tuple[int, bytes, str]:
        start = int(query.partition("after=")[2] or 0) if "after=" in query else 0
        items = list(self._imports.values())[start : start + self.options.page_size]
        page: dict[str, Any] = {
            "results": [{"id": i.id, "importName": i.name, "state": i.state} for i in items]
        }
        if start + self.options.page_size < len(self._imports):
            page["paging"] = {"next": {"after": str(start + self.options.page_size)}}
        return 200, orjson.dumps(page), "application/json"

    def _poll(self, found: _Import) -> tuple[int, bytes, str]:
        if found.state in ("STARTED", "PROCESSING") and not self.options.stuck:
            found.polls += 1
            found.state = "PROCESSING"
            if found.polls >= self.options.polls_to_complete:
                found.state = "FAILED" if found.failed else "DONE"
                self.fates["failed" if found.failed else "done"] += 1
        return 200, orjson.dumps({"id": found.id, "state": found.state}), "application/json"


def _row_error(cells: list[str], line: int, message: str) -> dict[str, Any]:
    out = io.StringIO(newline="")
    csv.writer(out, lineterminator="").writerow(cells)
    row = {"rowData": out.getvalue(), "lineNumber": line}
    return {"errorType": "INVALID_PROPERTY_VALUE", "invalidValue": message, "sourceData": row}


def _multipart(body: bytes, content_type: str) -> dict[str, bytes]:
    """The parts of a multipart/form-data body, by name."""
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    parts: dict[str, bytes] = {}
    for part in message.iter_parts() if message.is_multipart() else ():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            parts[name] = payload
    return parts


def _error(status: int, message: str) -> tuple[int, bytes, str]:
    return status, orjson.dumps({"status": "error", "message": message}), "application/json"
