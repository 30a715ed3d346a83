"""`vars:`: environment variables that are settings, not secrets. `render` shows them; secrets stay `***`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bulkrelay.errors import ConfigInvalid, SecretMissing
from bulkrelay.job.config import load_job, parse_job
from bulkrelay.job.fingerprint import config_fingerprint
from bulkrelay.job.request import RequestRenderer
from bulkrelay.ops.preview import render
from tests.clirun import cli_env, run_cli
from tests.jobfiles import write_job

ENV = {"API_BASE": "https://staging.example.com", "REGION": "eu", "API_TOKEN": "t0ps3cret"}


def _job(**top: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "request": {
            "method": "POST",
            "url": "${API_BASE}/v1/{id}",
            "query": {"region": "${REGION}"},
            "headers": {"Authorization": "Bearer ${API_TOKEN}"},
            "json": {"id": {"from": "id"}},
        },
        **top,
    }


def _renderer(job: dict[str, Any]) -> RequestRenderer:
    config = parse_job(yaml.safe_dump(job), file="job.yaml")
    return RequestRenderer.from_config(config.request, ENV, shown=config.vars)


def test_render_shows_vars_and_hides_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    job = write_job(
        tmp_path, "https://unused", rows=1, vars=["API_BASE", "REGION"], request=_job()["request"]
    )
    payload = render(load_job(job), None, "1").payload()
    assert payload is not None
    shown = payload["requests"][0]
    assert shown["url"] == "https://staging.example.com/v1/1?region=eu"
    assert ["Authorization", "Bearer ***"] in shown["headers"]


def test_without_vars_every_environment_value_stays_hidden() -> None:
    renderer = _renderer(_job())
    assert renderer.redactor.redact("https://staging.example.com") == "***"
    shown = _renderer(_job(vars=["API_BASE", "REGION"]))
    # a var is no secret: failure bodies keep it as the target wrote it, a secret is still hidden
    assert shown.redactor.redact("eu at https://staging.example.com with t0ps3cret") == (
        "eu at https://staging.example.com with ***"
    )


def test_a_var_must_be_set_like_a_secret() -> None:
    config = parse_job(yaml.safe_dump(_job(vars=["API_BASE"])), file="job.yaml")
    with pytest.raises(SecretMissing, match="API_BASE"):
        RequestRenderer.from_config(config.request, {"API_TOKEN": "x", "REGION": "eu"}, shown=config.vars)


@pytest.mark.parametrize(
    ("names", "said"),
    [
        (["API_BAS"], "vars names API_BAS, which no ${NAME} of the job uses"),
        (["api_base"], "is not a variable name"),
        (["REGION", "REGION"], "names a variable twice"),
    ],
)
def test_a_vars_mistake_names_itself(names: list[str], said: str) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(yaml.safe_dump(_job(vars=names)), file="job.yaml")
    assert said in str(refused.value.problems)


def test_a_client_secret_cannot_be_declared_shown() -> None:
    job = _job(vars=["CLIENT_SECRET"])
    job["request"]["headers"] = {}
    job["request"]["auth"] = {
        "oauth2": {"token_url": "https://a/t", "client_id": "c", "client_secret": "${CLIENT_SECRET}"}
    }
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(yaml.safe_dump(job), file="job.yaml")
    assert "a client secret is never shown" in str(refused.value.problems)


def test_vars_are_in_the_fingerprint_only_when_given() -> None:
    def fingerprint(job: dict[str, Any]) -> str:
        return config_fingerprint(parse_job(yaml.safe_dump(job), file="job.yaml"))

    assert "vars" not in parse_job(yaml.safe_dump(_job()), file="job.yaml").model_dump()
    # what is shown changes what the idempotency key hashes (a var's value): a resume must notice
    assert fingerprint(_job(vars=["REGION"])) != fingerprint(_job())


@pytest.mark.slow
def test_the_cli_render_prints_the_var_and_never_the_secret(tmp_path: Path) -> None:
    job = write_job(tmp_path, "https://unused", rows=1, vars=["API_BASE"], request=_job()["request"])
    result = run_cli("render", job, "--curl", env=cli_env(**ENV))
    assert result.exit_code == 0, result.envelope
    assert "https://staging.example.com/v1/1?region=***" in result.data["requests"][0]["curl"]
    assert b"t0ps3cret" not in result.stdout and b"=eu" not in result.stdout


@pytest.mark.parametrize(
    ("base", "sent"),
    [
        ("https://Staging.Example.COM", "https://staging.example.com/v1/1?region=eu"),  # host lower-cased
        ("https://staging.example.com:443", "https://staging.example.com/v1/1?region=eu"),  # default port
        ("https://bücher.example", "https://xn--bcher-kva.example/v1/1?region=eu"),  # IDNA
    ],
)
def test_a_secret_stays_hidden_in_the_url_the_wire_normalizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, base: str, sent: str
) -> None:
    """reqwest normalizes the URL after `${API_BASE}` is put in: the host's case, a default port, IDNA.
    The rendered request shows the URL as sent, so the secret must be hidden in that form too, and in
    any text (a transport error) that names the URL."""
    for name, value in {**ENV, "API_BASE": base}.items():
        monkeypatch.setenv(name, value)
    job = write_job(tmp_path, "https://unused", rows=1, request=_job()["request"])
    payload = render(load_job(job), None, "1").payload()
    assert payload is not None
    assert payload["requests"][0]["url"] == "***/v1/1?region=***"
    config = parse_job(yaml.safe_dump(_job()), file="job.yaml")
    renderer = RequestRenderer.from_config(config.request, {**ENV, "API_BASE": base}, shown=())
    assert renderer.redactor.redact(f"error sending request for url ({sent})") == (
        "error sending request for url (***/v1/1?region=***)"
    )


@pytest.mark.parametrize("host", ["LocalHost", "Bücher.Example"])
def test_a_secret_host_alone_is_hidden_in_the_form_the_wire_gives_it(host: str) -> None:
    """`http://${API_HOST}:9/...`: reqwest lower-cases (and IDNA-encodes) the host, and a connection
    error names it beside its port (`localhost:9`): the host's own spelling must be hidden, without the
    slash that parsing it as a URL adds."""
    request = {"method": "POST", "url": "http://${API_HOST}:9/v1/{id}", "json": {"id": {"from": "id"}}}
    config = parse_job(yaml.safe_dump({"version": 1, "request": request}), file="job.yaml")
    renderer = RequestRenderer.from_config(config.request, {"API_HOST": host}, shown=())
    wire_host = "localhost" if host == "LocalHost" else "xn--bcher-kva.example"
    url = f"http://{wire_host}:9/v1/1"
    said = f"ConnectError: error sending request for url ({url}): tcp connect to {wire_host}:9"
    assert renderer.redactor.redact(said) == (
        "ConnectError: error sending request for url (http://***:9/v1/1): tcp connect to ***:9"
    )
