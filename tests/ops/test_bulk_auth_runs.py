"""`request.auth` for bulk jobs with real processes: the CLI against the demo target in its own process,
its OAuth2 token endpoint (demo/oauth.py) or its signature checks (demo/signatures.py). A token that
stops working mid-poll is renewed and the job finishes; a fresh token refused halts the run (exit 8) and
`resume` finishes the same job without submitting its rows again; SigV4 signs every step; and no
secret or token is in any file the run wrote nor in its output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.clirun import CliResult, cli_env, run_cli
from tests.relay.bulkrun import with_auth, write_kind_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S

pytestmark = pytest.mark.slow

NAMES = ["ann", "bogus-bob", "cy", "dan", "eve"]  # two jobs of max_rows 4
SECRET = "client-secret-7c1d"
OAUTH_PLAN = {"client_id": "bulk-client", "client_secret": SECRET, "expires_in": False}
KEY_ID, SECRET_KEY = "AKIDBULKJOBS", "aws-secret/Bulk+4e2a"


def _oauth2_job(tmp_path: Path, target: TargetProcess) -> Path:
    job = write_kind_job(tmp_path, target.url, NAMES, "salesforce_bulk2")
    auth = {"token_url": f"{target.url}/oauth/token", "client_id": "bulk-client"}
    return with_auth(job, {"oauth2": {**auth, "client_secret": "${CLIENT_SECRET}"}})


def _cli(tmp_path: Path, env: dict[str, str], *args: str | Path) -> CliResult:
    return run_cli("--json", *args, cwd=tmp_path, env=env, timeout=HANG_S)


def _oauth_env(tmp_path: Path) -> dict[str, str]:
    return cli_env(CLIENT_SECRET=SECRET, BULKRELAY_STATE_DIR=str(tmp_path / "state"))


def _assert_rows_once(run_dir: Path) -> None:
    entries = list(read_journal(run_dir / "results.jsonl"))
    assert sorted(entry.row_number for entry in entries) == [1, 2, 3, 4, 5]
    assert [entry.row_number for entry in entries if not entry.success] == [2]


def _assert_nothing_secret(results: list[CliResult], tmp_path: Path, *secrets: str) -> None:
    unwanted = [secret.encode() for secret in secrets]
    for result in results:
        for text in (result.stdout, result.stderr.encode()):
            assert not [word for word in unwanted if word in text]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(file.name == "results.jsonl" for file in files)
    for file in files:
        data = file.read_bytes()
        assert not [word for word in unwanted if word in data], file


def test_a_token_that_stops_working_mid_poll_is_renewed_and_the_run_finishes(tmp_path: Path) -> None:
    # The first token passes create, upload, close and the first poll, then gets 401.
    oauth = {**OAUTH_PLAN, "revoke_first_after": 4}
    plan: dict[str, Any] = {"oauth": oauth, "bulk": {"polls_to_complete": 3}}
    with TargetProcess(plan) as target:
        job = _oauth2_job(tmp_path, target)
        shown = _cli(tmp_path, _oauth_env(tmp_path), "render", job)
        done = _cli(tmp_path, _oauth_env(tmp_path), "run", job, "--budget", "0")
        stats = target.stats()
        requests = target.requests()
    assert done.exit_code == ExitCode.PARTIAL_FAILURE, done.envelope
    _assert_rows_once(Path(done.data["run_dir"]))
    assert stats["oauth"]["issued"] == 2 and stats["oauth"]["bearer_refusals"] == 1
    (refused,) = [r for r in requests if r["status"] == 401]
    assert refused["method"] == "GET" and refused["path"].split("/")[-2] == "ingest"  # a poll
    assert stats["bulk_jobs"]["created"] == 2 and stats["bulk_rows_in_two_jobs"] == 0
    (first,) = shown.data["requests"][:1]
    assert ["Authorization", "Bearer ***"] in [list(header) for header in first["headers"]], first
    _assert_nothing_secret([shown, done], tmp_path, SECRET, "tok-")


def test_a_fresh_token_refused_halts_and_resume_finishes_the_same_job(tmp_path: Path) -> None:
    polls = {"method": "GET", "path_contains": "/jobs/ingest/"}
    plan = {"oauth": OAUTH_PLAN, "rules": [{"match": polls, "times": 2, "status": 401}]}
    with TargetProcess(plan) as target:
        job = _oauth2_job(tmp_path, target)
        halted = _cli(tmp_path, _oauth_env(tmp_path), "run", job, "--budget", "0")
        assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
        assert halted.error_code == "TARGET_AUTH_FAILED"
        assert halted.envelope["error"]["context"]["bulk_step"] == "poll"
        run_dir = Path(halted.data["run_dir"])
        assert list(read_journal(run_dir / "results.jsonl")) == []
        resumed = _cli(tmp_path, _oauth_env(tmp_path), "resume", run_dir, "--budget", "0")
        stats = target.stats()
    assert resumed.exit_code == ExitCode.PARTIAL_FAILURE, resumed.envelope
    _assert_rows_once(run_dir)
    ledgers = job_ledgers(run_dir / "results.jsonl")
    assert [ledger.events[-1] for ledger in ledgers.values()] == ["results", "results"]
    assert stats["bulk_jobs"]["created"] == 2 and stats["bulk_rows_in_two_jobs"] == 0  # none sent again
    _assert_nothing_secret([halted, resumed], tmp_path, SECRET, "tok-")


def test_sigv4_signs_every_step_of_a_bulk_run(tmp_path: Path) -> None:
    signed = {"scheme": "aws_sigv4", "access_key": KEY_ID, "secret_key": SECRET_KEY}
    env = cli_env(
        BULKRELAY_STATE_DIR=str(tmp_path / "state"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_ACCESS_KEY_ID=KEY_ID,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
    )
    env.pop("AWS_SESSION_TOKEN", None)
    env.pop("AWS_PROFILE", None)
    with TargetProcess({"signed": {**signed, "region": "eu-west-1", "service": "es"}}) as target:
        job = write_kind_job(tmp_path, target.url, NAMES, "salesforce_bulk2")
        job = with_auth(job, {"aws_sigv4": {"service": "es", "region": "eu-west-1"}})
        done = _cli(tmp_path, env, "run", job, "--budget", "0")
        stats = target.stats()["signed"]
        requests = target.requests()
    assert done.exit_code == ExitCode.PARTIAL_FAILURE, done.envelope
    _assert_rows_once(Path(done.data["run_dir"]))
    assert stats["refused"] == 0 and stats["verified"] == len(requests)
    assert {r["method"] for r in requests} == {"POST", "PUT", "PATCH", "GET"}
    _assert_nothing_secret([done], tmp_path, SECRET_KEY)
