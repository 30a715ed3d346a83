"""`kind: named_import`: HubSpot-shaped CRM imports, where one request submits and a name finds it again.

    POST {base_url}/crm/v3/imports               multipart: importRequest (JSON: name, files, column
                                                 mappings) and files (the job's CSV) -> {id, state}
    GET  {base_url}/crm/v3/imports               the imports, each with its importName (paged: after)
    GET  {base_url}/crm/v3/imports/{id}          its state: STARTED, PROCESSING, DONE, FAILED, CANCELED
    POST {base_url}/crm/v3/imports/{id}/cancel   cancels it
    GET  {base_url}/crm/v3/imports/{id}/errors   the failed rows, each with its CSV line (sourceData.rowData)

Such an API gives no id before the data leaves, so the job's `remote` (journaled before the submit) is
the import's **name**: a digest of the run, the job's number and its rows' keys. Its id is found in the
list by that name whenever this process has not seen it submitted: after a crash, before anything is
sent again, the driver asks for the job's state, and a name in the list is attached to (polled, its
errors fetched), never imported twice; a name not in the list was never imported, so its rows go in a
new job (under a new number, so a new name). A submit whose answer is lost (a transport error) is looked
up the same way before it counts as failed, as is one answered 2xx without an id that can be read (the
import was made). Errors are matched to rows by the key column of their own CSV line, never by line number;
a row named in no error succeeded. The import's id (and the list's `after` cursor) go in URLs as one path
segment (and one query value), percent-encoded; a list, poll or errors answer that cannot be read is asked
again (steps.readable).
"""

from __future__ import annotations

import csv
import hashlib
import secrets
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import orjson

from bulkrelay.relay.bulkjobs.steps import (
    ABORTED,
    API_SUCCESS,
    FAILED,
    JOB_COMPLETE,
    AnswerUnreadable,
    JobForgotten,
    JobResults,
    StepClient,
    StepRefused,
    job_id,
    json_answer,
    never_sent,
    segment,
)

_STATES = {"DONE": JOB_COMPLETE, "FAILED": FAILED, "CANCELED": ABORTED, "REVERTED": ABORTED}
_OPERATIONS = {"insert": "CREATE", "update": "UPDATE", "upsert": "UPSERT"}
_MAX_PAGES = 1000  # of the list or of one import's errors: a target that pages forever is refused


def _after(paging: Any, step: str) -> str | None:
    """The next page's cursor, `paging.next.after` (a string or a number), or None on the last page;
    AnswerUnreadable for paging of the wrong types."""
    after: Any = paging
    for name in ("next", "after"):
        if after is None:
            return None
        if not isinstance(after, dict):
            raise AnswerUnreadable(step, None, "the answer's paging is not {next: {after}}")
        after = after.get(name)
    if after is None or after == "":
        return None
    if isinstance(after, bool) or not isinstance(after, (str, int)):
        raise AnswerUnreadable(step, None, "the answer's paging.next.after is no cursor")
    return str(after)


def import_name(salt: str, number: int, keys: list[str]) -> str:
    """The name of the run's job `number`: the same rows in the same job of the same run, the same name."""
    digest = hashlib.sha256(f"{salt}\n{number}\n".encode())
    for key in keys:
        digest.update(key.encode() + b"\n")
    return f"bulkrelay-{number}-{digest.hexdigest()[:24]}"


class NamedImport(StepClient):
    """The imports API of one job file; the run's id in each name keeps one run's names from another's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._imports = f"{self._base}/crm/v3/imports"
        self._ids: dict[str, str] = {}  # name -> the import's id, once known

    async def create(self, number: int, keys: list[str]) -> str:
        """No request: the name is the job's remote id, durable before the submit names it."""
        return import_name(self._run_id, number, keys)

    async def upload(self, remote: str, body: bytes) -> None:
        """Submit the import, once; a lost answer, or a 2xx without an id that can be used, is looked up
        by name before it counts as failed."""
        boundary = f"bulkrelay-{secrets.token_hex(12)}"
        payload = self._multipart(boundary, remote, body)
        request = self._request("POST", self._imports, payload, f"multipart/form-data; boundary={boundary}")
        try:
            answer = await self._sent_once("submit", request)
            self._ids[remote] = job_id(json_answer(answer, "submit").get("id"), "submit", answer.status)
        except StepRefused as refused:
            # a lost answer, or a 2xx one without a usable id: the import may have been made
            maybe_made = refused.status is None or API_SUCCESS.is_success(refused.status)
            if maybe_made and await self._find(remote) is not None:
                return
            raise

    async def close(self, remote: str) -> None:
        """Nothing to ask: the submit started the import."""

    async def abort(self, remote: str) -> None:
        import_id = await self._find(remote)
        if import_id is not None:
            await self._asked("cancel", "POST", f"{self._import(import_id)}/cancel", None, None)

    def _import(self, import_id: str) -> str:
        return f"{self._imports}/{segment(import_id)}"

    async def state(self, remote: str) -> tuple[str, str | None]:
        """The import's state in the driver's words, asked until an answer can be read; JobForgotten
        for a name the target does not list."""
        return await self.readable(lambda: self._state(remote))

    async def _state(self, remote: str) -> tuple[str, str | None]:
        import_id = await self._find(remote, poll=True)
        if import_id is None:
            raise JobForgotten("poll", 404, f"the target lists no import named {remote}")
        answer = await self._asked("poll", "GET", self._import(import_id), None, None, poll=True)
        data = json_answer(answer, "poll")
        state = data.get("state")
        if not isinstance(state, str):
            raise AnswerUnreadable("poll", answer.status, "the answer has no state")
        mapped = _STATES.get(state, "InProgress")
        message = data.get("errorMessage") if mapped == FAILED else None
        return mapped, str(message or f"the import ended {state}") if mapped == FAILED else None

    async def results(self, remote: str, sent: set[str]) -> JobResults:
        """Each error matched to its row by the key cell of its own CSV line; every other row succeeded.
        All the errors' pages are asked again, from the first, while one cannot be read."""
        return await self.readable(lambda: self._results(remote, sent))

    async def _results(self, remote: str, sent: set[str]) -> JobResults:
        import_id = self._ids[remote]
        results = JobResults()
        async for error in self._paged(f"{self._import(import_id)}/errors", "errors"):
            key = self._key_of(error, remote)
            if key not in sent:
                raise never_sent("errors", key, remote)
            kind, value = error.get("errorType") or "ERROR", error.get("invalidValue")
            results.failed[key] = f"{kind}: {value}" if value is not None else str(kind)
        captured = {"import_id": import_id}
        results.succeeded = {key: dict(captured) for key in sent if key not in results.failed}
        return results

    def _key_of(self, error: dict[str, Any], remote: str) -> str:
        source = error.get("sourceData") if isinstance(error, dict) else None
        row = source.get("rowData") if isinstance(source, dict) else None
        if not isinstance(row, str):
            raise AnswerUnreadable(
                "errors", None, f"an error of import {remote} carries no rowData to match by key"
            )
        cells = next(csv.reader([row]), [])
        index = self._bulk.columns.index(self._bulk.key_column)
        if index >= len(cells):
            raise AnswerUnreadable("errors", None, f"an error's rowData is truncated: {row[:100]!r}")
        return cells[index]

    async def _find(self, name: str, *, poll: bool = False) -> str | None:
        """The id of the import named `name`: from this process's submit, else from the list, read
        whole until the deadline (whether an import was made decides whether its rows go again)."""
        if name not in self._ids:
            found = await self.readable(lambda: self._listed(name, poll=poll))
            if found is not None:
                self._ids[name] = found
        return self._ids.get(name)

    async def _listed(self, name: str, *, poll: bool) -> str | None:
        async for item in self._paged(self._imports, "list", poll=poll):
            if isinstance(item, dict) and item.get("importName") == name and item.get("id") is not None:
                try:
                    return job_id(item["id"], "list", None)
                except StepRefused as refused:  # listed, so made: no request may go where its id says
                    raise AnswerUnreadable("list", None, str(refused)) from None
        return None

    async def _paged(self, url: str, step: str, *, poll: bool = False) -> AsyncIterator[Any]:
        """The items of a paged list (`results`, then `paging.next.after`), page by page, asked until
        the deadline; AnswerUnreadable for a page that is not such a list."""
        after: str | None = None
        for _ in range(_MAX_PAGES):
            page = url if after is None else f"{url}?after={quote(after, safe='')}"
            answer = await self._asked(step, "GET", page, None, None, poll=poll, patient=True)
            data = json_answer(answer, step)
            items = data.get("results")
            if not isinstance(items, list):
                raise AnswerUnreadable(step, None, "the answer has no results list")
            for item in items:
                yield item
            after = _after(data.get("paging"), step)
            if after is None:
                return
        raise StepRefused(step, None, f"more than {_MAX_PAGES} pages")

    def _multipart(self, boundary: str, name: str, body: bytes) -> bytes:
        config, bulk = self._config, self._bulk
        mappings = []
        for column in bulk.columns:
            mapping: dict[str, Any] = {
                "columnName": column,
                "propertyName": column,
                "columnObjectTypeId": config.object,
            }
            if column == config.external_id_field:
                mapping["columnType"] = "HUBSPOT_ALTERNATE_ID"
            mappings.append(mapping)
        page = {"hasHeader": True, "columnMappings": mappings}
        request = {
            "name": name,
            "importOperations": {config.object: _OPERATIONS[config.operation]},
            "files": [{"fileName": f"{name}.csv", "fileFormat": "CSV", "fileImportPage": page}],
        }
        parts = (
            (b'name="importRequest"', b"application/json", orjson.dumps(request)),
            (f'name="files"; filename="{name}.csv"'.encode(), b"text/csv", body),
        )
        out = b""
        for disposition, kind, content in parts:
            out += b"--%s\r\nContent-Disposition: form-data; %s\r\nContent-Type: %s\r\n\r\n%s\r\n" % (
                boundary.encode(), disposition, kind, content,
            )  # fmt: skip
        return out + b"--%s--\r\n" % boundary.encode()
