"""A run in worker processes beside the rest of BulkRelay, with real processes: a delta night, `--shard`
with workers, a lookup of another job's results, the results sink and the metrics file. Each is what
one process would have done, row for row."""

from __future__ import annotations

import sqlite3
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from tests.background.jobcli import cli, worker_pid
from tests.clirun import run_cli
from tests.jobfiles import make_rows, write_csv, write_job
from tests.runfiles import metric, read_metrics
from tests.runsteps import assert_each_row_once, sent_ids
from tests.taggedjobs import tag_rule
from tests.taggedjobs import write_job as tagged_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_S, wait_for
from tests.workerprocs import wait_until_gone, workers_of

pytestmark = [pytest.mark.slow, pytest.mark.target_plan({"dedup": True})]  # real processes

ROWS = 400
KEYED: dict[str, Any] = {
    "input": {"key": "id"},
    "request": {"idempotency_key": {"header": "Idempotency-Key"}},
}


def _run(tmp_path: Path, job: Path, *extra: str) -> Any:
    result = run_cli("run", job, "--budget", "0", *extra, cwd=tmp_path)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    return result


def test_a_delta_night_in_workers_sends_exactly_the_changed_rows(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, ROWS, **KEYED, execution={"sync": "delta", "workers": 3})
    _run(tmp_path, job)
    assert sent_ids(target) == Counter({str(n): 1 for n in range(1, ROWS + 1)})
    target.reset()
    rows = make_rows(ROWS)
    changed = (3, 77, 201, 399)
    for n in changed:
        rows[n - 1]["email"] = f"changed{n}@example.com"
    write_csv(tmp_path / "data.csv", rows)

    second = _run(tmp_path, job)

    assert sent_ids(target) == Counter({str(n): 1 for n in changed})
    assert second.data["summary"]["skipped_unchanged"] == ROWS - len(changed)
    verify = run_cli("sync-state", "verify", job, cwd=tmp_path)
    assert verify.exit_code == ExitCode.SUCCESS, verify.envelope


def test_shards_with_workers_send_every_row_once_between_them(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, ROWS, **KEYED, execution={"workers": 2, "concurrency": 4})
    runs = []
    for shard in ("0/2", "1/2"):
        result = _run(tmp_path, job, "--shard", shard, "--runs-dir", str(tmp_path / f"runs-{shard[0]}"))
        run_dir = Path(result.data["run_dir"])
        logs = [path.read_bytes() for path in (run_dir / "workers").iterdir()]
        assert len(logs) == 2 and logs == [b"", b""]
        runs.append(run_dir)

    assert sent_ids(target) == Counter({str(n): 1 for n in range(1, ROWS + 1)})
    journaled = sorted(e.row_number for run in runs for e in read_journal(run / "results.jsonl"))
    assert journaled == list(range(1, ROWS + 1))


def test_a_lookup_of_another_jobs_results_reaches_every_worker(tmp_path: Path, target: TargetProcess) -> None:
    accounts = write_job(
        tmp_path,
        target.url,
        30,
        job_name="accounts.yaml",
        input_name="accounts.csv",
        name="accounts",
        input={"file": "accounts.csv", "key": "id"},
        response={"capture": {"id": "/id"}},
    )
    parent = _run(tmp_path, accounts)
    entries = read_journal(Path(parent.data["run_dir"]) / "results.jsonl")
    ids = {str(e.key): e.captured["id"] for e in entries if e.captured is not None}
    write_csv(tmp_path / "contacts.csv", [{"id": f"c{n}", "account": str(n % 30 + 1)} for n in range(1, 121)])
    contacts = tmp_path / "contacts.yaml"
    lookup = {"lookup": "account_ids", "key": {"from": "account"}}
    contacts.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "contacts",
                "input": {"file": "contacts.csv", "key": "id"},
                "lookups": {"account_ids": {"results_of": "accounts", "value": "/captured/id"}},
                "request": {
                    "method": "POST",
                    "url": f"{target.url}/contacts/{{id}}",
                    "json": {"accountId": lookup},
                },
                "execution": {"concurrency": 4, "workers": 2},
            }
        )
    )
    target.reset()

    _run(tmp_path, contacts)

    sent = {
        r["path"].rsplit("/", 1)[-1]: orjson.loads(r["body"])["accountId"]
        for r in target.requests()
        if r["path"].startswith("/contacts/")
    }
    assert sent == {f"c{n}": ids[str(n % 30 + 1)] for n in range(1, 121)}


def test_the_results_sink_and_the_metrics_file_count_every_workers_rows(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(
        tmp_path,
        target.url,
        ROWS,
        **KEYED,
        results={"to": "sqlite:///results.db"},
        execution={"workers": 3, "concurrency": 6},
    )

    result = _run(tmp_path, job, "--metrics-file", str(tmp_path / "run.prom"))

    assert_each_row_once(result.data["run_dir"], ROWS)
    with sqlite3.connect(tmp_path / "results.db") as db:
        assert db.execute("SELECT count(*) FROM bulkrelay_results").fetchone() == (ROWS,)
    samples = read_metrics(tmp_path / "run.prom")
    assert metric(samples, "bulkrelay_rows", outcome="succeeded") == ROWS
    assert metric(samples, "bulkrelay_requests_total", status_class="2xx") == ROWS  # the workers sent them


def test_retry_failed_in_workers_sends_only_the_failed_rows_and_export_reads_the_one_journal(
    tmp_path: Path, target: TargetProcess
) -> None:
    bad = {n: "bad" for n in (5, 50, 150, 151, 390)}
    job = tagged_job(tmp_path, target.url, ROWS, tags=bad, execution={"workers": 2, "concurrency": 4})
    target.set_plan({"rules": [tag_rule("bad", status=422)]})
    first = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
    failed = tmp_path / "failed.csv"
    exported = run_cli("export", first.data["run_dir"], "--failed", "-o", str(failed), cwd=tmp_path)
    assert exported.exit_code == ExitCode.SUCCESS, exported.envelope
    assert [line.split(",")[0] for line in failed.read_text().splitlines()[1:]] == [
        str(n) for n in sorted(bad)
    ]
    target.set_plan({})
    target.reset()

    retried = run_cli("retry-failed", first.data["run_dir"], "--budget", "0", "--workers", "2", cwd=tmp_path)

    assert retried.exit_code == ExitCode.SUCCESS, retried.envelope
    assert sorted(int(orjson.loads(r["body"])["id"]) for r in target.requests()) == sorted(bad)
    assert len(list((Path(retried.data["run_dir"]) / "workers").iterdir())) == 2


@pytest.mark.target_plan({"rules": [tag_rule("slow", delay_ms=3000)]})
def test_job_cancel_of_a_background_run_in_workers_stops_them_all_with_every_effect_journaled(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = tagged_job(
        tmp_path,
        target.url,
        40,
        tags={n: "slow" for n in range(5, 41)},
        execution={"workers": 2, "concurrency": 4, "timeout": {"read_seconds": HANG_S}},
    )
    started = cli(tmp_path, "run", job, "--budget", "500ms")
    assert started.exit_code == ExitCode.INCOMPLETE, started.envelope
    job_id = started.data["job_id"]
    wait_for(lambda: target.stats()["requests"] >= 8, "four rows in flight")
    relays = workers_of(worker_pid(tmp_path, job_id))
    assert len(relays) == 2

    cancel = cli(tmp_path, "job", "cancel", job_id, "--budget", HANG_BUDGET)

    assert (cancel.data["state"], cancel.data["run_state"]) == ("cancelled", "cancelled"), cancel.envelope
    wait_until_gone(relays)
    rows = list(read_journal(Path(cancel.data["run_dir"]) / "results.jsonl"))
    stats = target.stats()
    assert stats["effects"] == stats["requests"] == len(rows)  # every effect has its journal line
    assert all(row.success for row in rows) and 8 <= len(rows) < 40


# Answers in 5 ms: a worker's rows in flight end at once, and 20,000 rows at concurrency 8 last over 12 s,
# so no machine finishes the run before the cancel reaches it.
@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 5}]})
def test_job_cancel_of_workers_answering_fast_ends_cancelled_every_time(
    tmp_path: Path, target: TargetProcess
) -> None:
    """A cancel signals the job's own process, which stops its workers as cancelled. Signalled too (the
    job's whole process group), a worker that answers its rows in flight fast stopped as terminated
    before the job read its cancel, in about half the tries: the run ended `stopped`, and the identical
    call continued it instead of starting afresh."""
    job = tagged_job(tmp_path, target.url, 20_000, tags={}, execution={"workers": 2, "concurrency": 8})
    for attempt in range(3):
        runs_dir = str(tmp_path / f"runs-{attempt}")
        sent_before = target.stats()["requests"]
        started = cli(tmp_path, "run", job, "--budget", "500ms", "--runs-dir", runs_dir)
        assert started.exit_code == ExitCode.INCOMPLETE, started.envelope
        job_id = started.data["job_id"]
        wait_for(partial(_sent_since, target, sent_before, 100), "both workers relaying")

        cancel = cli(tmp_path, "job", "cancel", job_id, "--budget", HANG_BUDGET)

        assert (cancel.data["state"], cancel.data["run_state"]) == ("cancelled", "cancelled"), cancel.envelope


def _sent_since(target: TargetProcess, before: int, count: int) -> bool:
    return bool(target.stats()["requests"] >= before + count)
