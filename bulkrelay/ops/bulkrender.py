"""`render` for a bulk job: the named rows formed into jobs as a fresh run forms them (relay/bulkjobs/jobs.py:
input order, a job closing before the row that would take it past max_rows or max_bytes), each shown as
its one upload, the job's CSV, secrets `***` (the job's id is the target's, so `{job}` stands for it).
A named import's upload is its multipart submit, shown as the CSV file it carries; a generic job's is
its `steps.upload`. With `request.auth`, the headers its authentication adds, their values `***`."""

from __future__ import annotations

from collections.abc import Sequence

from bulkrelay.job.bulkcsv import BulkCsv
from bulkrelay.job.config import AuthConfig
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.job.request import RequestRenderer
from bulkrelay.ops.results import RenderedRequest
from bulkrelay.relay.auth import shown_with_auth


def rendered_jobs(
    bulk: BulkCsv,
    renderer: RequestRenderer,
    rows: Sequence[tuple[Record, bytes]],
    auth: AuthConfig | None = None,
) -> list[RenderedRequest]:
    """The uploads carrying `rows` (each a record and its CSV line, in input order), one a job."""
    jobs: list[list[tuple[Record, bytes]]] = []
    size = 0
    for row in rows:
        if not jobs or len(jobs[-1]) >= bulk.config.max_rows or size + len(row[1]) > bulk.config.max_bytes:
            jobs.append([])
            size = len(bulk.header)
        jobs[-1].append(row)
        size += len(row[1])
    base = renderer.render(Record(0, 0, {}))
    return [_shown(bulk, renderer, base, seq, job, auth=auth) for seq, job in enumerate(jobs, start=1)]


def _shown(
    bulk: BulkCsv,
    renderer: RequestRenderer,
    base: PreparedRequest,
    seq: int,
    job: list[tuple[Record, bytes]],
    *,
    auth: AuthConfig | None,
) -> RenderedRequest:
    body = bulk.body([line for _, line in job])
    method, url = _upload_of(bulk, base.url.rstrip("/"))
    headers = (*base.headers, ("Content-Type", bulk.content_type))
    shown = renderer.redact(shown_with_auth(auth, PreparedRequest(method, url, headers, body)))
    first = job[0][0]
    rows = [record.row_number for record, _ in job]
    return RenderedRequest(
        first.row_number,
        first.line,
        shown["method"],
        shown["url"],
        tuple((name, value) for name, value in shown["headers"]),
        shown["body"],
        batch={"seq": seq, "rows": rows, "size": len(job), "bytes": len(body)},
    )


def _upload_of(bulk: BulkCsv, base_url: str) -> tuple[str, str]:
    """The method and URL of the request that carries a job's CSV, for the job's kind."""
    config = bulk.config
    if config.kind == "named_import":
        return "POST", f"{base_url}/crm/v3/imports"
    if config.steps is not None:
        return config.steps.upload.method, base_url + (config.steps.upload.path or "")
    return "PUT", f"{base_url}/jobs/ingest/{{job}}/batches"
