"""The token request of `request.auth.oauth2` (RFC 6749 §4.4, client credentials), its secrets bound.

Built once per job, beside the request renderer and from the same environment: what the relay posts
to the token endpoint (relay/auth/oauth2.py sends it and keeps the token), and the `Authorization: Bearer`
header every row's request then carries. The client authenticates in the form body (`client_auth:
body`, the default) or with HTTP Basic (`basic`, RFC 6749 §2.3.1: id and secret form-encoded first).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote_plus, urlencode

from bulkrelay.job.config import OAuth2Config
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.template import compile_template

AUTHORIZATION = "Authorization"
_FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """What the token endpoint is sent, secrets in place: never shown, never written."""

    token_url: str
    client_id: str
    client_secret: str
    form: tuple[tuple[str, str], ...]  # grant_type, scope, params (and the client, with `body`)
    client_auth: str
    refresh_before_seconds: float

    @property
    def basic_credentials(self) -> str:
        """`id:secret` as Basic auth encodes it (each form-encoded first), for the redactor too."""
        return f"{quote_plus(self.client_id)}:{quote_plus(self.client_secret)}"

    def prepared(self) -> PreparedRequest:
        headers = [("Content-Type", _FORM), ("Accept", "application/json")]
        form = list(self.form)
        if self.client_auth == "basic":
            encoded = base64.b64encode(self.basic_credentials.encode()).decode()
            headers.append((AUTHORIZATION, f"Basic {encoded}"))
        else:
            form += [("client_id", self.client_id), ("client_secret", self.client_secret)]
        return PreparedRequest("POST", self.token_url, tuple(headers), urlencode(form).encode())


def oauth2_secret_names(config: OAuth2Config) -> set[str]:
    """The `${NAME}`s the token request reads from the environment."""
    return {name for text in _texts(config) for name in compile_template(text).secrets}


def bind_token_request(config: OAuth2Config, secrets: Mapping[str, str]) -> TokenRequest:
    """The token request with every `${NAME}` replaced (`secrets` holds each one named)."""

    def bound(text: str) -> str:
        rendered = compile_template(text).bind(secrets).constant
        assert rendered is not None  # the job file refuses a {field} here
        return rendered

    form = [("grant_type", "client_credentials")]
    if config.scope is not None:
        form.append(("scope", bound(config.scope)))
    form += [(name, bound(value)) for name, value in config.params.items()]
    return TokenRequest(
        token_url=bound(config.token_url),
        client_id=bound(config.client_id),
        client_secret=bound(config.client_secret),
        form=tuple(form),
        client_auth=config.client_auth,
        refresh_before_seconds=config.refresh_before_seconds,
    )


def with_bearer(request: PreparedRequest, token: str) -> PreparedRequest:
    """`request` carrying the token (`***` in what `render` shows)."""
    headers = (*request.headers, (AUTHORIZATION, f"Bearer {token}"))
    return PreparedRequest(request.method, request.url, headers, request.body)


def _texts(config: OAuth2Config) -> list[str]:
    texts = [config.token_url, config.client_id, config.client_secret, *config.params.values()]
    return texts if config.scope is None else [*texts, config.scope]
