"""The target's OAuth2 side (plan key `oauth`): a client-credentials token endpoint, and the bearer check
every other request then passes. For the demo's example (examples/oauth2/) and the tests of relay/auth.

    "oauth": {"token_path": "/oauth/token",
              "client_id": "demo-client", "client_secret": "demo-secret",
              "scopes": ["contacts.write"],   a scope not listed: 400 invalid_scope (absent: any scope)
              "lifetime_seconds": 3600,        how long the target accepts a token
              "expires_in": true,              say expires_in (the lifetime) in the answer; false: omit it
              "unavailable_first": 0,          the first N token requests get 503
              "hang": false,                   token requests are never answered
              "revoke_first_after": null}      the first token stops working after N requests it passed

A wrong client gets 401 `invalid_client`. A request without a live token gets 401 `invalid_token`.
The client may authenticate with HTTP Basic or in the form body. `stats()["oauth"]` counts what happened:
token_requests, issued, refused, unavailable, bearer_refusals, client_auth (basic/body), token_times.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
import time
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field


class OAuthPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    token_path: str = "/oauth/token"
    client_id: str = "demo-client"
    client_secret: str = "demo-secret"
    scopes: tuple[str, ...] | None = None
    lifetime_seconds: float = Field(default=3600.0, gt=0)
    expires_in: bool = True
    unavailable_first: int = Field(default=0, ge=0)
    hang: bool = False
    revoke_first_after: int | None = Field(default=None, ge=0)


class OAuthState:
    """The tokens issued and the counters of one target's token endpoint."""

    def __init__(self, plan: OAuthPlan) -> None:
        self.plan = plan
        self._started = time.monotonic()
        self._tokens: dict[str, tuple[float, int]] = {}  # token -> (issued at, its number from 1)
        self._uses_of_first = 0
        self.counts = {"token_requests": 0, "issued": 0, "refused": 0, "unavailable": 0, "bearer_refusals": 0}
        self.client_auth = {"basic": 0, "body": 0}
        self.token_times: list[float] = []

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "client_auth": dict(self.client_auth), "token_times": list(self.token_times)}

    def is_token_request(self, request: web.BaseRequest) -> bool:
        return request.path == self.plan.token_path

    async def token_response(self, request: web.BaseRequest, body: bytes) -> web.Response:
        now = time.monotonic()
        self.counts["token_requests"] += 1
        self.token_times.append(round(now - self._started, 6))
        if self.plan.hang:
            await asyncio.sleep(3600)
        if self.counts["token_requests"] <= self.plan.unavailable_first:
            self.counts["unavailable"] += 1
            return _json({"error": "temporarily_unavailable"}, 503)
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        refusal = self._refusal(request, form)
        if refusal is not None:
            self.counts["refused"] += 1
            return refusal
        token = f"tok-{self.counts['issued'] + 1}-{secrets.token_urlsafe(12)}"
        self.counts["issued"] += 1
        self._tokens[token] = (now, self.counts["issued"])
        answer: dict[str, Any] = {"access_token": token, "token_type": "Bearer"}
        if self.plan.expires_in:
            answer["expires_in"] = self.plan.lifetime_seconds
        return _json(answer, 200)

    def _refusal(self, request: web.BaseRequest, form: dict[str, str]) -> web.Response | None:
        if form.get("grant_type") != "client_credentials":
            return _json({"error": "unsupported_grant_type"}, 400)
        client = self._client(request, form)
        if client != (self.plan.client_id, self.plan.client_secret):
            return _json(
                {"error": "invalid_client", "error_description": "unknown client or bad secret"}, 401
            )
        scope = form.get("scope")
        if self.plan.scopes is not None and scope is not None:
            unknown = set(scope.split()) - set(self.plan.scopes)
            if unknown:
                described = f"scope {' '.join(sorted(unknown))} is not granted to this client"
                return _json({"error": "invalid_scope", "error_description": described}, 400)
        return None

    def _client(self, request: web.BaseRequest, form: dict[str, str]) -> tuple[str, str] | None:
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            self.client_auth["basic"] += 1
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            return unquote_plus(user), unquote_plus(password)
        self.client_auth["body"] += 1
        if "client_id" not in form or "client_secret" not in form:
            return None
        return form["client_id"], form["client_secret"]

    def bearer_refusal(self, request: web.BaseRequest) -> bytes | None:
        """The body of a 401 when the request carries no live token; None when it may pass."""
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else ""
        issued = self._tokens.get(token)
        if issued is not None and time.monotonic() - issued[0] < self.plan.lifetime_seconds:
            if issued[1] != 1 or self.plan.revoke_first_after is None:
                return None
            self._uses_of_first += 1
            if self._uses_of_first <= self.plan.revoke_first_after:
                return None
        self.counts["bearer_refusals"] += 1
        return b'{"error":"invalid_token"}'


def _json(data: dict[str, Any], status: int) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")
