"""The target's signature checks (plan key `signed`): each request (an attempt) is verified before any
rule, on its exact bytes, by code written from the schemes' own specifications, never with BulkRelay's
signers (nor botocore's): what the tests of relay/auth/ run against.

    "signed": {"scheme": "aws_sigv4",            aws_sigv4 | standard_webhooks | github | custom
               "access_key": "AKID...", "secret_key": "...", "region": "eu-west-1", "service": "es",
               "session_token": null,             when set, X-Amz-Security-Token must be it (and signed)
               "clock_skew_seconds": 300,         X-Amz-Date further from now: 403 "Signature expired"
               "secrets": ["whsec_..."],          the HMAC schemes: the receiver's secrets (any may match)
               "header": "X-Signature", "algorithm": "sha256", "encoding": "hex", "prefix": "",
               "signed": "{body}", "timestamp_header": null}          custom, as the job file says

SigV4 follows the AWS specification ("Create a signed AWS API request", Signature Version 4): the
canonical request from what arrived (method; the path normalised, each segment URI-encoded again; the
query's names and values decoded, encoded, sorted; the signed headers lower-cased, values trimmed;
`X-Amz-Content-SHA256`, which must be the hash of the body received), the string to sign and the
derived key. Every header the request carries but those the client library adds itself (`accept`,
`accept-encoding`, `content-length`, `connection`) must be among the signed ones. A bad signature
answers 403 as API Gateway does; a wrong key 403 "security token ... invalid"; HMAC failures 401.
`stats()["signed"]`: verified, refused, and the refusals' reasons.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from calendar import timegm
from typing import Any, Literal
from urllib.parse import unquote_to_bytes

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

_UNSIGNED_OK = frozenset({"accept", "accept-encoding", "content-length", "connection", "authorization"})
_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^,]+), ?SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})$")
_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your AWS "
    "Secret Access Key and signing method. Consult the service documentation for details."
)
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")


class SignedPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    scheme: Literal["aws_sigv4", "standard_webhooks", "github", "custom"]
    access_key: str = ""
    secret_key: str = ""
    region: str = ""
    service: str = ""
    session_token: str | None = None
    clock_skew_seconds: float = Field(default=300.0, gt=0)
    secrets: tuple[str, ...] = ()
    header: str = "X-Signature"
    algorithm: Literal["sha256", "sha512"] = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: str = ""
    signed: str = "{body}"
    timestamp_header: str | None = None


class Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SignatureCheck:
    """One target's verifier and its counts."""

    def __init__(self, plan: SignedPlan) -> None:
        self.plan = plan
        self.counts = {"verified": 0, "refused": 0}
        self.reasons: list[str] = []
        self.signed_headers: list[str] = []  # the SignedHeaders of the last SigV4 request verified

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "reasons": list(self.reasons), "signed_headers": list(self.signed_headers)}

    def refusal(self, request: web.BaseRequest, body: bytes) -> tuple[int, bytes] | None:
        """(status, body) when the request's signature does not verify; None when it does."""
        try:
            if self.plan.scheme == "aws_sigv4":
                self._sigv4(request, body)
            else:
                self._hmac(request, body)
        except Refusal as refused:
            self.counts["refused"] += 1
            self.reasons.append(str(refused))
            return refused.status, ('{"message":"' + str(refused).replace('"', "'") + '"}').encode()
        self.counts["verified"] += 1
        return None

    # --- SigV4 ------------------------------------------------------------------------------

    def _sigv4(self, request: web.BaseRequest, body: bytes) -> None:
        plan = self.plan
        match = _AUTH.fullmatch(request.headers.get("Authorization", ""))
        if match is None:
            raise Refusal(403, "Missing Authentication Token")
        credential, signed_headers, signature = match.groups()
        key_id, _, scope = credential.partition("/")
        date = request.headers.get("X-Amz-Date", "")
        if key_id != plan.access_key:
            raise Refusal(403, "The security token included in the request is invalid.")
        if scope != f"{date[:8]}/{plan.region}/{plan.service}/aws4_request":
            raise Refusal(403, f"Credential should be scoped to a valid region and service: {scope}")
        _fresh(date, plan.clock_skew_seconds)
        names = signed_headers.split(";")
        required = {"host", "x-amz-date", "x-amz-content-sha256"} | (
            {"x-amz-security-token"} if plan.session_token else set()
        )
        unsigned = sorted(
            ({n.lower() for n in request.headers} - _UNSIGNED_OK) - set(names) | required - set(names)
        )
        if unsigned:
            raise Refusal(403, f"{_MISMATCH} (header {unsigned[0]} is not signed)")
        if (
            plan.session_token is not None
            and request.headers.get("X-Amz-Security-Token") != plan.session_token
        ):
            raise Refusal(403, "The security token included in the request is invalid.")
        if request.headers.get("X-Amz-Content-SHA256") != hashlib.sha256(body).hexdigest():
            raise Refusal(400, "The provided 'x-amz-content-sha256' header does not match what was computed.")
        canonical = canonical_request(request.method, request.raw_path, request.headers, names, body)
        expected = sigv4_signature(plan.secret_key, date, plan.region, plan.service, canonical)
        if not hmac.compare_digest(expected, signature):
            raise Refusal(403, _MISMATCH)
        self.signed_headers = names

    # --- HMAC -------------------------------------------------------------------------------

    def _hmac(self, request: web.BaseRequest, body: bytes) -> None:
        plan = self.plan
        if plan.scheme == "standard_webhooks":
            message_id = request.headers.get("webhook-id", "")
            timestamp = request.headers.get("webhook-timestamp", "")
            _fresh_seconds(timestamp, plan.clock_skew_seconds)
            content = f"{message_id}.{timestamp}.".encode() + body
            wanted = {"v1," + _mac(_webhook_key(s), content, "sha256", "base64") for s in plan.secrets}
            given = set(request.headers.get("webhook-signature", "").split())
        elif plan.scheme == "github":
            wanted = {"sha256=" + _mac(s.encode(), body, "sha256", "hex") for s in plan.secrets}
            given = set(request.headers.get("X-Hub-Signature-256", "").split())
        else:
            content = self._custom_content(request, body)
            wanted = {
                plan.prefix + _mac(s.encode(), content, plan.algorithm, plan.encoding) for s in plan.secrets
            }
            given = set(request.headers.get(plan.header, "").split())
        if not wanted & given:
            raise Refusal(401, f"{plan.scheme} signature does not match")

    def _custom_content(self, request: web.BaseRequest, body: bytes) -> bytes:
        plan = self.plan
        timestamp = request.headers.get(plan.timestamp_header, "") if plan.timestamp_header else ""
        if plan.timestamp_header:
            _fresh_seconds(timestamp, plan.clock_skew_seconds)
        values = {"{timestamp}": timestamp.encode(), "{body}": body, "{method}": request.method.encode()}
        values["{path}"] = request.raw_path.encode()
        parts = re.split(r"({timestamp}|{body}|{method}|{path})", plan.signed)
        return b"".join(values.get(part, part.encode()) for part in parts)


def canonical_request(method: str, raw_path: str, headers: Any, signed: list[str], body: bytes) -> str:
    """The SigV4 canonical request of what arrived (the specification's six lines)."""
    path, _, query = raw_path.partition("?")
    lines = [method.upper(), _canonical_path(path), _canonical_query(query)]
    lines += [f"{name}:{','.join(' '.join(v.split()) for v in headers.getall(name))}" for name in signed]
    lines += ["", ";".join(signed), headers.get("X-Amz-Content-SHA256") or hashlib.sha256(body).hexdigest()]
    return "\n".join(lines)


def sigv4_signature(secret_key: str, date: str, region: str, service: str, canonical: str) -> str:
    scope = f"{date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret_key).encode()
    for part in (date[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _canonical_path(path: str) -> str:
    """RFC 3986 dot segments removed, then each segment URI-encoded (again: it arrived encoded once)."""
    segments: list[str] = []
    for segment in path.split("/")[1:]:
        if segment == "..":
            segments = segments[:-1]
        elif segment != ".":
            segments.append(segment)
    return "/" + "/".join(_uri_encode(segment.encode()) for segment in segments)


def _canonical_query(query: str) -> str:
    pairs = []
    for pair in query.split("&") if query else []:
        name, _, value = pair.partition("=")
        pairs.append((_uri_encode(unquote_to_bytes(name)), _uri_encode(unquote_to_bytes(value))))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def _uri_encode(data: bytes) -> str:
    return "".join(chr(byte) if byte in _UNRESERVED else f"%{byte:02X}" for byte in data)


def _fresh(amz_date: str, skew: float) -> None:
    try:
        signed_at = timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ"))
    except ValueError:
        raise Refusal(403, "X-Amz-Date is not a valid date") from None
    if abs(time.time() - signed_at) > skew:
        raise Refusal(403, f"Signature expired: {amz_date} is now earlier or later than the allowed skew")


def _fresh_seconds(timestamp: str, skew: float) -> None:
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > skew:
        raise Refusal(401, "timestamp missing or too far from now")


def _webhook_key(secret: str) -> bytes:
    try:
        return (
            base64.b64decode(secret.removeprefix("whsec_"))
            if secret.startswith("whsec_")
            else secret.encode()
        )
    except binascii.Error:
        return secret.encode()


def _mac(key: bytes, content: bytes, algorithm: str, encoding: str) -> str:
    digest = hmac.new(key, content, getattr(hashlib, algorithm)).digest()
    return digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
