"""`request.auth.hmac`: an HMAC of each attempt's final bytes, in the header(s) its scheme names.

    standard_webhooks  webhook-id, webhook-timestamp, webhook-signature: `v1,<base64>` of
                       HMAC-SHA256(key, "{id}.{timestamp}.{body}"); a `whsec_` secret is base64
                       (job/signing.py)
    github             X-Hub-Signature-256: `sha256=<hex>` of HMAC-SHA256(secret, body)
    custom             `header`: `prefix` + the HMAC (`algorithm` sha256 or sha512, `encoding` hex or base64)
                       of `signed`, a template over {timestamp} {body} {method} {path}; the timestamp also
                       in `timestamp_header` when named

A list of secrets (a rotation) gives one signature per secret, space separated, as Standard Webhooks
writes several. The webhook-id is the request's idempotency key when the job sends one, else a digest
of the request: the same message sent again (a retry) keeps its id, as the receiver's dedup expects.
`{path}` is the request target as sent: the path and its query. The timestamp is Unix seconds, taken
per attempt. Signatures are secrets: made per attempt, never kept, never written (each attempt hands its
own to the relay, `Authorized.hidden`, which hides them in whatever of the answer it writes).
"""

from __future__ import annotations

import base64
import hashlib
import hmac as hmaclib
import re
import time
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit

from bulkrelay.job.config import HmacConfig
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.auth.base import Authorized, Token
from bulkrelay.relay.transport.base import Response

_PLACEHOLDER = re.compile(r"{(timestamp|body|method|path)}")
_WEBHOOK_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def hmac_headers(config: HmacConfig) -> tuple[str, ...]:
    """The headers the scheme sends."""
    if config.scheme == "standard_webhooks":
        return _WEBHOOK_HEADERS
    if config.scheme == "github":
        return ("X-Hub-Signature-256",)
    assert config.header is not None  # the job file requires it for custom
    return (config.header,) if config.timestamp_header is None else (config.header, config.timestamp_header)


class HmacSigner:
    """The run's HMAC authenticator (relay/auth/base.py)."""

    def __init__(self, config: HmacConfig, keys: tuple[bytes, ...], idempotency_header: str | None) -> None:
        self._config = config
        self._keys = keys
        self._idempotency_header = idempotency_header.lower() if idempotency_header else None

    async def authorize(self, request: PreparedRequest) -> Authorized | None:
        signed, macs = self.signed(request, int(time.time()))
        return Authorized(signed, None, macs)

    def sign(self, request: PreparedRequest, timestamp: int) -> PreparedRequest:
        """`request` with its signature header(s) over its exact bytes, at `timestamp` (Unix seconds)."""
        return self.signed(request, timestamp)[0]

    def signed(self, request: PreparedRequest, timestamp: int) -> tuple[PreparedRequest, tuple[str, ...]]:
        """`sign`'s request, and the signatures it carries (one per key): secrets its answer must not show."""
        body = request.body or b""
        scheme = self._config.scheme
        if scheme == "standard_webhooks":
            message_id = self._message_id(request)
            content = f"{message_id}.{timestamp}.".encode() + body
            macs = tuple(_mac(key, content, "sha256", "base64") for key in self._keys)
            signature = " ".join("v1," + mac for mac in macs)
            added = list(zip(_WEBHOOK_HEADERS, (message_id, str(timestamp), signature), strict=True))
        elif scheme == "github":
            macs = tuple(_mac(key, body, "sha256", "hex") for key in self._keys)
            added = [("X-Hub-Signature-256", " ".join("sha256=" + mac for mac in macs))]
        else:
            added, macs = self._custom(request, body, timestamp)
        return request._replace(headers=(*request.headers, *added)), macs

    def _custom(
        self, request: PreparedRequest, body: bytes, timestamp: int
    ) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
        config = self._config
        assert config.header is not None
        split = urlsplit(request.url)
        values = {"timestamp": str(timestamp).encode(), "body": body, "method": request.method.encode()}
        values["path"] = ((split.path or "/") + (f"?{split.query}" if split.query else "")).encode()
        content = _PLACEHOLDER.sub(lambda match: "\0" + match.group(1) + "\0", config.signed)
        signed = b"".join(
            values[part] if index % 2 else part.encode() for index, part in enumerate(content.split("\0"))
        )
        macs = tuple(_mac(key, signed, config.algorithm, config.encoding) for key in self._keys)
        headers = [(config.header, " ".join(config.prefix + mac for mac in macs))]
        if config.timestamp_header is not None:
            headers.append((config.timestamp_header, str(timestamp)))
        return headers, macs

    def _message_id(self, request: PreparedRequest) -> str:
        """The idempotency key when sent, else a digest of what is sent: the same for a retry."""
        for name, value in request.headers:
            if name.lower() == self._idempotency_header:
                return f"msg_{value}"
        digest = hashlib.sha256(f"{request.method} {request.url}\n".encode() + (request.body or b""))
        return f"msg_{digest.hexdigest()[:32]}"

    async def renew(self, refused: Token) -> Token | None:
        return None

    def refusal(self, response: Response, hidden: Collection[str] = ()) -> str | None:
        return None  # a 401 or 403 halts as halt.on_statuses says (a wrong secret)

    async def check(self) -> dict[str, Any]:
        return {"kind": "hmac", "scheme": self._config.scheme, "secrets": len(self._keys)}

    async def aclose(self) -> None:
        return None


def _mac(key: bytes, content: bytes, algorithm: str, encoding: str) -> str:
    digest = hmaclib.new(key, content, getattr(hashlib, algorithm)).digest()
    return digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
