"""`request.auth.aws_sigv4`: each attempt signed with AWS Signature Version 4 over the exact bytes it sends.

botocore (the `aws` extra) signs, and finds the credentials along the standard chain: the environment,
the shared credentials and config files (`AWS_PROFILE`), web identity (Kubernetes IRSA), container
credentials, instance metadata. They are looked up on the first attempt, in a thread (the chain may ask
an endpoint); botocore's refreshable credentials renew themselves before they expire, and a renewal
that is due is run in a thread too. No credentials found: the run halts before any row (exit 8).

Every attempt is signed afresh (a retry gets a new `X-Amz-Date`), after every other header is set: all
of them are signed, `User-Agent` included (botocore leaves it out, as a proxy may change it; BulkRelay
sends it itself), with `X-Amz-Content-SHA256` the hash of the body as sent (a batch's, gzipped or not).
A 403 whose body says the signature or the clock is wrong halts the run with that reason (`refusal`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection
from typing import Any

import anyio

from bulkrelay.job.config import AwsSigV4Config
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.redact import Redactor
from bulkrelay.relay.auth.base import Authorized, Token
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.relay.transport.base import USER_AGENT, Response

# What a signer adds: dropped from a request before it is signed again.
_SIGNING_HEADERS = frozenset({"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"})
_ADDED = frozenset({"authorization", "x-amz-date", "x-amz-security-token"})  # what botocore sets
# Where the chain looks, for the message when it finds nothing.
LOOKED_IN = (
    "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), the shared credentials "
    "and config files (~/.aws/credentials, ~/.aws/config, AWS_PROFILE), web identity "
    "(AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), container credentials (AWS_CONTAINER_CREDENTIALS_*) and "
    "instance metadata"
)
_SIGNATURE_WORDS = re.compile(r"signature|clock|skew|expired|x-amz-date|date header", re.IGNORECASE)
_REASON_CHARS = 300


class CredentialsUnusable(Exception):
    """No credentials, or ones that cannot be loaded: the message says why and where they were looked for."""


def sign(request: PreparedRequest, credentials: Any, service: str, region: str) -> PreparedRequest:
    """`request` signed now, as it goes on the wire: with BulkRelay's User-Agent (which the transport
    would otherwise add unsigned) and `X-Amz-Content-SHA256`, the hash of its exact body."""
    headers = [(name, value) for name, value in request.headers if name.lower() not in _SIGNING_HEADERS]
    if not any(name.lower() == "user-agent" for name, _ in headers):
        headers.append(("User-Agent", USER_AGENT))
    headers.append(("X-Amz-Content-SHA256", hashlib.sha256(request.body or b"").hexdigest()))
    return sign_exact(request._replace(headers=tuple(headers)), credentials, service, region)


def sign_exact(request: PreparedRequest, credentials: Any, service: str, region: str) -> PreparedRequest:
    """`request` signed by botocore's SigV4 signer as it is, every header signed; `credentials` are
    botocore's (frozen). The published test vectors check this step (tests/relay/sigv4_vectors/)."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    class _AllHeaders(SigV4Auth):  # type: ignore[misc]
        def headers_to_sign(self, aws: AWSRequest) -> Any:
            signed = super().headers_to_sign(aws)
            if "User-Agent" in aws.headers:  # set by BulkRelay: signed like every other header it sets
                signed["user-agent"] = aws.headers["User-Agent"]
            return signed

    aws = AWSRequest(method=request.method, url=request.url, headers=dict(request.headers), data=request.body)
    _AllHeaders(credentials, service, region).add_auth(aws)
    added = [(name, aws.headers[name]) for name in ("X-Amz-Date", "X-Amz-Security-Token", "Authorization")]
    kept = [(name, value) for name, value in request.headers if name.lower() not in _ADDED]
    return request._replace(headers=(*kept, *((n, v) for n, v in added if v is not None)))


def load_credentials() -> Any:
    """The standard chain's credentials (botocore's, refreshable or not); `CredentialsUnusable` when none."""
    from botocore.exceptions import BotoCoreError
    from botocore.session import get_session

    try:
        credentials = get_session().get_credentials()
    except BotoCoreError as exc:  # a profile that does not exist, a web identity token not readable, ...
        raise CredentialsUnusable(f"AWS credentials cannot be loaded: {exc}") from None
    if credentials is None:
        raise CredentialsUnusable(f"no AWS credentials found; looked in {LOOKED_IN}")
    return credentials


class SigV4Signer:
    """The run's SigV4 authenticator (relay/auth/base.py): credentials found once, each attempt signed."""

    def __init__(self, config: AwsSigV4Config, redactor: Redactor, stop: StopControl) -> None:
        self._service, self._region = config.service, config.region
        self._redactor = redactor
        self._stop = stop
        self._credentials: Any = None
        self._failed = False
        self._lock = anyio.Lock()

    async def authorize(self, request: PreparedRequest) -> Authorized | None:
        frozen = await self._frozen()
        if frozen is None:
            return None
        signed = sign(request, frozen, self._service, self._region)
        return Authorized(signed, None, signature_of(signed))

    async def _frozen(self) -> Any:
        """The credentials to sign with now (None: none to be had, the run is stopping)."""
        credentials = self._credentials
        if credentials is not None and not _refresh_due(credentials):
            return credentials.get_frozen_credentials()  # the common case: no thread, no lock
        async with self._lock:
            if self._failed:
                return None
            try:
                return await anyio.to_thread.run_sync(self._load)
            except CredentialsUnusable as exc:
                self._failed = True
                message = self._redactor.redact(str(exc))
                self._stop.request(StopReason.AUTH_UNUSABLE, message=message, auth="aws_sigv4")
                return None

    def _load(self) -> Any:
        if self._credentials is None:
            self._credentials = load_credentials()
        try:
            frozen = self._credentials.get_frozen_credentials()  # renews refreshable ones when due
        except Exception as exc:  # botocore raises many kinds from a refresh (STS, files, metadata)
            raise CredentialsUnusable(f"AWS credentials could not be renewed: {exc}") from None
        for secret in (frozen.secret_key, frozen.token):
            if secret:
                self._redactor.learn(secret)  # before anything could echo it
        return frozen

    async def renew(self, refused: Token) -> Token | None:
        return None  # no token: a signed request is not renewed, its 401 or 403 is the policy's

    def refusal(self, response: Response, hidden: Collection[str] = ()) -> str | None:
        return signature_refusal(response, self._redactor.hiding(hidden))

    async def check(self) -> dict[str, Any]:
        frozen = await anyio.to_thread.run_sync(self._load)
        method = getattr(self._credentials, "method", None) or "unknown"
        return {"kind": "aws_sigv4", "service": self._service, "region": self._region,
                "credentials": str(method), "session": bool(frozen.token)}  # fmt: skip

    async def aclose(self) -> None:
        return None


def _refresh_due(credentials: Any) -> bool:
    """Whether botocore would renew these credentials now (a call that may block: made in a thread)."""
    refresh_needed = getattr(credentials, "refresh_needed", None)
    return bool(refresh_needed is not None and refresh_needed())


def signature_refusal(response: Response, redactor: Redactor) -> str | None:
    """A 403 whose body says the signature or the clock is wrong: that reason, for the halt."""
    if response.status != 403:
        return None
    text = " ".join(response.body[:4096].decode("utf-8", "replace").split())
    if not _SIGNATURE_WORDS.search(text):
        return None
    shown = redactor.redact_prefix(text, _REASON_CHARS)  # a secret crossing the cut is hidden whole
    return "the target refused the request's signature (403): " + shown


def signature_of(signed: PreparedRequest) -> tuple[str, ...]:
    """The signature in a signed request's `Authorization`: the one part of it that is a secret of the
    attempt (the session token and secret key are the run's redactor's; the credential scope and the
    signed headers' names are not secret, and show which key and region a failure was signed with)."""
    for name, value in signed.headers:
        if name.lower() == "authorization":
            return (value.rpartition("Signature=")[2],) if "Signature=" in value else ()
    return ()
