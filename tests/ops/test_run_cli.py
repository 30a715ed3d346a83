"""`bulkrelay run` as a user sees it: a real CLI process relaying to a real loopback target process.

The job file writer, the synchronous CLI run and the readers of the journal and the target's view are
tests/taggedjobs.py's, shared with the other real-process tests.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast
from urllib.parse import quote, quote_plus

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.ops.lifecycle import summary_counts
from bulkrelay.relay.engine import Committed, RelayOutcome
from bulkrelay.store.journal import encode_line
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.summary import SummaryCounts, summarize
from tests.clirun import cli_env, run_cli
from tests.runplans import delivered_entry
from tests.taggedjobs import journal, run_job, tag_rule, write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

# --------------------------------------------------------------------------------- retries, failures


def test_retries_that_succeed(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"first_attempts": 2, "status": 503}]}) as target:
        job = write_job(tmp_path, target.url, rows=12, retry={"max_attempts": 3})
        result = run_job(job)
        assert target.stats()["by_status"] == {"200": 12, "503": 24}
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert result.data["state"] == "completed"
    entries = journal(result.data["run_dir"])
    assert sorted(e["row_number"] for e in entries) == list(range(1, 13))
    assert {(e["success"], e["attempts"], e["status_code"], e["classification"]) for e in entries} == {
        (True, 3, 200, "success")
    }
    summary = result.data["summary"]
    assert (summary["attempts"], summary["retries"]) == (36, 24)


def test_no_trusted_ca_is_a_precondition_and_the_same_call_later_finishes_the_run(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=5)
        missing = str(tmp_path / "no-such-ca.pem")
        refused = run_job(job, env=cli_env(SSL_CERT_FILE=missing, SSL_CERT_DIR=missing))
        assert refused.exit_code == ExitCode.PRECONDITION, refused.envelope
        assert refused.envelope["error"]["code"] == "TLS_UNAVAILABLE"
        assert "SSL_CERT_FILE" in refused.envelope["error"]["suggestion"]
        assert target.stats()["requests"] == 0
        finished = run_job(job)
        assert target.stats()["requests"] == 5
    assert finished.exit_code == ExitCode.SUCCESS, finished.envelope
    runs = [path for path in (tmp_path / "runs").iterdir() if not path.name.startswith(".")]
    assert runs == [Path(finished.data["run_dir"])]  # the refused call's run, continued


def test_client_errors_are_permanent_failures_with_truncated_bodies(tmp_path: Path) -> None:
    body = "invalid email: " + "x" * 5000
    plan = {"rules": [tag_rule("bad", status=422, body=body)]}
    with TargetProcess(plan) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=30,
            tags={3: "bad", 17: "bad", 29: "bad"},
            retry={"max_attempts": 3},
            response={"failure_body_bytes": 100},
        )
        result = run_job(job)
        assert target.stats()["requests"] == 30  # a 422 is never retried
    assert result.exit_code == ExitCode.PARTIAL_FAILURE
    assert result.error_code == "PARTIAL_FAILURE"
    assert result.data["state"] == "completed_with_failures"
    failed = [e for e in journal(result.data["run_dir"]) if not e["success"]]
    assert sorted(e["row_number"] for e in failed) == [3, 17, 29]
    for entry in failed:
        assert entry["classification"] == "http_client_error"
        assert (entry["status_code"], entry["attempts"], entry["retryable"]) == (422, 1, False)
        assert entry["error"] == "HTTP 422"
        assert entry["response_body"] == body[:100]


def test_summary_counts_equal_the_journal(tmp_path: Path) -> None:
    plan = {
        "rules": [
            tag_rule("bad", status=422),
            tag_rule("flaky", first_attempts=1, status=502),
            tag_rule("down", status=503),
        ]
    }
    tags = {n: ("bad", "flaky", "down", "plain")[n % 4] for n in range(1, 41)}
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, rows=40, tags=tags, retry={"max_attempts": 2})
        result = run_job(job)
    assert result.exit_code == ExitCode.PARTIAL_FAILURE
    entries = journal(result.data["run_dir"])
    expected_status: dict[str, int] = {}
    expected_class: dict[str, int] = {}
    for e in entries:
        expected_status[str(e["status_code"])] = expected_status.get(str(e["status_code"]), 0) + 1
        expected_class[e["classification"]] = expected_class.get(e["classification"], 0) + 1
    ok = sum(e["success"] for e in entries)
    attempts = sum(e["attempts"] for e in entries)
    on_disk = orjson.loads((Path(result.data["run_dir"]) / "summary.json").read_bytes())
    for summary in (result.data["summary"], on_disk):
        assert summary["by_outcome"] == {"succeeded": ok, "failed": len(entries) - ok}
        assert summary["by_status"] == expected_status
        assert summary["by_classification"] == expected_class
        assert (summary["attempts"], summary["retries"]) == (attempts, attempts - len(entries))
        assert (summary["rows_total"], summary["rows_done"], summary["rows_pending"]) == (40, 40, 0)
    assert expected_class == {"success": 20, "http_client_error": 10, "http_server_error": 10}
    assert result.data["progress"] == {"done": 40, "total": 40, "unit": "rows", "ok": 20, "failed": 20}


# ------------------------------------------------------------------------- envelope, read-only commands


def test_run_envelope_fields(tmp_path: Path) -> None:
    with TargetProcess() as target:
        result = run_job(write_job(tmp_path, target.url, rows=5))
    envelope = result.envelope
    assert envelope["ok"] is True and envelope["error"] is None and envelope["warnings"] == []
    assert envelope["meta"]["exit_code"] == 0 and envelope["meta"]["duration_ms"] >= 0
    data = envelope["data"]
    assert set(data) >= {"run_id", "run_dir", "state", "progress", "summary"}
    assert "continue_command" not in data
    run_dir = Path(data["run_dir"])
    assert run_dir.parent == tmp_path / "runs" and run_dir.name == data["run_id"]
    assert {p.name for p in run_dir.iterdir()} >= {"run.json", "results.jsonl", "summary.json"}
    assert not (run_dir / "checkpoint.json").exists()  # a completed run keeps none (REQ-C-035)
    manifest = orjson.loads((run_dir / "run.json").read_bytes())
    assert manifest["state"] == "completed"
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert (summary["rows_done"], summary["by_outcome"]) == (5, {"succeeded": 5, "failed": 0})
    assert data["summary"]["this_call"]["rows_committed"] == 5


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(root.rglob("*"))}


def test_status_and_runs_read_without_changing(tmp_path: Path) -> None:
    with TargetProcess() as target:
        first = run_job(write_job(tmp_path, target.url, rows=6))
    runs_dir = tmp_path / "runs"
    before = _tree_state(runs_dir)
    status = run_cli("status", first.data["run_dir"])
    listing = run_cli("runs", "--runs-dir", runs_dir)
    assert _tree_state(runs_dir) == before
    assert status.exit_code == ExitCode.SUCCESS
    assert status.data["state"] == "completed" and status.data["live"] is False
    assert status.data["progress"] == {"done": 6, "total": 6, "unit": "rows", "ok": 6, "failed": 0}
    assert status.data["summary"]["by_outcome"] == {"succeeded": 6, "failed": 0}
    assert [r["run_id"] for r in listing.data["runs"]] == [first.data["run_id"]]
    assert listing.data["runs"][0]["done"] == 6


def test_runs_skips_a_damaged_run_json_with_a_warning_naming_it(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        good = run_job(job)
        damaged = run_job(job, "--idempotency-key", "another-run")  # a second, separate run
    assert good.exit_code == damaged.exit_code == ExitCode.SUCCESS
    damaged_dir = Path(damaged.data["run_dir"])
    (damaged_dir / "run.json").write_bytes(b'{"run_id": "truncat')

    listing = run_cli("runs", "--runs-dir", tmp_path / "runs")
    assert listing.exit_code == ExitCode.SUCCESS, listing.envelope
    assert [r["run_id"] for r in listing.data["runs"]] == [good.data["run_id"]]
    (warning,) = listing.envelope["warnings"]
    assert warning["code"] == "RUN_UNREADABLE"
    assert warning["context"]["run_dir"] == str(damaged_dir)
    assert str(damaged_dir) in warning["message"]


# --------------------------------------------------------------------------------- secrets

SECRET = "tok-5ecr3t-Zq81xv"


def test_no_secret_is_ever_written(tmp_path: Path) -> None:
    # The target echoes the token back in failure bodies and in a header; a reset row puts an
    # exception text in the journal. None of it may carry the secret.
    plan = {
        "rules": [
            tag_rule("bad", status=400, body=f"bad token Bearer {SECRET} for you"),
            tag_rule("gone", status=500, body={"echo": SECRET}, headers={"X-Echo": SECRET}),
            tag_rule("reset", reset=True),
        ]
    }
    env = cli_env(API_TOKEN=SECRET)
    with TargetProcess(plan) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=12,
            tags={2: "bad", 5: "gone", 7: "reset"},
            request={"headers": {"Authorization": "Bearer ${API_TOKEN}"}},
            response={"capture": {"remote_id": "/id"}},
        )
        result = run_job(job, env=env)
        sent = target.requests()
    assert all(r["headers"].get("Authorization") == f"Bearer {SECRET}" for r in sent)  # it was used
    assert result.exit_code == ExitCode.PARTIAL_FAILURE
    by_row = {e["row_number"]: e for e in journal(result.data["run_dir"])}
    assert "***" in by_row[2]["response_body"] and "***" in by_row[5]["response_body"]
    assert by_row[7]["classification"] == "protocol_error"
    status = run_cli("status", result.data["run_dir"], env=env)
    outputs = [result.stdout, result.stderr.encode(), status.stdout, status.stderr.encode()]
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "job.yaml"]
    assert len(files) >= 5
    for blob in outputs + [p.read_bytes() for p in files]:
        assert SECRET.encode() not in blob


TOKEN = (
    'tk-5"ecr\\3t Zq81+xv/A7c9Lm'  # a quote, a backslash, a space, + and /: spelled differently everywhere
)
PASSWORD = 'pw-"Qx81 v+Lm9s!'  # in the URL: reqwest sends it as Basic auth, base64("svc:" + PASSWORD)


def _spellings(secret: str) -> list[bytes]:
    """The secret as it could appear in a file or an envelope: as is, JSON-escaped, encoded."""
    forms = [secret, orjson.dumps(secret).decode()[1:-1], quote(secret, safe=""), quote_plus(secret)]
    return [form.encode() for form in forms] + [base64.b64encode(secret.encode())]


def _leaks(blob: bytes) -> list[bytes]:
    """Every 8-character piece of a secret's spellings found in `blob`."""
    basic = base64.b64encode(f"svc:{PASSWORD}".encode())
    spellings = [*_spellings(TOKEN), *_spellings(PASSWORD), basic]
    pieces = {form[i : i + 8] for form in spellings for i in range(len(form) - 7)}
    return sorted(piece for piece in pieces if piece in blob)


def test_an_echoed_secret_is_hidden_in_captures_failure_bodies_export_and_envelopes(tmp_path: Path) -> None:
    # The target echoes the API key and the Basic auth header it got, in a 200 body the job
    # captures and in failure bodies the journal keeps (cut at 120 bytes, inside an echo).
    echoes = (
        '{"id": "7", "token": "{echo_json}", "b64": "{echo_b64}", "link": "https://x.test/?t={echo_url}"}'
    )
    plan = {
        "rules": [
            tag_rule("basic", echo_header="Authorization", body='{"id": "8", "auth": "{echo_json}"}'),
            tag_rule(
                "bad",
                status=400,
                echo_header="X-Api-Key",
                body="bad {echo} {echo_json} {echo_url} {echo_b64}",
            ),
            tag_rule("gone", status=500, echo_header="Authorization", body="who is {echo}?"),
            {"echo_header": "X-Api-Key", "body": echoes},
        ]
    }
    env = cli_env(API_TOKEN=TOKEN, API_PASS=PASSWORD)
    with TargetProcess(plan) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=8,
            tags={2: "basic", 4: "bad", 6: "gone"},
            request={
                "url": f"http://svc:${{API_PASS}}@127.0.0.1:{target.port}/v1/items",
                "headers": {"X-Api-Key": "${API_TOKEN}"},
            },
            response={
                "capture": {
                    "remote_id": "/id",
                    "token": "/token",
                    "b64": "/b64",
                    "link": "/link",
                    "auth": "/auth",
                },
                "failure_body_bytes": 120,
            },
        )
        result = run_job(job, env=env)
        sent = target.requests()
    basic = "Basic " + base64.b64encode(f"svc:{PASSWORD}".encode()).decode()
    assert all(r["headers"]["X-Api-Key"] == TOKEN and r["headers"]["Authorization"] == basic for r in sent)
    assert result.exit_code == ExitCode.PARTIAL_FAILURE, result.envelope
    by_row = {e["row_number"]: e for e in journal(result.data["run_dir"])}
    assert by_row[1]["captured"] == {
        "remote_id": "7",
        "token": "***",
        "b64": "***",
        "link": "https://x.test/?t=***",
        "auth": None,
    }
    assert by_row[2]["captured"]["auth"] == "Basic ***"
    assert by_row[4]["response_body"] == "bad *** *** *** ***"  # the cut at 120 bytes falls in the base64
    assert by_row[6]["response_body"] == "who is Basic ***?"
    run_dir = result.data["run_dir"]
    calls = [
        result,
        run_cli("status", run_dir, env=env),
        run_cli("export", run_dir, "--format", "jsonl", "-o", tmp_path / "export.jsonl", env=env),
        run_cli("export", run_dir, "--format", "csv", "-o", tmp_path / "export.csv", env=env),
    ]
    assert all(call.exit_code == ExitCode.SUCCESS for call in calls[1:]), [c.envelope for c in calls]
    blobs = {f"{c.envelope['meta']}": c.stdout + c.stderr.encode() for c in calls}
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "job.yaml"]
    assert {"results.jsonl", "summary.json", "export.jsonl", "export.csv"} <= {p.name for p in files}
    blobs |= {str(p): p.read_bytes() for p in files}
    assert b"***" in (tmp_path / "export.jsonl").read_bytes()
    assert {name: _leaks(blob) for name, blob in blobs.items() if _leaks(blob)} == {}


# ------------------------------------------------------------------------- after a clean end


def test_completed_run_is_not_resumable(tmp_path: Path) -> None:
    with TargetProcess() as target:
        result = run_job(write_job(tmp_path, target.url, rows=3))
        again = run_cli("resume", result.data["run_dir"], "--budget", "0", cwd=tmp_path)
        assert target.stats()["requests"] == 3
    assert again.exit_code == ExitCode.PRECONDITION
    assert again.error_code == "RUN_NOT_RESUMABLE"
    assert os.path.isdir(result.data["run_dir"])


def test_the_summary_the_relay_counted_equals_the_journal_read_back(tmp_path: Path) -> None:
    # A new run's summary comes from the counts the relay kept as it committed, not a second read of
    # the journal: with failures, retries and statuses of several kinds, both must agree exactly.
    plan = {
        "rules": [
            {"match": {"body_field": "tag", "equals": "bad"}, "status": 422},
            {"match": {"body_field": "tag", "equals": "flaky"}, "status": 503, "times": 2},
        ]
    }
    tags = {3: "bad", 17: "bad", 5: "flaky", 40: "flaky"}
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, 60, tags=tags, retry={"max_attempts": 3})
        result = run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
    assert result.exit_code == ExitCode.PARTIAL_FAILURE, result.envelope
    run_dir = Path(result.data["run_dir"])
    written = orjson.loads((run_dir / "summary.json").read_bytes())
    read_back = summarize(run_dir / "results.jsonl", total_rows=60).to_json()
    assert written["retries"] > 0 and written["by_outcome"]["failed"] > 0
    assert {name: written[name] for name in read_back} == read_back


def test_the_summary_is_read_from_the_journal_when_the_relay_did_not_count_every_line(tmp_path: Path) -> None:
    journal = tmp_path / "results.jsonl"
    entry = delivered_entry(1)
    journal.write_bytes(encode_line(1, entry))
    run = SimpleNamespace(journal_path=journal)
    counted = Committed(total=2, seq=0, offset=0, ok=0, failed=0, counts=SummaryCounts())
    outcome = RelayOutcome(stop_reason=None, committed=counted, elapsed_seconds=1.0)
    # The relay counted nothing, but the journal holds a line: its counts do not cover the file.
    assert summary_counts(cast(RunDir, run), 2, outcome).rows_done == 1
    counts = SummaryCounts()
    counts.add(entry)
    counts.add(entry)  # counted twice on purpose: what is reported shows where it came from
    covering = Committed(total=2, seq=1, offset=journal.stat().st_size, ok=1, failed=0, counts=counts)
    outcome = RelayOutcome(stop_reason=None, committed=covering, elapsed_seconds=1.0)
    assert summary_counts(cast(RunDir, run), 2, outcome).rows_done == 2  # no second read
