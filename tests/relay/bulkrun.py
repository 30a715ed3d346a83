"""Bulk jobs for tests: a CSV and a `request.bulk_job` job file against the embedded target's Salesforce-
like ingest API (demo/bulktarget.py), and a run of it in-process."""

from __future__ import annotations

import copy
import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bulkrelay.demo.target import RunningTarget
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay.engine import StartPoint, relay
from bulkrelay.relay.metrics import RelayStats
from bulkrelay.relay.progress import NullReporter, Reporter
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import Transport, TransportSettings
from bulkrelay.store.journal import read_journal
from bulkrelay.store.rundir import RunDir
from tests.relay.batchrun import BatchRun

FAST_POLL = {"first_seconds": 0.01, "max_seconds": 0.05}
SHORT_WAIT = {"first_seconds": 0.01, "max_seconds": 0.02, "max_wait": "300ms"}

JOB = "/jobs/ingest/{job}"
GENERIC_STEPS: dict[str, Any] = {  # kind: generic speaking demo/bulktarget.py's API
    "create": {"method": "POST", "path": "/jobs/ingest", "json": {"object": "Contact"}, "id": "/id"},
    "upload": {"method": "PUT", "path": f"{JOB}/batches"},
    "close": {"method": "PATCH", "path": JOB, "json": {"state": "UploadComplete"}},
    "abort": {"method": "PATCH", "path": JOB, "json": {"state": "Aborted"}},
    "status": {"path": JOB, "state": "/state", "error": "/errorMessage"},
    "results": [
        {"path": f"{JOB}/successfulResults", "outcome": "success", "capture": ["sf__Id"]},
        {"path": f"{JOB}/failedResults", "outcome": "failed", "error_column": "sf__Error"},
        {"path": f"{JOB}/unprocessedrecords", "outcome": "unprocessed"},
    ],
    "open_states": ["Open"],
    "done_states": ["JobComplete"],
    "failed_states": ["Failed"],
    "aborted_states": ["Aborted"],
}


GENERIC_NAMES = ["ann", "bob", "bogus-cy", "dan", "later-eve", "fay"]


def generic_json_steps() -> dict[str, Any]:
    """GENERIC_STEPS speaking JSON: the rows uploaded as {"records": [...]}, the results read as JSON."""
    steps = copy.deepcopy(GENERIC_STEPS)
    steps["upload"] |= {"format": "json", "json": {"records": []}, "rows_at": "/records"}
    success, failed, unprocessed = steps["results"]
    success |= {
        "path": success["path"] + ".json",
        "format": "json",
        "items": "/records",
        "capture": ["/sf__Id"],
    }
    del failed["error_column"]
    failed |= {"path": failed["path"] + ".json", "format": "json", "items": "/records", "error": "/sf__Error"}
    unprocessed |= {"path": unprocessed["path"] + ".json", "format": "json", "items": "/records"}
    unprocessed["key"] = "/External_Id__c"  # the default, said
    return steps


def write_generic_job(tmp_path: Path, url: str, names: list[str] | None = None, **bulk: Any) -> Path:
    """A `kind: generic` job speaking the ingest API (GENERIC_STEPS) over `names` (GENERIC_NAMES)."""
    job = write_bulk_job(tmp_path, url, names or GENERIC_NAMES, kind="generic", steps=GENERIC_STEPS, **bulk)
    spec = yaml.safe_load(job.read_text())
    for key in ("object", "operation", "external_id_field"):
        del spec["request"]["bulk_job"][key]
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


ARCHIVED = {
    "url_at": "/response_body_url",
    "archive": "tar.gz",
    "format": "json",
    "items": "",  # each JSON file is the list itself
    "key": "/operation_id",
    "status": "/status_code",
    "error": "/response",
    "capture": ["/response"],
}


def write_batches_job(
    tmp_path: Path, url: str, names: list[str], *, submit: bool = False, **archived: Any
) -> Path:
    """Rows as Mailchimp batch operations (operation_id: the row's key) to the demo's batches API
    (demo/batchopstarget.py), results from the archive (ARCHIVED, changed by `archived`). `submit`: the
    operations go in the request that makes the batch, as Mailchimp takes them (no create,
    resubmit: safe); else the batch is made empty and given them after (the demo's two-step form)."""
    job = write_bulk_job(tmp_path, url, names, kind="generic", steps=GENERIC_STEPS)
    spec = yaml.safe_load(job.read_text())
    bulk = spec["request"]["bulk_job"]
    for key in ("object", "operation", "external_id_field"):
        del bulk[key]
    bulk["base_url"] = f"{url}/3.0"
    bulk["columns"] = {
        "operation_id": {"from": "id"},
        "method": {"value": "PUT"},
        "path": {"value": "/lists/abc/members"},
        "body": {"from": "email"},
    }
    bulk["steps"] = {
        "create": {"method": "POST", "path": "/batches", "json": {}, "id": "/id"},
        "upload": {
            "method": "PUT",
            "path": "/batches/{job}/operations",
            "format": "json",
            "json": {"operations": []},
            "rows_at": "/operations",
        },
        "abort": {"method": "DELETE", "path": "/batches/{job}"},
        "status": {"path": "/batches/{job}", "state": "/status"},
        "results": [{**ARCHIVED, **archived}],
        "done_states": ["finished"],
        "open_states": ["open"],
        "aborted_states": ["canceled"],
    }
    if submit:
        steps = bulk["steps"]
        del steps["create"], steps["abort"], steps["open_states"]
        steps["upload"] |= {"method": "POST", "path": "/batches", "id": "/id"}
        steps["resubmit"] = "safe"
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job


def bulk_job_spec(target_url: str, **bulk: Any) -> dict[str, Any]:
    """A job upserting rows.csv's rows as Contacts, keyed by `id` (the External_Id__c column)."""
    return {
        "version": 1,
        "input": {"file": "rows.csv", "key": "id"},
        "request": {
            "headers": {"Authorization": "Bearer ${SF_TOKEN}"},
            "bulk_job": {
                "kind": "salesforce_bulk2",
                "base_url": f"{target_url}/services/data/v62.0",
                "object": "Contact",
                "operation": "upsert",
                "external_id_field": "External_Id__c",
                "columns": {"External_Id__c": {"from": "id"}, "Email": {"from": "email"}},
                "max_rows": 4,
                "poll": dict(FAST_POLL),
                **bulk,
            },
        },
        "retry": {"max_attempts": 3},
    }


def write_bulk_job(tmp_path: Path, target_url: str, names: list[str], **bulk: Any) -> Path:
    """rows.csv: one row per name (id `k<n>-<name>`, so a name holding `bogus` or `later` steers the
    target), and job.yaml."""
    with (tmp_path / "rows.csv").open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["id", "email"])
        for n, name in enumerate(names, start=1):
            writer.writerow([f"k{n}-{name}", f"{name}@example.com"])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bulk_job_spec(target_url, **bulk), sort_keys=False))
    return path


async def run_bulk_job(
    job_path: Path,
    target: RunningTarget,
    *,
    run: RunDir | None = None,
    runs: Path | None = None,
    stats: RelayStats | None = None,
    env: dict[str, str] | None = None,
    reporter: Reporter | None = None,
    transport_factory: Callable[[TransportSettings], Transport] = open_transport,
) -> BatchRun:
    """Preflight and relay the job in-process into a new run directory (in `runs`, else beside the job;
    or `run`, from its start). The environment holds SF_TOKEN and SF_INSTANCE (the target), and
    HUBSPOT_TOKEN and HUBSPOT_BASE (the same), and `env`."""
    env = {"SF_TOKEN": "tok-secret", "SF_INSTANCE": target.url, **(env or {})}
    env |= {"HUBSPOT_TOKEN": "tok-secret", "HUBSPOT_BASE": target.url}
    preflight = run_preflight(load_job(job_path), None, env=env)
    run = run or RunDir.create(runs or job_path.parent / "runs", plan_for(preflight))
    outcome = await relay(
        preflight,
        run,
        StartPoint(),
        stop=StopControl(),
        reporter=reporter or NullReporter(),
        stats=stats,
        transport_factory=transport_factory,
    )
    return BatchRun(outcome, list(read_journal(run.journal_path)), target.state.requests(), run)


def with_poll(job_path: Path, poll: dict[str, Any]) -> Path:
    """The job file with `request.bulk_job.poll` set to `poll`."""
    spec = yaml.safe_load(job_path.read_text())
    spec["request"]["bulk_job"]["poll"] = poll
    job_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job_path


def assert_stopped_unread(result: BatchRun, message: str) -> None:
    """An answer that could not be read was asked again until max_wait: the call stopped resumably, no
    row journaled (the job may have run: none may fail for retry-failed to send again), the stop naming
    the answer."""
    assert result.outcome.stop_reason is StopReason.TIMEOUT, result.outcome
    assert result.entries == []
    assert message in str(result.outcome.stop_detail.get("unreadable")), result.outcome.stop_detail


def with_auth(job_path: Path, auth: dict[str, Any]) -> Path:
    """The job file with `request.auth` in place of its Authorization header."""
    spec = yaml.safe_load(job_path.read_text())
    del spec["request"]["headers"]
    spec["request"]["auth"] = auth
    job_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return job_path


def write_kind_job(tmp_path: Path, target_url: str, names: list[str], kind: str) -> Path:
    """A job of `kind` (salesforce_bulk2, generic speaking the ingest API, named_import) over `names`."""
    if kind == "named_import":
        return write_bulk_job(tmp_path, target_url, names, kind=kind, base_url=target_url, object="0-1")
    if kind == "salesforce_bulk2":
        return write_bulk_job(tmp_path, target_url, names)
    return write_generic_job(tmp_path, target_url, names)
