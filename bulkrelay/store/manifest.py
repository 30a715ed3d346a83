"""The run manifest (`run.json`) as a typed record: read once, checked field by field, written back as is.

`RunManifest.from_json` is the only reader of a v1 `run.json`: a missing or mistyped field is
`JournalCorrupt` naming the file and the field, so no later step meets a `KeyError`. `to_json` writes
exactly the fields the format has always had (docs/resume.md, "The run directory"); a field that was
absent stays absent. The public alpha's `run.json` has its own small record, `AlphaManifest`: it is
listed, never run.

A manifest never changes in place: `dataclasses.replace` or the small methods below make the next one,
and `RunDir` saves it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bulkrelay.errors import JournalCorrupt
from bulkrelay.store.jsonfields import JsonFields

MANIFEST_VERSION = 1


class RunState(enum.StrEnum):
    """The state a run's manifest records. The values are on disk (run.json) and in envelopes and
    the metrics file: never change one. `running` is neither final nor resumable by its name alone:
    it is a live run, or a crashed one, which only the lock tells (`is_locked`)."""

    RUNNING = "running"
    STOPPED = "stopped"  # stopped at a safe point
    FORCED = "forced"  # stopped with rows in flight cancelled
    COMPLETED = "completed"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    CANCELLED = "cancelled"  # by `job cancel`

    @property
    def final(self) -> bool:
        """Nothing more happens to the run: it cannot be resumed, only retried or run afresh."""
        return self in _FINAL

    @property
    def resumable(self) -> bool:
        """Stopped before its end, on purpose: `resume` continues it."""
        return self in _STOPPED_EARLY

    @property
    def every_row_ended(self) -> bool:
        """Every row has a final result (some may have failed)."""
        return self in _EVERY_ROW_ENDED


_FINAL = frozenset({RunState.COMPLETED, RunState.COMPLETED_WITH_FAILURES, RunState.CANCELLED})
_STOPPED_EARLY = frozenset({RunState.STOPPED, RunState.FORCED})
_EVERY_ROW_ENDED = frozenset({RunState.COMPLETED, RunState.COMPLETED_WITH_FAILURES})


def _fields(path: Path, data: object) -> JsonFields:
    return JsonFields(
        path, data, JournalCorrupt, suggestion="restore run.json from a backup, or start a new run"
    )


@dataclass(frozen=True)
class InputRecord:
    """`input`: where the run's records were and the fingerprint they had when it started."""

    path: str
    format: str
    gzip: bool
    sha256: str
    size: int
    record_count: int
    # What the records were taken from, when `path` is a snapshot of it: a query's database named
    # without credentials (`postgresql://host:5432/db`, `sqlite:///path`). Absent for a file.
    source: str | None = None
    # A query's text as the job file writes it (`input.query`: no secret goes in it, `${...}` is only
    # for `input.database`), so the run says what it read. Absent for a file, and in runs made before
    # it was kept (their configuration fingerprint holds only its digest).
    query: str | None = None

    @classmethod
    def from_json(cls, fields: JsonFields) -> InputRecord:
        return cls(
            path=fields.text("path"),
            format=fields.text("format"),
            gzip=fields.flag("gzip"),
            sha256=fields.text("sha256"),
            size=fields.integer("size"),
            record_count=fields.integer("record_count"),
            source=fields.optional_text("source"),
            query=fields.optional_text("query"),
        )

    def fingerprint(self) -> dict[str, Any]:
        """The fingerprint alone (no path, no source, no query), as the input's own fingerprint spells it."""
        data = self.to_json()
        del data["path"]
        data.pop("source", None)
        data.pop("query", None)
        return data

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "path": self.path,
            "format": self.format,
            "gzip": self.gzip,
            "sha256": self.sha256,
            "size": self.size,
            "record_count": self.record_count,
        }
        if self.source is not None:
            data["source"] = self.source
        if self.query is not None:
            data["query"] = self.query
        return data


@dataclass(frozen=True)
class ShardRecord:
    """`shard`: the slice of the rows a `run --shard K/N` owns."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "count": self.count}


@dataclass(frozen=True)
class SyncRecord:
    """`sync`: a delta run's mode, whether it was a full pass, rows selected and rows skipped unchanged."""

    mode: str
    full: bool
    selected: int
    skipped_unchanged: int

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "full": self.full,
            "selected": self.selected,
            "skipped_unchanged": self.skipped_unchanged,
        }


@dataclass(frozen=True)
class RetryFilter:
    """`retry_filter`: the filters a `retry-failed` run chose its parent's rows by, as given."""

    statuses: str | None
    classification: str | None

    def to_json(self) -> dict[str, Any]:
        return {"statuses": self.statuses, "classification": self.classification}


@dataclass(frozen=True)
class Invocation:
    """`invocation_key` and `idempotency_key`: the identity of the `run` invocation that made the run."""

    key: str
    idempotency_key: str | None


@dataclass(frozen=True)
class RunPlan:
    """What the maker of a run decides: everything in `run.json` but its identity, state and times."""

    job_path: str
    input: InputRecord
    config_sha256: str
    name: str | None = None
    config_sections: Mapping[str, str] | None = None
    cwd: str | None = None
    parent_run: str | None = None
    input_explicit: bool = False
    invocation: Invocation | None = None
    shard: ShardRecord | None = None
    sync: SyncRecord | None = None
    retry_filter: RetryFilter | None = None
    mirror_of: str | None = None  # the run whose vanished keys this deletion run deletes
    mirror_deletes: bool = False
    # A retry-failed run of a delta job delivers its parent's rows: the run they belong to, whose id
    # keeps their idempotency keys the parent's (None: the run's own delivery; docs/delta.md).
    delivery_run: str | None = None
    # The `lookups:` maps frozen in the run: name -> {sha256 of the frozen file, entries} (docs/chains.md).
    lookups: Mapping[str, Mapping[str, Any]] | None = None

    def delivery(self, run_id: str) -> str:
        """The run whose delivery this run's rows are: their idempotency keys' scope."""
        return self.delivery_run or run_id

    def with_input_path(self, path: Path) -> RunPlan:
        return replace(self, input=replace(self.input, path=str(path)))

    @classmethod
    def from_json(cls, fields: JsonFields) -> RunPlan:
        return cls(
            job_path=fields.text("job_path"),
            input=InputRecord.from_json(fields.block("input")),
            config_sha256=fields.text("config_sha256"),
            name=fields.optional_text("name"),
            config_sections=fields.text_map("config_sections"),
            cwd=fields.optional_text("cwd"),
            parent_run=fields.optional_text("parent_run"),
            input_explicit=fields.has("input_explicit") and fields.flag("input_explicit"),
            invocation=_invocation(fields),
            shard=_shard(fields.optional_block("shard")),
            sync=_sync(fields.optional_block("sync")),
            retry_filter=_retry_filter(fields.optional_block("retry_filter")),
            mirror_of=fields.optional_text("mirror_of"),
            mirror_deletes=fields.has("mirror_deletes") and fields.flag("mirror_deletes"),
            delivery_run=fields.optional_text("delivery_run"),
            lookups=fields.raw_object("lookups", optional=True),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "job_path": self.job_path,
            "input": self.input.to_json(),
            "config_sha256": self.config_sha256,
            "parent_run": self.parent_run,
            "input_explicit": self.input_explicit,
        }
        if self.config_sections is not None:
            data["config_sections"] = dict(self.config_sections)
        if self.cwd is not None:
            data["cwd"] = self.cwd
        if self.invocation is not None:
            data["invocation_key"] = self.invocation.key
            data["idempotency_key"] = self.invocation.idempotency_key
        if self.shard is not None:
            data["shard"] = self.shard.to_json()
        if self.sync is not None:
            data["sync"] = self.sync.to_json()
        if self.retry_filter is not None:
            data["retry_filter"] = self.retry_filter.to_json()
        if self.mirror_deletes:
            data["mirror_deletes"] = True
            data["mirror_of"] = self.mirror_of
        if self.delivery_run is not None:
            data["delivery_run"] = self.delivery_run
        if self.lookups:
            data["lookups"] = {name: dict(record) for name, record in self.lookups.items()}
        return data


def _invocation(fields: JsonFields) -> Invocation | None:
    if not fields.has("invocation_key"):
        return None
    return Invocation(fields.text("invocation_key"), fields.optional_text("idempotency_key"))


def _shard(fields: JsonFields | None) -> ShardRecord | None:
    return None if fields is None else ShardRecord(fields.integer("index"), fields.integer("count"))


def _sync(fields: JsonFields | None) -> SyncRecord | None:
    if fields is None:
        return None
    return SyncRecord(
        mode=fields.text("mode"),
        full=fields.flag("full"),
        selected=fields.integer("selected"),
        skipped_unchanged=fields.integer("skipped_unchanged"),
    )


def _retry_filter(fields: JsonFields | None) -> RetryFilter | None:
    if fields is None:
        return None
    return RetryFilter(fields.optional_text("statuses"), fields.optional_text("classification"))


@dataclass(frozen=True)
class RunManifest:
    """A v1 `run.json`: the run's identity, state and times, and the plan it was made with."""

    run_id: str
    state: RunState
    created_at: str
    updated_at: str
    tool_version: str
    plan: RunPlan
    pid: int | None = None  # the relaying process while the run is `running`
    stop_reason: str | None = None  # why the last relay of the run ended early; None when it did not

    @classmethod
    def from_json(cls, path: Path, data: object) -> RunManifest:
        """The manifest `data` read from `path`; `JournalCorrupt` naming the file and the first bad field."""
        fields = _fields(path, data)
        version = fields.integer("version")
        if version != MANIFEST_VERSION:
            raise fields.refuse("version", f"{MANIFEST_VERSION}", version)
        return cls(
            run_id=fields.text("run_id"),
            state=_state(path, fields.optional_text("state")),
            created_at=fields.text("created_at"),
            updated_at=fields.text("updated_at"),
            tool_version=fields.text("tool_version"),
            plan=RunPlan.from_json(fields),
            pid=fields.optional_integer("pid"),
            stop_reason=fields.optional_text("stop_reason"),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "run_id": self.run_id,
            "state": self.state.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "tool_version": self.tool_version,
            **self.plan.to_json(),
        }
        # Absent until the run's first relay starts (pid) and ends (stop_reason), then always written.
        if self.pid is not None or self.state is not RunState.RUNNING:
            data["pid"] = self.pid
        if self.stop_reason is not None or self.state is not RunState.RUNNING:
            data["stop_reason"] = self.stop_reason
        return data

    def running(self, pid: int) -> RunManifest:
        return replace(self, state=RunState.RUNNING, pid=pid)

    def ended(self, state: RunState, stop_reason: str | None) -> RunManifest:
        return replace(self, state=state, stop_reason=stop_reason, pid=None)


def _state(path: Path, value: str | None) -> RunState:
    try:
        return RunState(str(value))
    except ValueError:  # a damaged or hand-edited run.json
        raise JournalCorrupt(
            f"{path}: its state {value!r} is none of {', '.join(RunState)}",
            context={"path": str(path), "field": "state", "state": value},
        ) from None


@dataclass(frozen=True)
class AlphaManifest:
    """The public alpha's `run.json` (a `schema_version`, flat `input_*` fields): what listing it needs."""

    run_id: str
    state: str | None
    name: str | None
    created_at: str | None
    input_total: int | None
    config_path: str | None

    @staticmethod
    def describes(data: object) -> bool:
        return (
            isinstance(data, dict)
            and "schema_version" in data
            and "version" not in data
            and not isinstance(data.get("input"), dict)
        )

    @classmethod
    def from_json(cls, path: Path, data: object) -> AlphaManifest:
        fields = _fields(path, data)
        return cls(
            run_id=fields.text("run_id"),
            state=fields.optional_text("state"),
            name=fields.optional_text("name"),
            created_at=fields.optional_text("created_at"),
            input_total=fields.optional_integer("input_total"),
            config_path=fields.optional_text("config_path"),
        )
