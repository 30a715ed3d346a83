"""Bulk-job records in `results.jsonl`: what an asynchronous bulk job went through, one line an event.

    {"bulk_job":3,"event":"created","remote":"750x0000","rows":[[7,9],[12,12]],"keys":["a","b","c","d"],
     "t":1764630000.123,"crc":"0badf00d"}\\n

`bulk_job` numbers the run's jobs from 1; `event` is one of `EVENTS`: `created` carries the target's job
id (`remote`), its rows (ranges of row numbers, in input order) and their keys (and for a delta job,
`digests`: each row's request digest, hex, which its result line carries), and is fsynced before any
byte of the job's data leaves; `uploaded`, `closed`, `aborted`, `state` (the target's state and, for a
failed job, its `error`) and `results` (every row of the job named in the results has its line committed
before this record) follow it. A job whose data leaves in the request that makes it (a generic job
without `create`, `resubmit: safe`) has `submitting` first: its rows and keys, fsynced before the
request, with no `remote`; its `created` (the same, with the id) follows the answer. The line ends with
the same CRC-32 suffix as a row's line, so a torn record is found as a torn row is, and every row reader
skips a record as it skips a commit marker (`is_job_record`). The writer appends one between groups,
never inside one (`JournalWriter.commit_record`), so a record also vouches for the lines before it.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson

JOB_HEAD = b'{"bulk_job":'
EVENTS = frozenset({"submitting", "created", "uploaded", "closed", "aborted", "state", "results"})
_SUFFIX_LEN = 19  # len(',"crc":"xxxxxxxx"}\n'), as a row's line
_MAX_LINE = 16 << 20


def encode_job_record(job: int, event: str, **fields: Any) -> bytes:
    """The record line of `event` for the run's job `job`, newline included."""
    if event not in EVENTS:
        raise ValueError(f"unknown bulk-job event {event!r}")
    body = orjson.dumps({"bulk_job": job, "event": event, **fields, "t": round(time.time(), 3)})
    head = body[:-1]
    return head + b',"crc":"%08x"}\n' % zlib.crc32(head)


def decode_job_record(line: bytes) -> dict[str, Any] | None:
    """The fields of a whole, well-formed record line (`crc` dropped), or None."""
    if not line.startswith(JOB_HEAD) or line[-_SUFFIX_LEN:] != b',"crc":"%08x"}\n' % zlib.crc32(
        line[:-_SUFFIX_LEN]
    ):
        return None
    try:
        fields = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if (
        type(fields) is not dict
        or type(fields.get("bulk_job")) is not int
        or fields.get("event") not in EVENTS
    ):
        return None
    del fields["crc"]
    return fields


def is_job_record(line: bytes) -> bool:
    """Whether `line` is a whole bulk-job record (no row of its own)."""
    return line.startswith(JOB_HEAD) and decode_job_record(line) is not None


def row_ranges(rows: Sequence[int]) -> list[list[int]]:
    """Ascending row numbers as [first, last] ranges: a job's rows are mostly consecutive."""
    ranges: list[list[int]] = []
    for row in rows:
        if ranges and ranges[-1][1] == row - 1:
            ranges[-1][1] = row
        else:
            ranges.append([row, row])
    return ranges


def rows_of(ranges: Sequence[Sequence[int]]) -> list[int]:
    return [row for first, last in ranges for row in range(first, last + 1)]


@dataclass(slots=True)
class JobLedger:
    """One bulk job as its records tell it: the latest of each, folded in journal order."""

    job: int
    remote: str
    rows: list[int]
    keys: list[Any]
    events: list[str] = field(default_factory=list)
    state: str | None = None  # the target's last state journaled
    digests: list[str] | None = None  # a delta job's: each row's request digest (hex), in `rows` order
    error: str | None = None

    @property
    def closed(self) -> bool:
        return "closed" in self.events

    @property
    def ended(self) -> bool:
        """Its results are journaled, or it was aborted: nothing more to ask of it."""
        return "results" in self.events or "aborted" in self.events


def read_job_records(path: Path) -> Iterator[dict[str, Any]]:
    """The bulk-job records of a journal, in order, streaming; other lines are skipped unread, and a
    damaged record ends the reading (a torn tail holds nothing committed)."""
    if not path.exists():
        return
    with path.open("rb") as stream:
        for line in iter(partial(stream.readline, _MAX_LINE + 1), b""):
            if not line.startswith(JOB_HEAD):
                continue
            fields = decode_job_record(line)
            if fields is None:
                return
            yield fields


def job_ledgers(path: Path) -> dict[int, JobLedger]:
    """Every bulk job a journal names, by its number, each with its records folded in."""
    jobs: dict[int, JobLedger] = {}
    for record in read_job_records(path):
        number, event = record["bulk_job"], record["event"]
        if event in ("created", "submitting"):  # submitting: its rows before its id (remote "")
            rows = rows_of(record.get("rows", []))
            jobs[number] = JobLedger(
                number, str(record.get("remote", "")), rows, list(record.get("keys", []))
            )
            digests = record.get("digests")
            jobs[number].digests = list(digests) if isinstance(digests, list) else None
        ledger = jobs.get(number)
        if ledger is None:
            continue  # a record of a job whose creation is not journaled: nothing to attach to
        ledger.events.append(event)
        if event == "state":
            ledger.state = record.get("state")
            ledger.error = record.get("error")
    return jobs
