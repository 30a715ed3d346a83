"""What the token endpoint's answer and URL become (relay/auth/oauth2.py), in process: an absurd or zero
`expires_in`, an answer without one, and credentials in the token URL (issue 38, items 6 and 14)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.config import parse_job
from bulkrelay.job.oauth2 import TokenRequest
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.redact import Redactor
from bulkrelay.relay.auth import Token, TokenFailure, fetch_token
from bulkrelay.relay.retry import RetryPolicy
from bulkrelay.relay.transport.base import Response
from bulkrelay.relay.transport.mock import MockTransport

_NO_WAIT = RetryPolicy(initial_backoff_seconds=0.01, max_backoff_seconds=0.01, jitter_ratio=0)
_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
SECRET = "client-s3cret"


def _request(url: str = "https://auth.example/token", default: float | None = None) -> TokenRequest:
    form = (("grant_type", "client_credentials"),)
    return TokenRequest(url, "id", SECRET, form, "body", 60.0, default_expires_in=default)


async def _fetched(status: int, body: bytes, request: TokenRequest | None = None) -> Token | TokenFailure:
    async def answer(_: PreparedRequest) -> Response:
        return Response(status, _HEADERS, body)

    return await fetch_token(request or _request(), MockTransport(answer), _NO_WAIT, Redactor([SECRET]))


@pytest.mark.anyio
@pytest.mark.parametrize("expires_in", [b"1e400", b"1180591620717411303424", b'"99999999999999999999999"'])
async def test_a_valid_token_with_an_absurd_expires_in_is_kept_until_a_401(expires_in: bytes) -> None:
    token = await _fetched(
        200, b'{"access_token":"tok-1","token_type":"Bearer","expires_in":' + expires_in + b"}"
    )
    assert isinstance(token, Token), token
    assert token.value == "tok-1" and token.refresh_at is None


@pytest.mark.anyio
async def test_expires_in_0_is_blamed_on_the_endpoints_answer_not_our_credentials() -> None:
    failure = await _fetched(200, b'{"access_token":"tok-1","token_type":"Bearer","expires_in":0}')
    assert isinstance(failure, TokenFailure)
    assert failure.message == "the token endpoint issued a token that has already expired (expires_in: 0)"
    assert "client" not in failure.message and "credential" not in failure.message


@pytest.mark.anyio
async def test_an_answer_without_expires_in_takes_default_expires_in_seconds() -> None:
    token = await _fetched(200, b'{"access_token":"tok-1","token_type":"Bearer"}', _request(default=1800))
    assert isinstance(token, Token) and token.expires_in == 1800
    assert token.refresh_at is not None and token.refresh_at - token.obtained == pytest.approx(1740, abs=5)


@pytest.mark.anyio
async def test_credentials_in_the_token_url_are_shown_as_stars() -> None:
    request = _request("https://robot:pa55-w0rd@auth.example/token")
    failure = await _fetched(400, b'{"error":"invalid_client"}', request)
    assert isinstance(failure, TokenFailure)
    assert failure.detail["token_url"] == "https://***@auth.example/token"
    assert "pa55-w0rd" not in str(failure.detail) + failure.message


def test_a_token_url_that_cannot_be_parsed_safely_is_refused_without_echoing_it() -> None:
    text = """
version: 1
request:
  method: POST
  url: "https://api.example.com/items"
  auth: {oauth2: {token_url: "https://robot:pa/55@auth.example/token", client_id: id, client_secret: "${S}"}}
"""
    with pytest.raises(ConfigInvalid) as refused:
        parse_job(text, file="job.yaml")
    said = " ".join(problem.describe() for problem in refused.value.problems)
    assert "cannot be parsed safely" in said and "request.auth.oauth2.token_url" in said
    assert "pa/55" not in said and "robot" not in said
