"""The loopback target's batch-operations API, answering like Mailchimp's `/3.0/batches`: a batch of
operations runs as one asynchronous job, and its per-operation results are a gzip'd tar of JSON files.

    POST .../3.0/batches                  {"operations": [{method, path, operation_id, body}]} -> {"id",
                                          "status": "pending", "total_operations"}: it runs now
                                          (as Mailchimp's does). Without operations (`{}`), the batch waits
                                          for them: {"id", "status": "open"} (a demo extension, for a
                                          client that makes the job before its data leaves)
    PUT  .../3.0/batches/{id}/operations  the open batch's operations ({"operations": [...]} or the list),
                                          once; it runs now
    DELETE .../3.0/batches/{id}           an open batch is cancelled (status "canceled")
    GET  .../3.0/batches/{id}             its status: pending, started, then finished after
                                          `polls_to_complete` polls, with `response_body_url` (absolute, on
                                          this target, or `archive_origin`), `finished_operations` and
                                          `errored_operations`
    GET  .../3.0/batch-archives/{id}.tar.gz   the results: a tar.gz of JSON files (`members_size`
                                          operations each, shuffled), each an array of {"operation_id",
                                          "status_code", "response"} (the response a JSON string)

The plan's `batch_ops` object sets the options: an operation whose operation_id holds `fail_contains`
answers 400 (`{"title": "Invalid Resource", "detail": ...}`); one holding `server_error_contains` 500;
`hostile_archive` spoils the archive (`truncated`: cut short; `corrupt`: bytes flipped mid-stream;
`not_json`: a member that is not JSON; `unknown_key`: an operation never sent; `bomb`: a member of
`bomb_bytes` zeros; `many_members`: `members_size` empty files, 1 operation each). `delay_ms` answers each
request that late, after acting on it (a kill lands between the two). Stats count batches by fate and
`batch_ops_in_two_batches`: operation ids run by more than one batch (a relay that submitted twice).
"""

from __future__ import annotations

import gzip
import io
import random
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

_BATCHES = "/3.0/batches"
_Spoiled = Literal["truncated", "corrupt", "not_json", "unknown_key", "bomb", "many_members"]
_ARCHIVES = "/3.0/batch-archives/"


class BatchOpsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fail_contains: str = "bogus"
    server_error_contains: str = "broken"
    polls_to_complete: int = Field(default=2, ge=1)
    members_size: int = Field(default=2, ge=1)  # operations a JSON file of the archive
    hostile_archive: _Spoiled | None = None
    bomb_bytes: int = Field(default=8 << 20, ge=1)
    archive_origin: str | None = None  # response_body_url's scheme://host:port (None: this target's)
    delay_ms: int = Field(default=0, ge=0)


@dataclass(slots=True)
class _Batch:
    id: str
    status: str = "pending"
    operations: list[dict[str, Any]] = field(default_factory=list)
    polls: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)


class BatchOperations:
    """Batches: created (with their operations, or open for them), run, polled, their archive served."""

    def __init__(self, options: BatchOpsOptions) -> None:
        self.options = options
        self._batches: dict[str, _Batch] = {}
        self.processed: Counter[str] = Counter()  # operation ids run, by batches that ran
        self.fates: Counter[str] = Counter()

    @staticmethod
    def handles(path: str) -> bool:
        return _BATCHES in path or _ARCHIVES in path

    def stats(self) -> dict[str, Any]:
        return {
            "batch_ops": dict(sorted({"created": len(self._batches), **self.fates}.items())),
            "batch_ops_processed": sum(self.processed.values()),
            "batch_ops_in_two_batches": sum(1 for times in self.processed.values() if times > 1),
        }

    def answer(self, method: str, path: str, body: bytes, origin: str) -> tuple[int, bytes, str]:
        """(status, body, content type) for a request to the batches API; `origin` is this target's
        scheme://host:port, for the archive's absolute URL."""
        if _ARCHIVES in path and method == "GET":
            found = self._batches.get(path.rsplit("/", 1)[-1].removesuffix(".tar.gz"))
            if found is None or found.status != "finished":
                return _error(404, "no such archive")
            return 200, self._archive(found), "application/x-gzip"
        tail = path[path.index(_BATCHES) + len(_BATCHES) :].strip("/")
        if not tail:
            return self._create(body) if method == "POST" else _error(405, "POST to create a batch")
        batch_id, _, step = tail.partition("/")
        found = self._batches.get(batch_id)
        if found is None:
            return _error(404, f"no batch {batch_id}")
        if step == "operations" and method == "PUT":
            if found.status != "open":
                return _error(409, f"batch {found.id} takes its operations once, while open")
            return self._start(found, _operations(orjson.loads(body)))
        if not step and method == "DELETE" and found.status == "open":
            found.status = "canceled"
            self.fates["canceled"] += 1
            return 204, b"", "application/json"
        if not step and method == "GET":
            return self._poll(found, origin)
        return _error(404, f"no {method} {path}")

    def _create(self, body: bytes) -> tuple[int, bytes, str]:
        operations = _operations(orjson.loads(body or b"{}"))
        found = _Batch(f"mc{len(self._batches) + 1:08d}", status="open")
        self._batches[found.id] = found
        if operations:
            return self._start(found, operations)
        return 200, orjson.dumps({"id": found.id, "status": found.status}), "application/json"

    def _start(self, found: _Batch, operations: list[dict[str, Any]]) -> tuple[int, bytes, str]:
        """The batch runs: each operation answered now (400 for fail_contains, 500 for
        server_error_contains, else 200), the results shuffled."""
        found.status, found.operations = "pending", operations
        for operation in operations:
            op_id = str(operation.get("operation_id", ""))
            self.processed[op_id] += 1
            if self.options.fail_contains in op_id:
                detail = {"title": "Invalid Resource", "status": 400, "detail": f"bad value in {op_id}"}
                found.results.append(_result(op_id, 400, detail))
            elif self.options.server_error_contains in op_id:
                found.results.append(_result(op_id, 500, {"title": "Internal Server Error", "status": 500}))
            else:
                found.results.append(_result(op_id, 200, {"id": f"m-{op_id}", "status": "subscribed"}))
        if self.options.hostile_archive == "unknown_key":
            found.results.append(_result("never-sent", 200, {"id": "m-never-sent"}))
        random.Random(found.id).shuffle(found.results)
        answer = {"id": found.id, "status": found.status, "total_operations": len(operations)}
        return 200, orjson.dumps(answer), "application/json"

    def _poll(self, found: _Batch, origin: str) -> tuple[int, bytes, str]:
        if found.status in ("pending", "started"):
            found.polls += 1
            found.status = "started"
            if found.polls >= self.options.polls_to_complete:
                found.status = "finished"
                self.fates["finished"] += 1
        answer: dict[str, Any] = {"id": found.id, "status": found.status}
        if found.status == "finished":
            errored = sum(1 for result in found.results if result["status_code"] >= 400)
            answer |= {
                "total_operations": len(found.operations),
                "finished_operations": len(found.results),
                "errored_operations": errored,
                "response_body_url": f"{self.options.archive_origin or origin}{_ARCHIVES}{found.id}.tar.gz",
            }
        return 200, orjson.dumps(answer), "application/json"

    def _archive(self, found: _Batch) -> bytes:
        """The batch's results as a tar.gz of JSON files, `members_size` results each (spoiled as the
        plan says)."""
        hostile = self.options.hostile_archive
        size = self.options.members_size
        members = [orjson.dumps(found.results[i : i + size]) for i in range(0, len(found.results), size)]
        if hostile == "not_json":
            members.insert(1, b"<html>not json</html>")
        if hostile == "bomb":
            members.append(bytes(self.options.bomb_bytes))
        if hostile == "many_members":
            members += [b"[]"] * size
        out = io.BytesIO()
        with (
            gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as packed,
            tarfile.open(fileobj=packed, mode="w") as tar,
        ):
            for number, data in enumerate(members, start=1):
                info = tarfile.TarInfo(f"{found.id}/{number:04d}.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        archive = out.getvalue()
        if hostile == "truncated":
            return archive[: len(archive) * 2 // 3]
        if hostile == "corrupt":
            middle = len(archive) // 2
            flipped = bytes(byte ^ 0xFF for byte in archive[middle : middle + 16])
            return archive[:middle] + flipped + archive[middle + 16 :]
        return archive


def _operations(data: Any) -> list[dict[str, Any]]:
    operations = data.get("operations", []) if isinstance(data, dict) else data
    return [op for op in operations if isinstance(op, dict)] if isinstance(operations, list) else []


def _result(op_id: str, status: int, response: dict[str, Any]) -> dict[str, Any]:
    """One operation's result, as Mailchimp writes it: its response is a JSON string."""
    return {"operation_id": op_id, "status_code": status, "response": orjson.dumps(response).decode()}


def _error(status: int, message: str) -> tuple[int, bytes, str]:
    return status, orjson.dumps({"title": "Error", "status": status, "detail": message}), "application/json"
