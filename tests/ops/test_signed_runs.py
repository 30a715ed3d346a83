"""Signed and asserted runs end to end (issue 41): the real CLI against the loopback target verifying every
attempt independently (demo/signatures.py: SigV4 from the AWS specification, the three HMAC schemes;
demo/oauth.py: the JWT assertion's signature and claims). Per-row, batched and retried requests are all
accepted; a wrong secret or key halts at once (exit 8) with no row sent twice; and no secret, key or
signature is in any file the run wrote nor in its output."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import read_journal
from tests.clirun import CliResult, cli_env, run_cli, start_cli
from tests.jobfiles import write_job
from tests.relay.batchrun import RETRY_FAST, write_batch_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.shared_target]

ROWS = 12
KEY_ID, SECRET_KEY, SESSION = "AKIDBULKRELAY", "aws-secret/Key+0f9c3e", "session-token-77ab19"
WEBHOOK = "whsec_" + base64.b64encode(b"webhook-key-5d1e0a77").decode()
RETRIED_ONCE = [{"match": {"method": "POST"}, "first_attempts": 1, "status": 503}]  # every request twice
RETRY = {**RETRY_FAST, "max_attempts": 3}
SIGV4_PLAN = {
    "scheme": "aws_sigv4",
    "access_key": KEY_ID,
    "secret_key": SECRET_KEY,
    "region": "eu-west-1",
    "service": "es",
    "session_token": SESSION,
}


def _aws_env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = cli_env(
        BULKRELAY_STATE_DIR=str(tmp_path / "state"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(name, None)
    env.update(more)
    return env


def _creds(tmp_path: Path, secret: str = SECRET_KEY) -> dict[str, str]:
    return _aws_env(
        tmp_path, AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=secret, AWS_SESSION_TOKEN=SESSION
    )


def _run(tmp_path: Path, job: Path, env: dict[str, str], *more: str) -> CliResult:
    return run_cli("--json", "run", job, *more, cwd=tmp_path, env=env, timeout=HANG_S)


def _signatures(target: TargetProcess) -> list[str]:
    """Every signature the target received (from Authorization and the HMAC headers)."""
    found = []
    for request in target.requests():
        for name, value in request["headers"].items():
            if name.lower() == "authorization" and "Signature=" in value:
                found.append(value.rsplit("Signature=", 1)[1])
            elif name.lower() in ("webhook-signature", "x-hub-signature-256", "x-signature"):
                found += [part.split(",")[-1].split("=")[-1] for part in value.split()]
    return found


def _assert_nothing_secret(result: CliResult, tmp_path: Path, *secrets: str) -> None:
    unwanted = [secret.encode() for secret in secrets if secret]
    assert unwanted
    for text in (result.stdout, result.stderr.encode()):
        assert not [word for word in unwanted if word in text]
    for file in (p for p in tmp_path.rglob("*") if p.is_file() and p.suffix not in (".pem", ".yaml")):
        data = file.read_bytes()
        assert not [word for word in unwanted if word in data], file


def _sent_once_each(target: TargetProcess) -> None:
    paths = [request["raw_path"] + request["body"] for request in target.requests()]
    assert len(paths) == len(set(paths)), "a row was sent twice"


def _fresh(target: TargetProcess, plan: dict[str, Any]) -> None:
    target.set_plan(plan)
    target.reset()


def test_a_sigv4_run_of_retried_rows_is_accepted_in_full_and_writes_no_secret(
    tmp_path: Path, target: TargetProcess
) -> None:
    _fresh(target, {"signed": SIGV4_PLAN, "rules": RETRIED_ONCE})
    job = write_job(
        tmp_path,
        target.url,
        rows=ROWS,
        request={
            "headers": {"X-Tenant": "acme"},
            "idempotency_key": {"header": "Idempotency-Key"},
            "auth": {"aws_sigv4": {"service": "es", "region": "eu-west-1"}},
        },
        retry=RETRY,
    )
    result = _run(tmp_path, job, _creds(tmp_path))
    assert result.exit_code == 0, result.envelope
    signed = target.stats()["signed"]
    assert (signed["verified"], signed["refused"]) == (2 * ROWS, 0)  # each retry signed afresh, verified
    assert set(signed["signed_headers"]) >= {
        "content-type",
        "idempotency-key",
        "x-tenant",
        "user-agent",
        "host",
        "x-amz-content-sha256",
        "x-amz-date",
        "x-amz-security-token",
    }
    _assert_nothing_secret(result, tmp_path, SECRET_KEY, SESSION, *_signatures(target))


def test_a_batched_sigv4_run_signs_each_batch_over_its_exact_bytes(
    tmp_path: Path, target: TargetProcess
) -> None:
    _fresh(target, {"signed": SIGV4_PLAN, "rules": RETRIED_ONCE})
    names = [f"user{n}" for n in range(ROWS)]
    job = write_batch_job(
        tmp_path,
        target.url,
        "elasticsearch",
        names,
        max_items=5,
        retry=RETRY,
        request={"auth": {"aws_sigv4": {"service": "es", "region": "eu-west-1"}}},
    )
    result = _run(tmp_path, job, _creds(tmp_path))
    assert result.exit_code == 0, result.envelope
    rendered = run_cli("--json", "render", job, "--rows", "1-3", "--curl", cwd=tmp_path, env=_creds(tmp_path))
    assert rendered.exit_code == 0 and "Authorization: ***" in rendered.stdout.decode()
    entries = list(read_journal(Path(result.data["run_dir"]) / "results.jsonl"))
    assert len(entries) == ROWS and all(entry.success for entry in entries)
    assert target.stats()["signed"] == {
        **target.stats()["signed"],
        "verified": 6,
        "refused": 0,
    }  # 3 batches, twice
    _assert_nothing_secret(result, tmp_path, SECRET_KEY, SESSION, *_signatures(target))


def test_a_wrong_secret_key_halts_at_once_on_the_signature_with_no_row_sent_twice(
    tmp_path: Path, target: TargetProcess
) -> None:
    _fresh(target, {"signed": SIGV4_PLAN})
    job = write_job(
        tmp_path,
        target.url,
        rows=ROWS,
        request={"auth": {"aws_sigv4": {"service": "es", "region": "eu-west-1"}}},
        execution={"concurrency": 2},
    )
    result = _run(tmp_path, job, _creds(tmp_path, secret="not-the-secret-key"))
    assert (result.exit_code, result.error_code) == (ExitCode.AUTH_REQUIRED, "TARGET_AUTH_FAILED")
    assert "refused the request's signature (403)" in result.envelope["error"]["message"]
    assert target.stats()["requests"] <= 2  # the workers' first requests, nothing after the halt
    _sent_once_each(target)
    _assert_nothing_secret(result, tmp_path, "not-the-secret-key", SESSION)


def test_no_aws_credentials_halt_before_any_row_naming_where_they_were_looked_for(
    tmp_path: Path, target: TargetProcess
) -> None:
    _fresh(target, {"signed": SIGV4_PLAN})
    job = write_job(
        tmp_path, target.url, rows=3, request={"auth": {"aws_sigv4": {"service": "es", "region": "x"}}}
    )
    result = _run(tmp_path, job, _aws_env(tmp_path))
    assert (result.exit_code, result.error_code) == (ExitCode.AUTH_REQUIRED, "TARGET_AUTH_FAILED")
    message = result.envelope["error"]["message"]
    assert (
        "no AWS credentials found" in message and "AWS_ACCESS_KEY_ID" in message and "AWS_PROFILE" in message
    )
    assert target.stats()["requests"] == 0
    checked = run_cli("--json", "validate", "--check-auth", job, cwd=tmp_path, env=_aws_env(tmp_path))
    assert (
        checked.exit_code == ExitCode.AUTH_REQUIRED
        and "no AWS credentials found" in checked.envelope["error"]["message"]
    )
    checked = run_cli("--json", "validate", "--check-auth", job, cwd=tmp_path, env=_creds(tmp_path))
    assert checked.exit_code == 0 and checked.data["auth"]["credentials"] == "env"
    assert target.stats()["requests"] == 0


@pytest.mark.parametrize(
    ("auth", "plan"),
    [
        (
            {"scheme": "standard_webhooks", "secret": ["${OLD_SECRET}", "${HOOK_SECRET}"]},
            {"scheme": "standard_webhooks", "secrets": [WEBHOOK]},
        ),
        ({"scheme": "github", "secret": "${HOOK_SECRET}"}, {"scheme": "github", "secrets": [WEBHOOK]}),
        (
            {
                "scheme": "custom",
                "secret": "${HOOK_SECRET}",
                "header": "X-Signature",
                "algorithm": "sha512",
                "encoding": "base64",
                "prefix": "v=",
                "signed": "{timestamp}:{method}:{path}:{body}",
                "timestamp_header": "X-Timestamp",
            },
            {
                "scheme": "custom",
                "secrets": [WEBHOOK],
                "header": "X-Signature",
                "algorithm": "sha512",
                "encoding": "base64",
                "prefix": "v=",
                "signed": "{timestamp}:{method}:{path}:{body}",
                "timestamp_header": "X-Timestamp",
            },
        ),
    ],
)
def test_each_hmac_scheme_is_accepted_on_every_attempt_and_a_wrong_secret_halts(
    tmp_path: Path, target: TargetProcess, auth: dict[str, Any], plan: dict[str, Any]
) -> None:
    _fresh(target, {"signed": plan, "rules": RETRIED_ONCE})
    request = {"auth": {"hmac": auth}, "idempotency_key": {"header": "Idempotency-Key"}}
    job = write_job(tmp_path, target.url, rows=ROWS, request=request, retry=RETRY)
    old = "whsec_" + base64.b64encode(b"the-old-one").decode()
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"), HOOK_SECRET=WEBHOOK, OLD_SECRET=old)
    result = _run(tmp_path, job, env)
    assert result.exit_code == 0, result.envelope
    assert target.stats()["signed"]["verified"] == 2 * ROWS
    rendered = run_cli("--json", "render", job, "--rows", "1", cwd=tmp_path, env=env)
    assert "***" in str(rendered.data) and WEBHOOK not in str(rendered.data)
    _assert_nothing_secret(result, tmp_path, WEBHOOK, old, *_signatures(target))

    _fresh(target, {"signed": {**plan, "secrets": ["whsec_" + base64.b64encode(b"rotated-away").decode()]}})
    (tmp_path / "state").rename(tmp_path / "state-1")
    halted = _run(tmp_path, job, env)
    assert (halted.exit_code, halted.error_code) == (ExitCode.AUTH_REQUIRED, "TARGET_AUTH_FAILED")
    assert target.stats()["requests"] <= 4
    _sent_once_each(target)


def _keys(tmp_path: Path) -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


def test_a_jwt_bearer_run_is_granted_tokens_by_assertion_and_a_wrong_key_halts(
    tmp_path: Path, target: TargetProcess
) -> None:
    private, public = _keys(tmp_path)
    oauth = {
        "client_id": "sf-client",
        "public_key": public,
        "subject": "integration@example.com",
        "audience": "https://login.example.com",
        "expires_in": False,
    }
    _fresh(target, {"oauth": oauth, "rules": RETRIED_ONCE})
    auth = {
        "oauth2": {
            "token_url": f"{target.url}/oauth/token",
            "client_id": "${SF_CLIENT_ID}",
            "grant": "jwt_bearer",
            "client_auth": "private_key_jwt",
            "private_key": "${SF_PRIVATE_KEY}",
            "subject": "integration@example.com",
            "audience": "https://login.example.com",
            "default_expires_in_seconds": 1800,
        }
    }
    request = {"auth": auth, "idempotency_key": {"header": "Idempotency-Key"}}
    job = write_job(tmp_path, target.url, rows=ROWS, request=request, retry=RETRY)
    env = cli_env(
        BULKRELAY_STATE_DIR=str(tmp_path / "state"), SF_CLIENT_ID="sf-client", SF_PRIVATE_KEY=private
    )
    checked = run_cli("--json", "validate", "--check-auth", job, cwd=tmp_path, env=env)
    assert checked.exit_code == 0 and checked.data["auth"]["expires_in"] == 1800
    result = _run(tmp_path, job, env)
    assert result.exit_code == 0, result.envelope
    stats = target.stats()["oauth"]
    assert (
        stats["refused"] == 0 and stats["issued"] >= 1 and stats["assertions"] == 2 * stats["token_requests"]
    )
    body = private.split("-----")[2].strip().splitlines()
    _assert_nothing_secret(result, tmp_path, *body, "tok-")

    wrong, _ = _keys(tmp_path)
    _fresh(target, {"oauth": oauth})
    (tmp_path / "state").rename(tmp_path / "state-1")
    halted = _run(tmp_path, job, {**env, "SF_PRIVATE_KEY": wrong})
    assert (halted.exit_code, halted.error_code) == (ExitCode.AUTH_REQUIRED, "TARGET_AUTH_FAILED")
    assert "bad signature" in halted.envelope["error"]["message"]
    assert target.stats()["requests"] == 0


def test_ps_shows_no_secret_while_a_signed_run_is_under_way(tmp_path: Path, target: TargetProcess) -> None:
    """Secrets reach the run through its environment, never its command line: what `ps` shows of every
    process, read while a request is in flight, holds none of them nor any signature sent so far."""
    hung = [{"delay_ms": int(HANG_S * 1000), "match": {"path_contains": "/items/3"}}]
    _fresh(target, {"signed": SIGV4_PLAN, "rules": hung})
    request = {"auth": {"aws_sigv4": {"service": "es", "region": "eu-west-1"}}}
    job = write_job(tmp_path, target.url, rows=ROWS, request=request, execution={"concurrency": 1})
    proc = start_cli("--json", "run", job, cwd=tmp_path, env=_creds(tmp_path), output="discarded")
    try:
        wait_for(lambda: target.stats()["requests"] >= 3, "the third request to be in flight")
        shown = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, check=True).stdout
    finally:
        proc.kill()
        proc.wait()
    assert b"-m bulkrelay --json run" in shown  # the run was there to be seen
    assert not [word for word in (SECRET_KEY, SESSION, *_signatures(target)) if word.encode() in shown]


ECHO_HMAC = {"scheme": "custom", "secret": "${HOOK_SECRET}", "header": "X-S", "prefix": "h="}


@pytest.mark.parametrize(
    ("auth", "echoed"),
    [
        ({"aws_sigv4": {"service": "es", "region": "eu-west-1"}}, "Authorization"),
        ({"hmac": ECHO_HMAC}, "X-S"),
        ({"hmac": {"scheme": "standard_webhooks", "secret": "${HOOK_SECRET}"}}, "webhook-signature"),
    ],
)
def test_an_answer_echoing_the_attempts_signature_is_journaled_with_it_hidden(
    tmp_path: Path, target: TargetProcess, auth: dict[str, Any], echoed: str
) -> None:
    """A signature is a secret made per attempt: a target echoing it (in a failure body, a captured value,
    a 403 refusing it), as sent and in base64, never gets it into the journal, the report or the run log."""
    said = "got {echo} {echo_b64} {echo_json}"
    rules = [
        {"match": {"path_contains": "/items/1"}, "status": 200, "echo_header": echoed, "body": {"id": said}},
        {"match": {"path_contains": "/items/2"}, "status": 422, "echo_header": echoed, "body": said},
        {"match": {"path_contains": "/items/3"}, "status": 403, "echo_header": echoed,
         "body": "SignatureDoesNotMatch: " + said},
    ]  # fmt: skip
    _fresh(target, {"rules": rules})
    request = {"auth": auth}
    job = write_job(
        tmp_path,
        target.url,
        rows=3,
        request=request,
        response={"capture": {"remote": "/id"}},
        execution={"concurrency": 1},
    )
    env = {**_creds(tmp_path), "HOOK_SECRET": WEBHOOK}
    result = _run(tmp_path, job, env, "--log-file", str(tmp_path / "run.log"))
    assert result.exit_code == ExitCode.AUTH_REQUIRED, result.envelope
    run_dir = next(tmp_path.rglob("results.jsonl")).parent
    report = run_cli("--json", "report", run_dir, "-o", tmp_path / "report.html", cwd=tmp_path, env=env)
    assert report.exit_code == 0, report.envelope
    entries = {entry.row_number: entry for entry in read_journal(run_dir / "results.jsonl")}
    assert entries[1].captured is not None and "***" in entries[1].captured["remote"]
    assert entries[2].response_body is not None and "***" in entries[2].response_body
    sent = [request["headers"][name] for request in target.requests() for name in request["headers"]
            if name.lower() == echoed.lower()]  # fmt: skip
    assert len(sent) == 3
    parts = [  # the signatures: SigV4's after Signature=, an HMAC's after its prefix
        part.rsplit("Signature=", 1)[-1].split(",")[-1].removeprefix("h=")
        for value in sent
        for part in ([value] if "Signature=" in value else value.split())
    ]
    encoded = [base64.b64encode(value.encode()).decode() for value in sent]
    _assert_nothing_secret(result, tmp_path, *parts, *encoded)
