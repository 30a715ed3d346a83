"""The commands that send nothing and read no run: `validate` and `render`, each a `Result`."""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio

from bulkrelay.envelope import EnvelopeWarning, Result, deprecation_warnings
from bulkrelay.errors import InputInvalid, Problem, UsageError
from bulkrelay.job.batch import Item
from bulkrelay.job.bulkcsv import BulkCsv
from bulkrelay.job.config import Job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.groups import batch_renderer
from bulkrelay.job.inputs import InputSpec, open_records
from bulkrelay.job.inputs.spec import STDIN_NAME
from bulkrelay.job.preflight import Preflight, resolve_input, run_preflight
from bulkrelay.job.records import Record
from bulkrelay.job.request import RenderError, RowRequests, job_renderer
from bulkrelay.ops.batchrender import rendered_batches
from bulkrelay.ops.bulkrender import rendered_jobs
from bulkrelay.ops.lookups import built_lookups, with_lookups
from bulkrelay.ops.results import (
    InputFacts,
    RenderedRequest,
    RenderResult,
    ValidateResult,
)
from bulkrelay.ops.snapshot import parquet_input
from bulkrelay.relay.auth import check_auth, shown_with_auth
from bulkrelay.relay.engine import transport_settings
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import TransportSettings
from bulkrelay.store.runs import default_runs_dir

_ROWS = re.compile(r"^\d+(-\d+)?$")
DEFAULT_ROWS = "1-5"  # `render` without --rows: the first five rows, however many there are


def validate_result(preflight: Preflight) -> ValidateResult:
    fingerprint = preflight.input_fingerprint
    return ValidateResult(
        job=str(preflight.job.path),
        record_count=fingerprint.record_count,
        format=_input_kind(preflight),
        gzip=fingerprint.gzip,
        input=InputFacts(preflight.input_spec.display_name, fingerprint.sha256, fingerprint.size),
        config_sha256=preflight.config_fingerprint,
    )


def _input_kind(preflight: Preflight) -> str:
    """What the input is (`parquet`, `query`, or the file's format), not the JSON Lines of a snapshot."""
    spec = preflight.input_spec
    named = Path(spec.name) if spec.name not in (None, STDIN_NAME) else None
    if spec.source is None and named is not None and parquet_input(preflight.job, named):
        return "parquet"
    return spec.shown_format


def validate(
    job: Job, input_path: Path | None, input_name: str | None = None, *, check_auth: bool = False
) -> Result:
    """Preflight and the HTTP client's set-up (its client certificate); with `check_auth`, then one token
    from `request.auth.oauth2`'s endpoint (no row sent)."""
    preflight = run_preflight(_looked_up(job), input_path, input_name=input_name)
    result = validate_result(preflight)
    if job.config.execution.tls is not None:
        anyio.run(_client_opens, transport_settings(preflight))
    if check_auth:
        result = replace(result, auth=_checked_auth(preflight))
    return Result(data=result, warnings=deprecation_warnings(job.deprecations))


async def _client_opens(settings: TransportSettings) -> None:
    """The HTTP client made as `run` makes it, before its first request, and closed: it loads
    `execution.tls`'s client certificate and key, and refuses them as `run` would (a missing file, no
    PEM in it, an encrypted key, a key that is not the certificate's)."""
    await open_transport(settings).aclose()


def _checked_auth(preflight: Preflight) -> dict[str, Any]:
    return anyio.run(check_auth, preflight, open_transport, transport_settings(preflight))


@dataclass(frozen=True)
class RowRanges:
    """The rows `--rows` names, as sorted, merged (first, last) spans: never one entry per row,
    so `1-1000000000000` costs two numbers."""

    spec: str
    spans: tuple[tuple[int, int], ...]

    def __contains__(self, row: int) -> bool:
        index = bisect.bisect_right(self.spans, row, key=lambda span: span[0]) - 1
        return index >= 0 and self.spans[index][0] <= row <= self.spans[index][1]

    @property
    def last(self) -> int:
        return self.spans[-1][1]

    def beyond(self, record_count: int) -> str:
        """The named rows past the end of the input, as a spec (`4-9,12`)."""
        parts = []
        for first, last in self.spans:
            if last > record_count:
                low = max(first, record_count + 1)
                parts.append(str(low) if low == last else f"{low}-{last}")
        return ",".join(parts)


def parse_rows(spec: str) -> RowRanges:
    """`1-5`, `7`, or a comma list of both."""
    spans: list[tuple[int, int]] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not _ROWS.match(part):
            raise UsageError(f"--rows {spec!r}: expected numbers or ranges like 1-5,9")
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first < 1 or last < first:
            raise UsageError(f"--rows {spec!r}: ranges start at 1 and go upwards")
        spans.append((first, last))
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return RowRanges(spec, tuple(merged))


def _looked_up(job: Job) -> Job:
    """The job with its lookup maps built now (for this command only: nothing is frozen)."""
    if not job.config.lookups:
        return job
    return with_lookups(job, built_lookups(job, default_runs_dir(None)))


def render(
    job: Job,
    input_path: Path | None,
    rows_spec: str | None,
    input_name: str | None = None,
    *,
    curl: bool = False,
) -> Result:
    """The exact requests the chosen rows would send, secrets shown as `***`. Sends nothing.
    `curl`: each also as a curl command line.

    Rows past the end of the input are a warning; when none of the named rows exist, a usage error."""
    wanted = parse_rows(rows_spec or DEFAULT_ROWS)
    job = _looked_up(job)
    spec = resolve_input(job, input_path, input_name)
    requests, problems, record_count = _render_rows(job, spec, wanted)
    problems = [p for p in problems if p.row is None or p.row in wanted]
    if problems:
        raise InputInvalid(problems, phase="render")
    warnings = deprecation_warnings(job.deprecations)
    if record_count is not None and rows_spec is not None:
        if not requests:
            raise UsageError(
                f"--rows {rows_spec}: {spec.display_name} has only {record_count} rows; nothing to render",
                context={"rows": rows_spec, "record_count": record_count, "input": spec.display_name},
            )
        warnings.append(
            EnvelopeWarning(
                "ROWS_BEYOND_INPUT",
                f"rows {wanted.beyond(record_count)} are beyond the input's {record_count} rows",
                {"rows": rows_spec, "record_count": record_count},
            )
        )
    return Result(data=RenderResult(str(job.path), tuple(requests), curl=curl), warnings=warnings)


def _render_rows(
    job: Job, spec: InputSpec, wanted: RowRanges
) -> tuple[list[RenderedRequest], list[Problem], int | None]:
    """The rendered requests, the problems met, and the input's row count when the range
    reached past its end (None when it stopped early: every named row exists)."""
    renderer = job_renderer(job, os.environ)
    config_sha256 = config_fingerprint(job.config)
    problems: list[Problem] = []
    requests: list[RenderedRequest] = []
    batcher = batch_renderer(job.config, renderer, config_sha256)  # a batch or grouped job's
    rows = RowRequests(renderer, config_sha256, job.config.input.key)
    items: list[Item] = []  # a batch job's: formed into batches at the end
    bulk = BulkCsv.of_job(job.config)
    lines: list[tuple[Record, bytes]] = []  # a bulk job's: formed into jobs at the end
    seen = 0
    with open_records(spec, problems.append) as stream:
        for record in stream:
            if record.row_number > wanted.last:
                seen = wanted.last + 1
                break
            seen = record.row_number
            if record.row_number not in wanted:
                continue
            try:
                if batcher is not None:
                    items.append(batcher.item(record))
                    continue
                if bulk is not None:
                    lines.append((record, bulk.item_request(record).body or b""))
                    continue
                request, _ = rows.keyed(record)  # with its idempotency key, as the run sends it
            except RenderError as exc:
                problems.append(
                    Problem(
                        renderer.redactor.redact(exc.message),
                        file=spec.display_name,
                        line=record.line,
                        row=record.row_number,
                        field=exc.field,
                    )
                )
                continue
            # the token is fetched, the signatures made, when the run sends it: shown as ***
            request = shown_with_auth(job.config.request.auth, request)
            shown = renderer.redact(request)
            requests.append(
                RenderedRequest(
                    record.row_number,
                    record.line,
                    shown["method"],
                    shown["url"],
                    tuple((name, value) for name, value in shown["headers"]),
                    shown["body"],
                )
            )
    if batcher is not None:
        requests = rendered_batches(batcher, items, job.config.request.auth)
    if bulk is not None:
        requests = rendered_jobs(bulk, renderer, lines, job.config.request.auth)
    return requests, problems, seen if seen < wanted.last else None
