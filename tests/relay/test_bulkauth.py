"""`request.auth` for bulk jobs, in-process against the embedded target: every step of every kind
(create, upload, close, poll, fetch; a named import's submit, poll and errors) goes through the auth
seam, an OAuth2 token refused mid-poll is renewed once for all and the poll asked again, a fresh token
refused halts the run with the job kept for `resume`, and HMAC signs each step's exact bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bulkrelay.demo.target import start_target
from bulkrelay.relay.stopping import StopReason
from bulkrelay.store.journal.jobrecords import job_ledgers
from tests.relay.bulkrun import run_bulk_job, with_auth, write_kind_job

pytestmark = pytest.mark.anyio

NAMES = ["ann", "bogus-bob", "cy"]
SECRET = "client-secret-b41k"
OAUTH2 = {
    "token_url": "{url}/oauth/token",
    "client_id": "bulk-client",
    "client_secret": "${CLIENT_SECRET}",
}
ENV = {"CLIENT_SECRET": SECRET}
KINDS = ["salesforce_bulk2", "generic", "named_import"]
# Requests the first token passes before it is refused: the second poll of the (one) job.
FIRST_POLL_ENDS = {"salesforce_bulk2": 4, "generic": 4, "named_import": 2}


def _oauth2(url: str) -> dict[str, Any]:
    return {"oauth2": {**OAUTH2, "token_url": f"{url}/oauth/token"}}


def _oauth_plan(**more: Any) -> dict[str, Any]:
    return {"client_id": "bulk-client", "client_secret": SECRET, "expires_in": False, **more}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_token_refused_mid_poll_is_renewed_and_every_step_carries_one(
    tmp_path: Path, kind: str
) -> None:
    oauth = _oauth_plan(revoke_first_after=FIRST_POLL_ENDS[kind])
    target = await start_target({"oauth": oauth, "bulk": {"polls_to_complete": 3}})
    try:
        job = with_auth(write_kind_job(tmp_path, target.url, NAMES, kind), _oauth2(target.url))
        result = await run_bulk_job(job, target, env=ENV)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None, result.outcome
    rows = result.by_row()
    assert [rows[n].success for n in (1, 2, 3)] == [True, False, True]
    assert stats["oauth"]["issued"] == 2 and stats["oauth"]["bearer_refusals"] == 1
    steps = [r for r in result.requests if r["path"] != "/oauth/token"]
    (refused,) = [r for r in steps if r["status"] == 401]
    assert refused["method"] == "GET" and "/errors" not in refused["path"]  # a poll of the job
    assert refused["path"].rsplit("/", 1)[-1] not in ("successfulResults", "failedResults")
    after = steps[steps.index(refused) + 1]
    assert (after["method"], after["path"]) == (refused["method"], refused["path"])  # asked again
    assert after["headers"]["Authorization"] != refused["headers"]["Authorization"]
    assert all(r["headers"]["Authorization"].startswith("Bearer tok-") for r in steps)
    journal = result.run.journal_path.read_bytes()
    assert b"tok-" not in journal and SECRET.encode() not in journal


async def test_a_fresh_token_refused_halts_the_run_and_keeps_the_job_for_resume(tmp_path: Path) -> None:
    polls = {"method": "GET", "path_contains": "/jobs/ingest/"}
    plan = {"oauth": _oauth_plan(), "rules": [{"match": polls, "status": 401}]}
    target = await start_target(plan)
    try:
        job = with_auth(write_kind_job(tmp_path, target.url, NAMES, "salesforce_bulk2"), _oauth2(target.url))
        result = await run_bulk_job(job, target, env=ENV)
        stats = target.state.stats()
    finally:
        await target.stop()
    assert result.outcome.stop_reason is StopReason.HALT_AUTH
    assert result.outcome.stop_detail == {"status_code": 401, "bulk_step": "poll"}
    assert result.entries == []  # the rows stay pending: the job ran, resume fetches its results
    (ledger,) = job_ledgers(result.run.journal_path).values()
    assert ledger.events == ["created", "uploaded", "closed"]
    assert stats["oauth"]["issued"] == 2  # the 401 to the first token renewed it; the fresh one halted


@pytest.mark.parametrize("kind", KINDS)
async def test_hmac_signs_every_step_over_its_exact_bytes(tmp_path: Path, kind: str) -> None:
    signed = {"scheme": "github", "secrets": ["hmac-secret-9f"]}
    target = await start_target({"signed": signed})
    try:
        job = write_kind_job(tmp_path, target.url, NAMES, kind)
        job = with_auth(job, {"hmac": {"scheme": "github", "secret": "${HMAC_SECRET}"}})
        result = await run_bulk_job(job, target, env={"HMAC_SECRET": "hmac-secret-9f"})
        stats = target.state.stats()["signed"]
    finally:
        await target.stop()
    assert result.outcome.stop_reason is None, result.outcome
    assert [result.by_row()[n].success for n in (1, 2, 3)] == [True, False, True]
    assert stats["refused"] == 0 and stats["verified"] == len(result.requests) >= 4
    assert any(r["body"] for r in result.requests if r["method"] in ("PUT", "POST"))


# The step that makes each kind's job, answered 400 with what the request carried in `header`.
_MAKES = {
    "salesforce_bulk2": {"method": "POST", "path_contains": "/jobs/ingest"},
    "generic": {"method": "POST", "path_contains": "/jobs/ingest"},
    "named_import": {"method": "POST", "path_contains": "/crm/v3/imports"},
}


def _echoing_refusal(kind: str, header: str) -> dict[str, Any]:
    echoed = "you sent {echo} ({echo_b64}) and that will not do"
    return {"match": _MAKES[kind], "status": 400, "body": echoed, "echo_header": header, "times": 99}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("signed", [False, True], ids=["token", "signature"])
async def test_a_refused_step_echoing_a_secret_or_a_signature_is_journaled_with_it_hidden(
    tmp_path: Path, kind: str, signed: bool
) -> None:
    """A step's refusal becomes its rows' error text: up to 300 bytes of the target's answer, which was
    journaled as it came, the job's token (or the attempt's signature) included when the answer echoed it."""
    header = "X-Hub-Signature-256" if signed else "Authorization"
    plan: dict[str, Any] = {"rules": [_echoing_refusal(kind, header)]}
    if signed:
        plan["signed"] = {"scheme": "github", "secrets": ["hmac-secret-9f"]}
    target = await start_target(plan)
    try:
        job = write_kind_job(tmp_path, target.url, NAMES, kind)
        if signed:
            job = with_auth(job, {"hmac": {"scheme": "github", "secret": "${HMAC_SECRET}"}})
        result = await run_bulk_job(job, target, env={"HMAC_SECRET": "hmac-secret-9f"})
        sent = [r["headers"].get(header.lower()) or r["headers"].get(header) for r in result.requests]
    finally:
        await target.stop()
    rows = result.by_row()
    assert all(not rows[n].success and "that will not do" in (rows[n].error or "") for n in (1, 2, 3)), rows
    secret = next(value for value in sent if value).removeprefix("Bearer ").removeprefix("sha256=")
    written = result.run.journal_path.read_bytes()
    assert secret.encode() not in written and b"***" in written
