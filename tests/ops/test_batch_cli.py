"""Batch mode through the real CLI, per row: failures, export --failed, retry-failed, delta sync, shards."""

from __future__ import annotations

import csv
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.ops.report import facts_of
from bulkrelay.report.reportdata import read_timeline, tally_journal
from bulkrelay.store.journal import read_journal
from bulkrelay.store.rundir import RunDir
from tests.clirun import run_cli
from tests.relay.batchrun import write_batch_job
from tests.targetproc import TargetProcess


@pytest.mark.slow
def test_failed_rows_of_a_batch_run_are_reported_exported_and_retried_per_row(tmp_path: Path) -> None:
    names = [f"user{n}" for n in range(1, 11)]
    names[2], names[8] = "bogus3", "bogus9"
    with TargetProcess() as target:
        job = write_batch_job(tmp_path, target.url, "hubspot", names, max_items=4)
        first = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
        run_dir = first.data["run_dir"]
        failures = run_cli("failures", run_dir, cwd=tmp_path)
        exported = run_cli("export", run_dir, "--failed", "-o", tmp_path / "failed.csv", cwd=tmp_path)
        target.set_plan({"batch": {"fail_contains": "nothing-fails"}})
        target.reset()
        retried = run_cli("retry-failed", run_dir, "--budget", "0", cwd=tmp_path)
        resent = target.requests()
    [group] = failures.data["groups"]
    assert group["count"] == 2 and group["classification"] == "item_rejected"
    assert {e["row_number"] for e in group["examples"]} == {3, 9}
    assert exported.exit_code == ExitCode.SUCCESS, exported.envelope
    with (tmp_path / "failed.csv").open() as rows:
        assert [row["id"] for row in csv.DictReader(rows)] == ["3", "9"]
    assert retried.exit_code == ExitCode.SUCCESS, retried.envelope
    [request] = resent  # the two failed rows, in one batch
    assert [i["id"] for i in orjson.loads(request["body"])["inputs"]] == [
        "bogus3@example.com",
        "bogus9@example.com",
    ]
    entries = list(read_journal(Path(retried.data["run_dir"]) / "results.jsonl"))
    assert sorted(e.row_number for e in entries) == [3, 9] and all(e.success for e in entries)


@pytest.mark.slow
def test_retry_failed_resends_items_an_answer_failed_under_keys_of_its_own(tmp_path: Path) -> None:
    # Every item is answered 429 the first two times its id is seen, in a 200 answer; two attempts, so
    # the run fails all four rows (its first request and one numbered resend). Under those requests'
    # keys a target that keeps keys would replay both answers to retry-failed, and its rows would
    # never reach it again: retry-failed's requests carry keys of its own, its items their ids.
    names = [f"busy{n}" for n in range(1, 5)]
    with TargetProcess({"dedup": True, "batch": {"retry_times": 2}}) as target:
        job = write_batch_job(tmp_path, target.url, "elasticsearch", names, retry={"max_attempts": 2})
        first = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
        first_keys = {r["idempotency_key"] for r in target.requests()}
        retried = run_cli("retry-failed", first.data["run_dir"], "--budget", "0", cwd=tmp_path)
        resent = target.requests()[2:]  # the target keeps its answers: no reset
        stats = target.stats()
    assert len(first_keys) == 2
    assert retried.exit_code == ExitCode.SUCCESS, retried.envelope
    assert [r["duplicate"] for r in resent] == [False]
    assert not first_keys & {r["idempotency_key"] for r in resent}
    assert stats["distinct_items_applied"] == 4 and stats["items_applied_twice"] == []
    entries = list(read_journal(Path(retried.data["run_dir"]) / "results.jsonl"))
    assert sorted(e.row_number for e in entries) == [1, 2, 3, 4] and all(e.success for e in entries)


@pytest.mark.slow
def test_a_delta_batch_run_sends_only_the_changed_rows(tmp_path: Path) -> None:
    names = [f"user{n}" for n in range(1, 9)]
    with TargetProcess() as target:
        job = write_batch_job(
            tmp_path, target.url, "hubspot", names, max_items=4, execution={"sync": "delta", "concurrency": 2}
        )
        first = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        assert first.exit_code == ExitCode.SUCCESS, first.envelope
        rows = (tmp_path / "rows.csv").read_text().replace("user5@example.com", "changed5@example.com")
        (tmp_path / "rows.csv").write_text(rows)
        target.reset()
        second = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        resent = target.requests()
    assert second.exit_code == ExitCode.SUCCESS, second.envelope
    [request] = resent
    assert [i["id"] for i in orjson.loads(request["body"])["inputs"]] == ["changed5@example.com"]


@pytest.mark.slow
def test_shards_each_batch_their_own_rows(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_batch_job(
            tmp_path, target.url, "hubspot", [f"user{n}" for n in range(1, 41)], max_items=10
        )
        shards = [run_cli("run", job, "--budget", "0", "--shard", f"{k}/2", cwd=tmp_path) for k in (0, 1)]
        requests = target.requests()
    journaled = []
    for shard in shards:
        assert shard.exit_code == ExitCode.SUCCESS, shard.envelope
        journaled.append([e.row_number for e in read_journal(Path(shard.data["run_dir"]) / "results.jsonl")])
    assert sorted(journaled[0] + journaled[1]) == list(range(1, 41))
    assert journaled[0] and journaled[1]
    sent = [len(orjson.loads(r["body"])["inputs"]) for r in requests]
    assert sum(sent) == 40 and max(sent) <= 10
    assert len(sent) <= sum(-(-len(rows) // 10) for rows in journaled)  # full batches of each shard's rows


@pytest.mark.slow
def test_mirror_deletes_of_a_batch_job_are_single_requests(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_batch_job(
            tmp_path, target.url, "hubspot", [f"user{n}" for n in range(1, 7)], max_items=4,
            execution={"sync": "mirror", "concurrency": 2},
            mirror={"url": f"{target.url}/crm/v3/objects/contacts/{{id}}", "max_deletes": 3},
        )  # fmt: skip
        first = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        assert first.exit_code == ExitCode.SUCCESS, first.envelope
        lines = (tmp_path / "rows.csv").read_text().splitlines()
        (tmp_path / "rows.csv").write_text(
            "\n".join(line for line in lines if not line.startswith("3,")) + "\n"
        )
        target.reset()
        second = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        sent = target.requests()
    assert second.exit_code == ExitCode.SUCCESS, second.envelope
    assert second.data["mirror"]["deletions"] == 1
    assert [(r["method"], r["path"]) for r in sent] == [("DELETE", "/crm/v3/objects/contacts/3")]


@pytest.mark.slow
def test_retry_failed_of_rows_whose_answer_was_not_read_says_they_may_have_been_applied(
    tmp_path: Path,
) -> None:
    rule = {"match": {"method": "POST"}, "status": 200, "body": "x" * 1000, "repeat": 1100}  # over 1 MiB
    with TargetProcess({"rules": [rule]}) as target:
        job = write_batch_job(tmp_path, target.url, "braze", [f"user{n}" for n in range(1, 6)], max_items=5)
        first = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        target.set_plan({})
        retried = run_cli("retry-failed", first.data["run_dir"], "--budget", "0", cwd=tmp_path)
    assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
    entries = list(read_journal(Path(first.data["run_dir"]) / "results.jsonl"))
    assert all("the target may have applied" in (e.error or "") for e in entries)
    assert retried.exit_code == ExitCode.SUCCESS, retried.envelope
    [warning] = [w for w in retried.envelope["warnings"] if w["code"] == "ANSWER_UNREAD_RESENT"]
    assert warning["context"]["rows"] == 5


@pytest.mark.slow
def test_a_batched_run_at_a_byte_limit_counts_requests_splits_and_retries_apart(tmp_path: Path) -> None:
    """One 413 for the size it learns, then batches no larger than the size last accepted; the summary
    counts requests by status, the split apart from retries (a split counted as a retry, and every batch
    sent full size, refused and split again, before)."""
    names = [f"user{n}" for n in range(1, 201)]
    with TargetProcess({"batch": {"max_body_bytes": 2500}}) as target:
        job = write_batch_job(
            tmp_path, target.url, "array", names, max_items=50, execution={"concurrency": 1}
        )
        metrics = tmp_path / "run.prom"
        result = run_cli("run", job, "--budget", "0", "--metrics-file", metrics, cwd=tmp_path)
        statuses = [request["status"] for request in target.requests()]
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert statuses.count(413) == 1 and statuses[0] == 413
    requests = result.data["summary"]["requests"]
    assert requests == {
        "sent": len(statuses),
        "by_status": {"200": len(statuses) - 1, "413": 1},
        "retries": 0,
        "splits": 1,
    }
    stored = orjson.loads((Path(result.data["run_dir"]) / "summary.json").read_bytes())
    assert stored["requests"] == requests
    assert "bulkrelay_batch_splits_total{" in metrics.read_text()
    assert 'bulkrelay_batch_splits_total{job_name="job"} 1.0' in metrics.read_text()
    run = RunDir.open(Path(result.data["run_dir"]))
    facts = facts_of(run, tally_journal(run.journal_path), read_timeline(run.path))
    assert facts.requests is not None and facts.requests.to_json() == requests  # the report's data
