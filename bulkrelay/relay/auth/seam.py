"""The job's `Authenticator` (base.py), chosen by its `request.auth` kind, and what `render` shows of it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from bulkrelay.errors import TargetAuthFailed
from bulkrelay.job.config import AuthConfig
from bulkrelay.job.preflight import Preflight
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.redact import REDACTED, url_for_display
from bulkrelay.relay.auth.base import Authenticator
from bulkrelay.relay.auth.hmac import HmacSigner, hmac_headers
from bulkrelay.relay.auth.oauth2 import check_token, open_token_source
from bulkrelay.relay.auth.sigv4 import CredentialsUnusable, SigV4Signer
from bulkrelay.relay.stopping import StopControl
from bulkrelay.relay.transport.base import Transport, TransportSettings


def open_authenticator(
    preflight: Preflight,
    transport_factory: Callable[[TransportSettings], Transport],
    settings: TransportSettings,
    stop: StopControl,
) -> Authenticator | None:
    """The job's authenticator (None: no `request.auth`). Call it inside the running event loop."""
    auth = preflight.job.config.request.auth
    if auth is None:
        return None
    renderer = preflight.renderer
    if auth.aws_sigv4 is not None:
        return SigV4Signer(auth.aws_sigv4, renderer.redactor, stop)
    if auth.hmac is not None:
        return HmacSigner(auth.hmac, renderer.hmac_keys, renderer.idempotency_header)
    source = open_token_source(preflight, transport_factory, settings, stop)
    assert source is not None  # oauth2
    return source


def shown_with_auth(auth: AuthConfig | None, request: PreparedRequest) -> PreparedRequest:
    """What `render` shows: `request` with the headers its authentication adds, their values `***`
    (the token and signatures are made when the run sends it; the body's hash is no secret)."""
    if auth is None:
        return request
    if auth.oauth2 is not None:
        added = [("Authorization", f"Bearer {REDACTED}")]
    elif auth.hmac is not None:
        added = [(name, REDACTED) for name in hmac_headers(auth.hmac)]
    else:
        digest = hashlib.sha256(request.body or b"").hexdigest()
        added = [("X-Amz-Content-SHA256", digest), ("X-Amz-Date", REDACTED), ("Authorization", REDACTED)]
    return request._replace(headers=(*request.headers, *added))


async def check_auth(
    preflight: Preflight,
    transport_factory: Callable[[TransportSettings], Transport],
    settings: TransportSettings,
) -> dict[str, Any]:
    """`validate --check-auth`: the job's credentials and keys load, and for OAuth2 a token is granted;
    nothing else is sent. Raises `TargetAuthFailed` (exit 8) or `TargetUnavailable` (12) saying why not."""
    auth = preflight.job.config.request.auth
    renderer = preflight.renderer
    if auth is None or auth.oauth2 is not None:
        token = await check_token(preflight, transport_factory, settings)  # refuses a job without auth
        assert renderer.token_request is not None
        shown = url_for_display(renderer.token_request.token_url, renderer.redactor)
        return {"accepted": True, "kind": "oauth2", "token_url": shown, "expires_in": token.expires_in}
    if auth.hmac is not None:
        signer = HmacSigner(auth.hmac, renderer.hmac_keys, renderer.idempotency_header)
        return {"accepted": True, **await signer.check()}
    assert auth.aws_sigv4 is not None
    try:
        checked = await SigV4Signer(auth.aws_sigv4, renderer.redactor, StopControl()).check()
    except CredentialsUnusable as exc:
        raise TargetAuthFailed(renderer.redactor.redact(str(exc)), phase="check-auth") from None
    return {"accepted": True, **checked}
