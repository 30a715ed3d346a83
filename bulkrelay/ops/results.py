"""The commands' results: frozen typed values that the use cases return and the CLI renders.

Each value's `to_data()` is the `data` of its JSON envelope (docs/json-output.md), key for key and in
the same order, so the envelope is a contract kept in one place; the human view (cli/human.py) reads
the same value's attributes. A run's summary is a typed `RunSummary`; `status` carries the summary and
the live pace as the documents it read them from (`summary.json`, the checkpoint), so an earlier
version's files show as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bulkrelay.envelope import CommandData
from bulkrelay.ops.curl import curl_command
from bulkrelay.relay.progress import Snapshot
from bulkrelay.report.failuregroups import FailureGroup
from bulkrelay.store.rundir import RunState
from bulkrelay.store.summary import RunSummary


@dataclass(frozen=True)
class InputFacts:
    """The input preflight read, as validate shows it."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ValidateResult(CommandData):
    kind = "validate"

    job: str
    record_count: int
    format: str
    gzip: bool
    input: InputFacts
    config_sha256: str
    auth: dict[str, Any] | None = None  # `--check-auth`: the token endpoint accepted the client

    def to_data(self) -> dict[str, Any]:
        data = {
            "job": self.job,
            "record_count": self.record_count,
            "format": self.format,
            "gzip": self.gzip,
            "input": {"path": self.input.path, "sha256": self.input.sha256, "size": self.input.size},
            "config_sha256": self.config_sha256,
        }
        return data if self.auth is None else {**data, "auth": self.auth}


@dataclass(frozen=True)
class RenderedRequest:
    """One row's request as `render` shows it: secrets already `***`."""

    row_number: int
    line: int
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: str | None
    batch: dict[str, Any] | None = (
        None  # a batch job's request: {seq, rows, size, bytes}; row_number is its first
    )

    @property
    def curl(self) -> str:
        """The request as a curl command line (`render --curl`), secrets as `***`."""
        return curl_command(self.method, self.url, self.headers, self.body)

    def to_data(self) -> dict[str, Any]:
        data = {
            "row_number": self.row_number,
            "line": self.line,
            "method": self.method,
            "url": self.url,
            "headers": [[name, value] for name, value in self.headers],
            "body": self.body,
        }
        if self.batch is not None:
            data["batch"] = self.batch
        return data


@dataclass(frozen=True)
class RenderResult(CommandData):
    kind = "render"

    job: str
    requests: tuple[RenderedRequest, ...]
    curl: bool = False  # `--curl`: each request also as a curl command line

    def to_data(self) -> dict[str, Any]:
        requests = [
            {**request.to_data(), "curl": request.curl} if self.curl else request.to_data()
            for request in self.requests
        ]
        return {"job": self.job, "requests": requests}


@dataclass(frozen=True)
class StatusResult(CommandData):
    """One run's state, liveness, pace and counters. `sync` (a delta run) and `continue_command`
    (a resumable run) appear in the envelope only when set."""

    kind = "status"

    run_id: str
    run_dir: str
    state: RunState
    live: bool
    liveness: str
    pid: int | None
    stop_reason: str | None
    created_at: str | None
    updated_at: str | None
    parent_run: str | None
    progress: Snapshot
    rate: dict[str, Any] | None
    latency_ms: dict[str, float]
    summary: dict[str, Any] | None
    sync: dict[str, Any] | None = None
    continue_command: str | None = None
    report: str | None = None  # the run's report.html, when one was written
    lookups: Mapping[str, Mapping[str, Any]] | None = None  # the frozen maps: name -> sha256, entries

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "state": self.state,
            "live": self.live,
            "liveness": self.liveness,
            "pid": self.pid,
            "stop_reason": self.stop_reason,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "parent_run": self.parent_run,
            "progress": self.progress.to_dict(),
            "rate": self.rate,
            "latency_ms": self.latency_ms,
            "summary": self.summary,
        }
        if self.sync is not None:
            data["sync"] = self.sync
        if self.continue_command is not None:
            data["continue_command"] = self.continue_command
        if self.report is not None:
            data["report"] = self.report
        if self.lookups:
            data["lookups"] = {name: dict(record) for name, record in self.lookups.items()}
        return data


@dataclass(frozen=True)
class ReportResult(CommandData):
    """`report`: where the page went (`-`: stdout), and what it could not show (`missing`)."""

    kind = "report"

    run_id: str
    run_dir: str
    output: str
    state: RunState
    rows_done: int
    rows_total: int
    missing: tuple[str, ...] = ()

    def to_data(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "output": self.output,
            "state": self.state,
            "rows_done": self.rows_done,
            "rows_total": self.rows_total,
            "missing": list(self.missing),
        }


@dataclass(frozen=True)
class RunRow:
    """One line of `runs`: a public alpha run has `alpha` for its state and may have no total."""

    run_id: str
    state: str
    format: str
    name: str | None
    created_at: str | None
    done: int
    total: int | None
    failed: int
    run_dir: str
    ended_at: str | None = None  # None while it runs, for an interrupted run, and for an alpha run
    duration_seconds: float | None = None  # from created_at to ended_at

    def to_data(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "state": self.state,
            "format": self.format,
            "name": self.name,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "duration_seconds": self.duration_seconds,
            "done": self.done,
            "total": self.total,
            "failed": self.failed,
            "run_dir": self.run_dir,
        }


@dataclass(frozen=True)
class RunsResult(CommandData):
    kind = "runs"

    runs_dir: str
    runs: tuple[RunRow, ...]

    def to_data(self) -> dict[str, Any]:
        return {"runs_dir": self.runs_dir, "runs": [run.to_data() for run in self.runs]}


@dataclass(frozen=True)
class HistoryResult(CommandData):
    """`report --history`: the page of a job's last nights, and which of them were bad."""

    kind = "history"

    job: str
    runs_dir: str
    output: str
    nights: int
    bad_nights: tuple[str, ...]

    def to_data(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "runs_dir": self.runs_dir,
            "output": self.output,
            "nights": self.nights,
            "bad_nights": list(self.bad_nights),
        }


@dataclass(frozen=True)
class FailuresResult(CommandData):
    kind = "failures"

    run_id: str
    run_dir: str
    state: RunState
    failed: int
    groups: tuple[FailureGroup, ...]

    def to_data(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "state": self.state,
            "failed": self.failed,
            "groups": [group.to_data() for group in self.groups],
        }


@dataclass(frozen=True)
class PruneResult(CommandData):
    kind = "prune"

    runs_dir: str
    dry_run: bool
    keep: int | None
    older_than: str | None
    removed: tuple[str, ...]
    kept: int
    # the spool files of processes that ended without removing them (a run killed mid-snapshot)
    spools_removed: tuple[str, ...] = ()
    spool_bytes: int = 0

    def to_data(self) -> dict[str, Any]:
        return {
            "runs_dir": self.runs_dir,
            "dry_run": self.dry_run,
            "keep": self.keep,
            "older_than": self.older_than,
            "removed": list(self.removed),
            "kept": self.kept,
            "spools_removed": list(self.spools_removed),
            "spool_bytes": self.spool_bytes,
        }


@dataclass(frozen=True)
class ShardRow:
    shard: str | None
    run_id: str
    run_dir: str
    state: RunState
    live: bool
    progress: Snapshot

    def to_data(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "state": self.state,
            "live": self.live,
            "done": self.progress.done,
            "total": self.progress.total,
            "ok": self.progress.ok,
            "failed": self.progress.failed,
        }


@dataclass(frozen=True)
class ShardsResult(CommandData):
    """The shards of one job summed; `live` in the total counts the shards being worked on now."""

    kind = "shards"

    shards: tuple[ShardRow, ...]
    total: Snapshot
    live: int
    complete: bool

    def to_data(self) -> dict[str, Any]:
        total = {"done": self.total.done, "total": self.total.total, "ok": self.total.ok}
        total.update(failed=self.total.failed, live=self.live)
        return {"shards": [row.to_data() for row in self.shards], "total": total, "complete": self.complete}


@dataclass(frozen=True)
class ExportResult(CommandData):
    """Where the joined rows went. `skipped_unchanged` (a delta run) appears only when set."""

    run_id: str
    output: str
    format: str
    rows: int
    failed_only: bool
    runs: tuple[str, ...]
    skipped_unchanged: int | None = None

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "output": self.output,
            "format": self.format,
            "rows": self.rows,
            "failed_only": self.failed_only,
            "runs": list(self.runs),
        }
        if self.skipped_unchanged is not None:
            data["skipped_unchanged"] = self.skipped_unchanged
        return data


@dataclass(frozen=True)
class SyncStateResult(CommandData):
    """`sync-state rebuild|verify`: the job's sync state file, from how many runs, with how many keys.
    `matches` is verify's (it raises when they differ) and appears only there."""

    job: str
    state: str
    runs: int
    keys: int
    matches: bool | None = None

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"job": self.job, "state": self.state, "runs": self.runs, "keys": self.keys}
        if self.matches is not None:
            data["matches"] = self.matches
        return data


@dataclass(frozen=True)
class MirrorDeletions:
    """A `sync: mirror` job's deletions, after its night's run: sent as a run of their own (`run`,
    made after the night's run `after_run`), or not sent, and why."""

    deletions: int
    run: RunResult | None = None
    after_run: str | None = None
    reason: str | None = None  # why they were not sent

    def to_data(self) -> dict[str, Any]:
        if self.run is None:
            return {"deletions": self.deletions, "sent": False, "reason": self.reason}
        return {
            "deletions": self.deletions,
            "run_id": self.run.run_id,
            "run_dir": self.run.run_dir,
            "state": self.run.state,
            "progress": self.run.progress.to_dict(),
            "after_run": self.after_run,
        }


@dataclass(frozen=True)
class RunResult(CommandData):
    """How a `run`, `resume` or `retry-failed` call left its run. The optional parts appear in the
    envelope only when set, in this order: `continue_command` (the run is resumable), `parent_run`
    (a retry-failed run), `mirror` (a mirror job's deletions), `pruned` (runs retention removed),
    `report` (`--report`: the run report's path)."""

    kind = "run"

    run_id: str
    run_dir: str
    state: RunState
    progress: Snapshot
    summary: RunSummary
    continue_command: str | None = None
    parent_run: str | None = None
    mirror: MirrorDeletions | dict[str, Any] | None = None  # a mapping when read back from an envelope
    pruned: tuple[str, ...] = ()
    report: str | None = None

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "run_dir": self.run_dir,
            "state": self.state,
            "progress": self.progress.to_dict(),
            "summary": self.summary.to_json(),
        }
        optional = (
            ("continue_command", self.continue_command),
            ("parent_run", self.parent_run),
            ("mirror", self.mirror.to_data() if isinstance(self.mirror, MirrorDeletions) else self.mirror),
            ("pruned", list(self.pruned) or None),
            ("report", self.report),
        )
        data.update((name, value) for name, value in optional if value is not None)
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> RunResult:
        """The value again from its envelope's `data`: a background job keeps only the envelope."""
        progress = data["progress"]
        return cls(
            run_id=data["run_id"],
            run_dir=data["run_dir"],
            state=RunState(data["state"]),
            progress=Snapshot(progress["total"], progress["done"], progress["ok"], progress["failed"]),
            summary=RunSummary.from_json(data["summary"]),
            continue_command=data.get("continue_command"),
            parent_run=data.get("parent_run"),
            mirror=data.get("mirror"),
            pruned=tuple(data.get("pruned") or ()),
            report=data.get("report"),
        )


@dataclass(frozen=True)
class NothingToRetry(CommandData):
    """`retry-failed` when no failed row of the parent matches: no run is made."""

    parent_run: str
    message: str = "no failed rows match; nothing to retry"

    def to_data(self) -> dict[str, Any]:
        return {"parent_run": self.parent_run, "selected": 0, "message": self.message}


@dataclass(frozen=True)
class DemoFacts:
    """What `bulkrelay demo` set up, and what its target does on purpose."""

    job: str
    input: str
    target: str
    rejected: int  # rows the target answers 422
    retried: int  # rows the target answers 503 once

    def to_data(self) -> dict[str, Any]:
        expected = {"rejected": self.rejected, "retried": self.retried}
        return {"job": self.job, "input": self.input, "target": self.target, "expected": expected}


@dataclass(frozen=True)
class DemoResult(CommandData):
    kind = "demo"

    run: RunResult
    demo: DemoFacts

    def to_data(self) -> dict[str, Any]:
        return {**self.run.to_data(), "demo": self.demo.to_data()}
