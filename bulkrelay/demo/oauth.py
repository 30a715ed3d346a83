"""The target's OAuth2 side (plan key `oauth`): a client-credentials token endpoint, and the bearer check
every other request then passes. For the demo's example (examples/oauth2/) and the tests of relay/auth.

    "oauth": {"token_path": "/oauth/token",
              "client_id": "demo-client", "client_secret": "demo-secret",
              "scopes": ["contacts.write"],   a scope not listed: 400 invalid_scope (absent: any scope)
              "lifetime_seconds": 3600,        how long the target accepts a token
              "expires_in": true,              say expires_in (the lifetime) in the answer; false: omit it
              "unavailable_first": 0,          the first N token requests get 503
              "hang": false,                   token requests are never answered
              "revoke_first_after": null,      the first token stops working after N requests it passed
              "public_key": null,              PEM: JWT assertions verified with it (RS256 or ES256): the
                                               jwt_bearer grant and private_key_jwt client authentication
              "subject": null,                 the jwt_bearer assertion's sub
              "audience": "https://login.example.com"}   every assertion's aud

An assertion is checked by this module's own code (`cryptography`, not PyJWT): its signature, `iss`
the client id, `sub`, `aud`, `exp` in the future and at most 180 s after `iat`, a `jti` never seen
before; a bad one gets 400 `invalid_grant` (the grant) or 401 `invalid_client` (client authentication).

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
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.serialization import load_pem_public_key
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
    public_key: str | None = None
    subject: str | None = None
    audience: str = "https://login.example.com"


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
        self.jtis: set[str] = set()  # every assertion's jti seen: one used twice is refused
        self.assertion_refusals: list[str] = []

    def stats(self) -> dict[str, Any]:
        return {
            **self.counts,
            "client_auth": dict(self.client_auth),
            "token_times": list(self.token_times),
            "assertions": len(self.jtis),
            "assertion_refusals": list(self.assertion_refusals),
        }

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
        grant = form.get("grant_type")
        if grant == _JWT_BEARER and self.plan.public_key is not None:
            why = self._assertion_problem(form.get("assertion", ""), self.plan.subject)
            if why is not None:
                return _json({"error": "invalid_grant", "error_description": why}, 400)
            if "client_assertion" not in form and "client_secret" not in form:
                return None  # the assertion alone authenticates (Salesforce, Google)
        elif grant != "client_credentials":
            return _json({"error": "unsupported_grant_type"}, 400)
        if form.get("client_assertion_type") == _CLIENT_ASSERTION and self.plan.public_key is not None:
            why = self._assertion_problem(form.get("client_assertion", ""), self.plan.client_id)
            if why is not None or form.get("client_id", self.plan.client_id) != self.plan.client_id:
                return _json({"error": "invalid_client", "error_description": why or "unknown client"}, 401)
            return None
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

    def _assertion_problem(self, assertion: str, subject: str | None) -> str | None:
        """Why the JWT assertion is refused (None: it is good); its jti is then spent."""
        assert self.plan.public_key is not None
        why = assertion_problem(
            assertion, self.plan.public_key, self.plan.client_id, subject, self.plan.audience
        )
        if why is None:
            jti = _claims(assertion)["jti"]
            why = f"jti {jti} was used before" if jti in self.jtis else None
            self.jtis.add(jti)
        if why is not None:
            self.assertion_refusals.append(why)
        return why

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


_JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
_CLIENT_ASSERTION = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
_LONGEST_ASSERTION = 180  # seconds from iat to exp


def assertion_problem(
    assertion: str, public_pem: str, issuer: str, subject: str | None, audience: str
) -> str | None:
    """Why a JWT assertion is not good (RFC 7523 §3), checked with `cryptography` alone; None when good."""
    try:
        head_b64, claims_b64, signature_b64 = assertion.split(".")
        header = orjson.loads(_unb64(head_b64))
        claims = orjson.loads(_unb64(claims_b64))
        signature = _unb64(signature_b64)
    except (ValueError, binascii.Error, orjson.JSONDecodeError):
        return "not a JWT"
    public = load_pem_public_key(public_pem.encode())
    signed = f"{head_b64}.{claims_b64}".encode()
    try:
        if header.get("alg") == "RS256" and isinstance(public, rsa.RSAPublicKey):
            public.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
        elif (
            header.get("alg") == "ES256"
            and isinstance(public, ec.EllipticCurvePublicKey)
            and len(signature) == 64
        ):
            der = encode_dss_signature(int.from_bytes(signature[:32]), int.from_bytes(signature[32:]))
            public.verify(der, signed, ec.ECDSA(hashes.SHA256()))
        else:
            return f"alg {header.get('alg')!r} does not fit the key"
    except InvalidSignature:
        return "bad signature"
    now = time.time()
    expected = {"iss": issuer, "sub": subject or issuer, "aud": audience}
    wrong = [name for name, value in expected.items() if claims.get(name) != value]
    if wrong:
        return f"claim {wrong[0]} is {claims.get(wrong[0])!r}"
    iat, exp = claims.get("iat"), claims.get("exp")
    if not (
        isinstance(iat, int) and isinstance(exp, int) and iat - 60 <= now < exp <= iat + _LONGEST_ASSERTION
    ):
        return "iat/exp missing, expired, or exp more than 3 minutes after iat"
    return None if isinstance(claims.get("jti"), str) and claims["jti"] else "no jti"


def _claims(assertion: str) -> dict[str, Any]:
    claims: dict[str, Any] = orjson.loads(_unb64(assertion.split(".")[1]))
    return claims


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
