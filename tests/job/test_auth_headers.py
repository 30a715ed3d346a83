"""`request.auth`'s headers are checked when the job is read (exit 2, the job file's line and key): a
signature or timestamp header that would collide with another header, with the message's framing or
with what BulkRelay sets, or a prefix no header can carry, is refused before any row."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ConfigInvalid, ExitCode, Problem, SecretInvalid
from bulkrelay.job.config import parse_job
from bulkrelay.job.signing import hmac_keys
from tests.clirun import run_cli

CUSTOM = {"scheme": "custom", "secret": "${WH1}", "header": "X-S"}


def _job(auth: dict[str, Any], **request: Any) -> str:
    url = request.pop("url", "https://hooks.example.com/in")
    more = "".join(f"  {key}: {orjson.dumps(value).decode()}\n" for key, value in request.items())
    return (
        "version: 1\n"
        "input: {file: data.csv}\n"
        "request:\n"
        "  method: POST\n"
        f"  url: {url}\n"
        "  json: {id: {from: id}}\n"
        f"{more}"
        f"  auth: {orjson.dumps(auth).decode()}\n"
    )


def _refused(text: str) -> Problem:
    with pytest.raises(ConfigInvalid) as caught:
        parse_job(text, file="job.yaml")
    problems = caught.value.problems
    assert len(problems) == 1, problems
    assert problems[0].file == "job.yaml" and problems[0].line is not None
    return problems[0]


@pytest.mark.parametrize(
    "name", ["Host", "Content-Length", "Transfer-Encoding", "Connection", "content-type", "TE", "User-Agent"]
)
@pytest.mark.parametrize("key", ["header", "timestamp_header"])
def test_a_signature_header_the_transport_or_bulkrelay_owns_is_refused(name: str, key: str) -> None:
    auth = {"hmac": {**CUSTOM, "header": "X-Sig", key: name}}
    problem = _refused(_job(auth))
    assert problem.path == f"request.auth.hmac.{key}" and name in problem.message


def test_the_timestamp_in_the_signatures_header_is_refused() -> None:
    problem = _refused(_job({"hmac": {**CUSTOM, "timestamp_header": "x-s"}}))
    assert problem.path == "request.auth.hmac" and "timestamp would replace the signature" in problem.message


@pytest.mark.parametrize(
    "auth",
    [
        {"hmac": {**CUSTOM, "timestamp_header": "X-T"}},
        {"hmac": {**CUSTOM, "header": "X-Sig", "timestamp_header": "X-S"}},
        {"hmac": {"scheme": "standard_webhooks", "secret": "${WH1}"}},
        {"aws_sigv4": {"service": "es", "region": "eu-west-1"}},
        {"oauth2": {"token_url": "https://a.example.com/t", "client_id": "c", "client_secret": "${S}"}},
    ],
)
def test_an_idempotency_key_in_a_header_request_auth_sends_is_refused(auth: dict[str, Any]) -> None:
    header = {"hmac": "X-S", "aws_sigv4": "X-Amz-Date", "oauth2": "Authorization"}[next(iter(auth))]
    if auth.get("hmac", {}).get("scheme") == "standard_webhooks":
        header = "webhook-id"
    problem = _refused(_job(auth, idempotency_key={"header": header}))
    assert problem.path == "request" and "idempotency_key.header" in problem.message


def test_request_headers_a_signer_sends_are_refused_for_sigv4_too() -> None:
    auth = {"aws_sigv4": {"service": "es", "region": "eu-west-1"}}
    problem = _refused(_job(auth, headers={"X-Amz-Date": "20260101T000000Z"}))
    assert "request.auth.aws_sigv4 sends" in problem.message


def test_an_hmac_authorization_header_beside_url_credentials_is_refused() -> None:
    auth = {"hmac": {**CUSTOM, "header": "Authorization"}}
    parse_job(_job(auth), file="job.yaml")  # a scheme of its own in Authorization: fine alone
    problem = _refused(_job(auth, url='"https://${U}:${P}@hooks.example.com/in"'))
    assert "Basic" in problem.message


@pytest.mark.parametrize("prefix", ["a\nb", "v1=\r", "\x00"])
def test_a_prefix_no_header_can_carry_is_refused(prefix: str) -> None:
    problem = _refused(_job({"hmac": {**CUSTOM, "prefix": prefix}}))
    assert problem.path == "request.auth.hmac.prefix" and "U+00" in problem.message


@pytest.mark.parametrize("name", ["X S", "X-S:", "Sig\u00e9", ""])
def test_a_header_name_that_is_no_token_is_refused(name: str) -> None:
    assert _refused(_job({"hmac": {**CUSTOM, "header": name}})).path == "request.auth.hmac.header"


def test_an_empty_whsec_key_is_refused_naming_its_variable() -> None:
    config = parse_job(_job({"hmac": {"scheme": "standard_webhooks", "secret": "${WH1}"}}), file="job.yaml")
    assert config.request.auth is not None and config.request.auth.hmac is not None
    with pytest.raises(SecretInvalid, match="WH1 starts with whsec_ but nothing follows it"):
        hmac_keys(config.request.auth.hmac, {"WH1": "whsec_"})
    assert hmac_keys(config.request.auth.hmac, {"WH1": "whsec_" + base64.b64encode(b"k").decode()}) == (b"k",)


@pytest.mark.slow
def test_validate_refuses_the_strangers_job_with_exit_2_naming_the_line(tmp_path: Path) -> None:
    auth = {"hmac": {**CUSTOM, "timestamp_header": "X-S"}}
    (tmp_path / "data.csv").write_text("id\n1\n")
    (tmp_path / "job.yaml").write_text(_job(auth, idempotency_key={"header": "X-S"}))
    result = run_cli("--json", "validate", tmp_path / "job.yaml", cwd=tmp_path, env={"WH1": "s"})
    assert (result.exit_code, result.error_code) == (ExitCode.ARG_ERROR, "CONFIG_INVALID")
    message = result.envelope["error"]["message"]
    assert "job.yaml:8, request.auth.hmac: timestamp_header and header both name X-S" in message
