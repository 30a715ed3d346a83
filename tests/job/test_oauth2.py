"""`request.auth.oauth2` in the job file: its checks, what the fingerprint holds, the token request built
from it, and what `render` and the redactor make of it."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest
import yaml

from bulkrelay.errors import ConfigInvalid, SecretMissing
from bulkrelay.job.config import load_job, parse_job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.request import RequestRenderer
from bulkrelay.ops.preview import render
from bulkrelay.sync.mirror import deletion_job
from tests.jobfiles import merge, write_job

ENV = {"CLIENT_ID": "client-7", "CLIENT_SECRET": "pa ss/wörd+1"}


def _oauth2(**overrides: Any) -> dict[str, Any]:
    return merge(
        {
            "token_url": "https://auth.example.com/oauth/token",
            "client_id": "${CLIENT_ID}",
            "client_secret": "${CLIENT_SECRET}",
            "scope": "contacts.write",
        },
        overrides,
    )


def _job_text(oauth2: dict[str, Any], **request: Any) -> str:
    job = {
        "version": 1,
        "request": {
            "method": "POST",
            "url": "https://api.example.com/v1/{id}",
            "json": {"id": {"from": "id"}},
            "auth": {"oauth2": oauth2},
            **request,
        },
    }
    return yaml.safe_dump(job, sort_keys=False)


def _problems(text: str) -> str:
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(text, file="job.yaml")
    return " | ".join(problem.describe() for problem in refused.value.problems)


def test_a_complete_oauth2_section_loads_with_its_defaults() -> None:
    config = parse_job(_job_text(_oauth2(params={"audience": "https://api.example.com"})), file="job.yaml")
    assert config.request.auth is not None
    oauth2 = config.request.auth.oauth2
    assert oauth2 is not None
    assert (oauth2.client_auth, oauth2.refresh_before_seconds) == ("body", 60.0)
    assert oauth2.params == {"audience": "https://api.example.com"}


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"client_secret": "hunter2"}, "must come from the environment"),
        ({"token_url": "ftp://auth/token"}, "must begin with http:// or https://"),
        ({"token_url": "https://auth/{tenant}/token"}, "cannot use a {field}"),
        ({"scope": "{scope}"}, "cannot use a {field}"),
        ({"client_auth": "jwt"}, "client_auth"),
        ({"refresh_before_seconds": -1}, "refresh_before_seconds"),
        ({"params": {"grant_type": "password"}}, "params cannot set grant_type"),
        ({"client_secrets": "${X}"}, "did you mean 'client_secret'"),
    ],
)
def test_mistakes_in_the_oauth2_section_name_their_key(overrides: dict[str, Any], said: str) -> None:
    assert said in _problems(_job_text(_oauth2(**overrides)))


def test_an_authorization_header_beside_auth_is_refused() -> None:
    text = _job_text(_oauth2(), headers={"Authorization": "Bearer ${API_TOKEN}"})
    assert "request.headers sets Authorization, which request.auth sends" in _problems(text)


def test_the_fingerprint_holds_what_the_token_grants_not_who_asks_for_it() -> None:
    def fingerprint(**overrides: Any) -> str:
        return config_fingerprint(parse_job(_job_text(_oauth2(**overrides)), file="job.yaml"))

    base = fingerprint()
    # who asks and how: rotating or renaming the client, its authentication, the refresh margin
    assert fingerprint(client_id="${OTHER_ID}") == base
    assert fingerprint(client_secret="${NEW_SECRET}") == base
    assert fingerprint(client_auth="basic", refresh_before_seconds=5) == base
    # what is granted: the endpoint, the scope, the params
    assert fingerprint(token_url="https://auth.example.com/v2/token") != base
    assert fingerprint(scope="contacts.read") != base
    assert fingerprint(params={"audience": "a"}) != base


def test_a_job_without_auth_keeps_the_fingerprint_it_had() -> None:
    text = yaml.safe_dump(
        {
            "version": 1,
            "request": {"method": "POST", "url": "https://api.example.com/v1", "json": {"a": {"value": 1}}},
        }
    )
    # the fingerprint of this job before request.auth existed (canonical JSON, unchanged since)
    assert "auth" not in parse_job(text, file="job.yaml").model_dump(by_alias=True)["request"]


def _token_request(**overrides: Any) -> Any:
    config = parse_job(_job_text(_oauth2(**overrides)), file="job.yaml")
    renderer = RequestRenderer.from_config(config.request, ENV)
    assert renderer.token_request is not None
    return renderer, renderer.token_request


def test_client_auth_body_sends_the_client_in_the_form() -> None:
    _, token_request = _token_request(params={"audience": "https://api"})
    prepared = token_request.prepared()
    assert prepared.method == "POST" and prepared.url == "https://auth.example.com/oauth/token"
    assert dict(prepared.headers)["Content-Type"] == "application/x-www-form-urlencoded"
    assert "Authorization" not in dict(prepared.headers)
    assert parse_qsl(prepared.body.decode()) == [
        ("grant_type", "client_credentials"),
        ("scope", "contacts.write"),
        ("audience", "https://api"),
        ("client_id", "client-7"),
        ("client_secret", "pa ss/wörd+1"),
    ]


def test_client_auth_basic_form_encodes_id_and_secret_first() -> None:
    renderer, token_request = _token_request(client_auth="basic")
    prepared = token_request.prepared()
    header = dict(prepared.headers)["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")).decode() == "client-7:pa+ss%2Fw%C3%B6rd%2B1"
    assert "client_secret" not in prepared.body.decode()
    # the Basic credentials are a secret too, in whatever body they come back
    assert renderer.redactor.redact(f"got {header}") == "got Basic ***"


def test_the_secrets_of_the_token_request_must_be_set() -> None:
    config = parse_job(_job_text(_oauth2()), file="job.yaml")
    with pytest.raises(SecretMissing, match="CLIENT_SECRET"):
        RequestRenderer.from_config(config.request, {"CLIENT_ID": "x"})


def test_the_client_secret_and_learnt_tokens_are_redacted() -> None:
    renderer, _ = _token_request()
    redactor = renderer.redactor
    assert redactor.redact('{"echo":"pa ss/wörd+1"}') == '{"echo":"***"}'
    redactor.learn("tok-abc-123456")
    assert redactor.redact("Bearer tok-abc-123456 ok") == "Bearer *** ok"
    assert "dG9rLWFiYy0xMjM0NTY" not in redactor.redact(base64.b64encode(b"tok-abc-123456").decode())


def test_render_shows_the_bearer_header_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    job = write_job(
        tmp_path,
        "https://api.example.com",
        rows=2,
        request={"auth": {"oauth2": _oauth2()}},
    )
    result = render(load_job(job), None, "1")
    payload = result.payload()
    assert payload is not None
    assert ["Authorization", "Bearer ***"] in payload["requests"][0]["headers"]
    assert "pa ss" not in str(payload)


def test_a_mirror_jobs_deletions_carry_the_same_auth(tmp_path: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "input": {"key": "id"},
                "request": yaml.safe_load(_job_text(_oauth2()))["request"],
                "execution": {"sync": "mirror"},
                "mirror": {"url": "https://api.example.com/v1/{id}", "max_deletes": 10},
            }
        )
    )
    job = load_job(job_file)
    assert deletion_job(job).config.request.auth == job.config.request.auth is not None
