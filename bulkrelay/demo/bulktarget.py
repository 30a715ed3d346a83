"""The loopback target's asynchronous bulk API, answering like Salesforce Bulk API 2.0 ingest jobs.

    POST  .../jobs/ingest                  create: {"id": "750…", "state": "Open"}
    PUT   .../jobs/ingest/{id}/batches     the job's CSV, once, while Open (else 409)
    PATCH .../jobs/ingest/{id}             {"state": "UploadComplete"} closes it (it runs: its rows are
                                           processed now); {"state": "Aborted"} aborts an Open one
    GET   .../jobs/ingest/{id}             its state: UploadComplete, then InProgress, then JobComplete
                                           after `polls_to_complete` polls (Failed for a failed job)
    GET   .../jobs/ingest/{id}/successfulResults | failedResults | unprocessedrecords   CSV, shuffled

For `kind: generic` with `format: json`: an upload whose body is JSON (`{"records": [{column: value}]}`
or the bare list) is taken as the CSV of those rows, and `.../successfulResults.json` (and the other two
sets, `.json` added) serve a result set as `{"records": [{column: cell}]}`; with `results_page_size`,
in pages (`?page=N`), the next one's URL at `/nextRecordsUrl` (`page_links: body`) or in a `Link:
<...>; rel="next"` header (`page_links: header`). `hostile_pages` spoils them: `loop` (the last page
links back to page 2), `not_json` (page 2 is HTML), `repeat_key` (page 2 repeats page 1's first record).

The plan's `bulk` object sets the options: a row whose key cell holds `fail_contains` fails (sf__Error),
one holding `unprocessed_contains` is left unprocessed the first `unprocessed_times` times its key is
sent; every `fail_job_every`-th closed job is Failed with an errorMessage; `stuck` keeps jobs InProgress;
`forget_jobs` answers 404 for every job's state; `hostile_results` spoils the successful results
(`unknown_key`: a row with a key never sent; `truncated`: the file cut mid-row); `delay_ms` answers each
request that late, after acting on it (a kill lands between the two). The key column is
`key_column` (else the first). Polls answering 503 or 429 with Retry-After are the plan's rules, as for
any path (`match: {method: GET, path_contains: /jobs/ingest/}`). Stats count jobs by fate and
`bulk_rows_in_two_jobs`: keys processed by more than one job that ran (a relay that submitted twice).
"""

from __future__ import annotations

import csv
import io
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs

import orjson
from pydantic import BaseModel, ConfigDict, Field

_INGEST = "/jobs/ingest"
_Reply = tuple[int, bytes, str] | tuple[int, bytes, str, tuple[tuple[str, str], ...]]
_RESULT_SETS = ("successfulResults", "failedResults", "unprocessedrecords")


class BulkOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key_column: str | None = None
    fail_contains: str = "bogus"
    unprocessed_contains: str = "later"
    unprocessed_times: int = Field(default=1, ge=0)
    fail_job_every: int = Field(default=0, ge=0)  # 0: no job fails
    polls_to_complete: int = Field(default=2, ge=1)
    stuck: bool = False
    forget_jobs: bool = False
    hostile_results: Literal["unknown_key", "truncated"] | None = None
    results_page_size: int = Field(default=0, ge=0)  # JSON results this many records a page (0: one)
    page_links: Literal["body", "header"] = "body"  # the next page's URL: at /nextRecordsUrl, or Link
    hostile_pages: Literal["loop", "not_json", "repeat_key"] | None = None
    delay_ms: int = Field(default=0, ge=0)  # answer every ingest request this late (after acting on it)


@dataclass(slots=True)
class _Job:
    id: str
    state: str = "Open"
    csv: bytes | None = None
    polls: int = 0
    error: str | None = None
    results: dict[str, bytes] = field(default_factory=dict)


class BulkIngest:
    """Ingest jobs: created, loaded, closed (processed), polled, their results fetched."""

    def __init__(self, options: BulkOptions) -> None:
        self.options = options
        self._jobs: dict[str, _Job] = {}
        self._closed = 0
        self._seen: Counter[str] = Counter()  # keys sent in a closed job (unprocessed_times)
        self.processed: Counter[str] = Counter()  # keys processed, by jobs that ran
        self.fates: Counter[str] = Counter()
        self._ids = 0  # the sf__Id of the last record created

    @staticmethod
    def handles(path: str) -> bool:
        return _INGEST in path

    def stats(self) -> dict[str, Any]:
        return {
            "bulk_jobs": dict(sorted({"created": len(self._jobs), **self.fates}.items())),
            "bulk_rows_processed": sum(self.processed.values()),
            "bulk_rows_in_two_jobs": sum(1 for times in self.processed.values() if times > 1),
        }

    def answer(self, method: str, path: str, body: bytes, query: str = "") -> _Reply:
        """(status, body, content type[, headers]) for a request to the ingest API."""
        tail = path[path.index(_INGEST) + len(_INGEST) :].strip("/")
        if not tail:
            return self._create() if method == "POST" else _error(405, "POST to create a job")
        job_id, _, step = tail.partition("/")
        job = self._jobs.get(job_id)
        if job is None or (self.options.forget_jobs and method == "GET" and not step):
            return _error(404, f"no job {job_id}")
        if step == "batches" and method == "PUT":
            return self._upload(job, body)
        if not step and method == "PATCH":
            return self._set_state(job, orjson.loads(body).get("state"))
        if not step and method == "GET":
            return self._poll(job)
        name, as_json = (step[:-5], True) if step.endswith(".json") else (step, False)
        if name in _RESULT_SETS and method == "GET":
            if job.state != "JobComplete":
                return _error(409, f"job {job.id} is {job.state}")
            if as_json:
                return self._json_results(job, name, path, query)
            return 200, job.results[name], "text/csv"
        return _error(404, f"no {method} {path}")

    def _json_results(self, job: _Job, name: str, path: str, query: str) -> _Reply:
        """A result set as JSON, `{"records": [...]}`: whole, or the page `?page=N` of
        `results_page_size` records, the next one's URL at /nextRecordsUrl or in the Link header."""
        records = _parsed(job.results[name])[1]
        size = self.options.results_page_size
        if not size:
            return 200, orjson.dumps({"records": records}), "application/json"
        page = int(parse_qs(query).get("page", ["1"])[0])
        last = max(1, -(-len(records) // size))
        hostile = self.options.hostile_pages
        if hostile == "not_json" and page == 2:
            return 200, b"<html><body>502 Bad Gateway</body></html>", "text/html"
        part = records[(page - 1) * size : page * size]
        if hostile == "repeat_key" and page == 2 and records:
            part = [records[0], *part]
        following = page + 1 if page < last else (2 if hostile == "loop" and last > 1 else None)
        link = None if following is None else f"{path}?page={following}"
        if self.options.page_links == "header":
            headers = () if link is None else (("Link", f'<{link}>; rel="next"'),)
            return 200, orjson.dumps({"records": part}), "application/json", headers
        return 200, orjson.dumps({"records": part, "nextRecordsUrl": link}), "application/json"

    def _create(self) -> tuple[int, bytes, str]:
        job = _Job(f"750{len(self._jobs) + 1:015d}")
        self._jobs[job.id] = job
        return 200, orjson.dumps({"id": job.id, "state": job.state}), "application/json"

    def _upload(self, job: _Job, body: bytes) -> tuple[int, bytes, str]:
        if job.state != "Open" or job.csv is not None:
            return _error(409, f"job {job.id} takes one upload while Open")
        job.csv = _csv_of_json(body) if body.lstrip()[:1] in (b"{", b"[") else body
        return 201, b"", "application/json"

    def _set_state(self, job: _Job, state: Any) -> tuple[int, bytes, str]:
        if state == "Aborted" and job.state in ("Open", "UploadComplete", "InProgress"):
            job.state = "Aborted"
            self.fates["aborted"] += 1
        elif state == "UploadComplete" and job.state == "Open":
            self._close(job)
        elif state != job.state:
            return _error(409, f"job {job.id} is {job.state}, it cannot become {state}")
        return 200, orjson.dumps({"id": job.id, "state": job.state}), "application/json"

    def _close(self, job: _Job) -> None:
        """The job runs: its rows are processed (or it fails whole) and its results made, shuffled."""
        job.state = "UploadComplete"
        self._closed += 1
        self.fates["closed"] += 1
        every = self.options.fail_job_every
        if every and self._closed % every == 0:
            job.error = "InvalidBatch : Failed to process query: the demo failed this job"
            return
        header, rows = _parsed(job.csv or b"")
        key = self.options.key_column or (header[0] if header else "")
        ok, failed, unprocessed = [], [], []
        for row in rows:
            cell = row.get(key, "")
            self._seen[cell] += 1
            if (
                self.options.unprocessed_contains in cell
                and self._seen[cell] <= self.options.unprocessed_times
            ):
                unprocessed.append([row.get(name, "") for name in header])
                continue
            self.processed[cell] += 1
            if self.options.fail_contains in cell:
                failed.append(["", f"INVALID_FIELD:bad value in {cell}", *(row.get(n, "") for n in header)])
            else:
                self._ids += 1
                ok.append([f"003{self._ids:015d}", "true", *(row.get(n, "") for n in header)])
        if self.options.hostile_results == "unknown_key" and ok:
            ok.append(["003000000000000999", "true", *("never-sent" if n == key else "" for n in header)])
        shuffle = random.Random(job.id).shuffle
        for part in (ok, failed, unprocessed):
            shuffle(part)
        job.results = {
            "successfulResults": _csv(["sf__Id", "sf__Created", *header], ok),
            "failedResults": _csv(["sf__Id", "sf__Error", *header], failed),
            "unprocessedrecords": _csv(header, unprocessed),
        }
        if self.options.hostile_results == "truncated":
            whole = job.results["successfulResults"]
            job.results["successfulResults"] = whole[: max(len(whole) - 7, whole.index(b"\n") + 3)]

    def _poll(self, job: _Job) -> tuple[int, bytes, str]:
        if job.state in ("UploadComplete", "InProgress") and not self.options.stuck:
            job.polls += 1
            job.state = "InProgress"
            if job.polls >= self.options.polls_to_complete:
                job.state = "Failed" if job.error else "JobComplete"
                self.fates["failed" if job.error else "completed"] += 1
        answer: dict[str, Any] = {"id": job.id, "state": job.state}
        if job.error and job.state == "Failed":
            answer["errorMessage"] = job.error
        return 200, orjson.dumps(answer), "application/json"


def _parsed(data: bytes) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(data.decode("utf-8", "replace"), newline=""))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def _csv_of_json(body: bytes) -> bytes:
    """A JSON upload's rows (`{"records": [...]}` or the list) as the CSV the job would have taken."""
    data = orjson.loads(body)
    records = data.get("records", []) if isinstance(data, dict) else data
    header = list(records[0]) if records else []

    def cell(value: Any) -> str:
        return (
            "" if value is None else ("true" if value else "false") if isinstance(value, bool) else str(value)
        )

    return _csv(header, [[cell(record.get(name)) for name in header] for record in records])


def _csv(header: list[str], rows: list[list[str]]) -> bytes:
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().encode()


def _error(status: int, message: str) -> tuple[int, bytes, str]:
    return status, orjson.dumps([{"errorCode": "DEMO", "message": message}]), "application/json"
