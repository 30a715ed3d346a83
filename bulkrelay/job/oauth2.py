"""The token request of `request.auth.oauth2`, its secrets bound: client credentials (RFC 6749 §4.4) or
the JWT bearer grant (RFC 7523 §2.1, `grant: jwt_bearer`).

Built once per job, beside the request renderer and from the same environment: what the relay posts
to the token endpoint (relay/auth/oauth2.py sends it and keeps the token), and the `Authorization: Bearer`
header every row's request then carries. The client authenticates in the form body (`client_auth:
body`, the default), with HTTP Basic (`basic`, RFC 6749 §2.3.1: id and secret form-encoded first), or
with a signed assertion (`private_key_jwt`, RFC 7523 §2.2); each assertion is made for one post.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote_plus, urlencode

from bulkrelay.errors import SecretInvalid
from bulkrelay.job.assertion import AssertionKey, load_key, read_key_file
from bulkrelay.job.config import OAuth2Config
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.redact import url_unsafe
from bulkrelay.job.template import compile_template

AUTHORIZATION = "Authorization"
_FORM = "application/x-www-form-urlencoded"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
_CLIENT_ASSERTION = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


def _ignore(_: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """What the token endpoint is sent, secrets in place: never shown, never written."""

    token_url: str
    client_id: str
    client_secret: str | None
    form: tuple[tuple[str, str], ...]  # grant_type, scope, params (and the client, with `body`)
    client_auth: str
    refresh_before_seconds: float
    grant: str = "client_credentials"
    key: AssertionKey | None = field(default=None, repr=False)  # jwt_bearer, private_key_jwt
    subject: str | None = None  # the assertion's `sub` for jwt_bearer
    audience: str | None = None  # its `aud` (default: the token URL)
    default_expires_in: float | None = None  # when the answer says no expires_in

    @property
    def basic_credentials(self) -> str:
        """`id:secret` as Basic auth encodes it (each form-encoded first), for the redactor too."""
        return f"{quote_plus(self.client_id)}:{quote_plus(self.client_secret or '')}"

    def prepared(self, learn: Callable[[str], None] = _ignore) -> PreparedRequest:
        """The post to the token endpoint; each assertion in it is new, and `learn` hears it first."""
        headers = [("Content-Type", _FORM), ("Accept", "application/json")]
        form = list(self.form)
        audience = self.audience or self.token_url
        if self.grant == "jwt_bearer":
            assert self.key is not None and self.subject is not None  # the job file requires them
            form.append(
                ("assertion", _learnt(self.key.assertion(self.client_id, self.subject, audience), learn))
            )
        if self.client_auth == "private_key_jwt":
            assert self.key is not None
            signed = _learnt(self.key.assertion(self.client_id, self.client_id, audience), learn)
            form += [("client_id", self.client_id), ("client_assertion_type", _CLIENT_ASSERTION)]
            form.append(("client_assertion", signed))
        elif self.client_auth == "basic":
            encoded = base64.b64encode(self.basic_credentials.encode()).decode()
            headers.append((AUTHORIZATION, f"Basic {encoded}"))
        elif self.client_secret is not None:
            form += [("client_id", self.client_id), ("client_secret", self.client_secret)]
        elif self.grant != "jwt_bearer":
            form.append(("client_id", self.client_id))
        return PreparedRequest("POST", self.token_url, tuple(headers), urlencode(form).encode())


def _learnt(secret: str, learn: Callable[[str], None]) -> str:
    learn(secret)
    return secret


def bind_token_request(
    config: OAuth2Config, secrets: Mapping[str, str], base_dir: Path | None = None
) -> TokenRequest:
    """The token request with every `${NAME}` replaced (`secrets` holds each one named) and its key
    loaded (`private_key_file` relative to `base_dir`, the job file's directory)."""

    def bound(text: str) -> str:
        rendered = compile_template(text).bind(secrets).constant
        assert rendered is not None  # the job file refuses a {field} here
        return rendered

    grant = JWT_BEARER if config.grant == "jwt_bearer" else "client_credentials"
    form = [("grant_type", grant)]
    if config.scope is not None:
        form.append(("scope", bound(config.scope)))
    form += [(name, bound(value)) for name, value in config.params.items()]
    token_url = bound(config.token_url)
    unsafe = url_unsafe(token_url)
    if unsafe is not None:
        names = sorted(compile_template(config.token_url).secrets)
        raise SecretInvalid(
            f"request.auth.oauth2.token_url with {', '.join(names)} in place cannot be parsed safely "
            f"({unsafe}); it is not shown",
            context={"invalid": names},
            suggestion="percent-encode the user and password in the URL (/ as %2F, @ as %40, # as %23)",
        )
    return TokenRequest(
        token_url=token_url,
        client_id=bound(config.client_id),
        client_secret=None if config.client_secret is None else bound(config.client_secret),
        form=tuple(form),
        client_auth=config.client_auth,
        refresh_before_seconds=config.refresh_before_seconds,
        grant=config.grant,
        key=_key(config, bound, base_dir),
        subject=None if config.subject is None else bound(config.subject),
        audience=None if config.audience is None else bound(config.audience),
        default_expires_in=config.default_expires_in_seconds,
    )


def _key(config: OAuth2Config, bound: Callable[[str], str], base_dir: Path | None) -> AssertionKey | None:
    if config.private_key is not None:
        names = sorted(compile_template(config.private_key).secrets)
        return load_key(bound(config.private_key), "$" + ", $".join(names), "private_key")
    if config.private_key_file is not None:
        path = (base_dir or Path.cwd()) / config.private_key_file
        return load_key(read_key_file(path), str(path), "private_key_file")
    return None


def with_bearer(request: PreparedRequest, token: str) -> PreparedRequest:
    """`request` carrying the token (`***` in what `render` shows)."""
    headers = (*request.headers, (AUTHORIZATION, f"Bearer {token}"))
    return PreparedRequest(request.method, request.url, headers, request.body)
