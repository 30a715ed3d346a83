"""The HTTP seam: the engine sends a `PreparedRequest` and gets back a `Response` or a `TransportError`.

The engine only knows the `Transport` protocol and `open_transport()` (the package's face), which
builds the client the job names in `execution.client`:

    reqwest  (default) pyreqwest, bindings of Rust's reqwest and hyper: the fastest client measured here
             (docs/transport.md), in `reqwest.py`
    httpx    the Python ecosystem's standard client, with a real write timeout, in `httpx.py`

Both classify failures the same way (one contract suite, tests/relay/test_transport.py, runs against both):
`ConnectFailed` means the request was never sent, `RequestTimeout` names the phase that ran out, and
`ProtocolFailed` means the request may have reached the target but no valid answer came back.
Messages never quote the request URL, which may carry a secret.

What the transport accepts is decided in one place, bulkrelay.job.wire, which preflight asks too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple, Protocol
from urllib.parse import urlsplit

from bulkrelay._version import __version__
from bulkrelay.errors import TlsUnavailable, UsageError
from bulkrelay.job.config import DEFAULT_CLIENT, DEFAULT_PROXY, MAX_BODY_BYTES
from bulkrelay.job.records import PreparedRequest
from bulkrelay.private import UnreadableFile, read_small_file

TimeoutPhase = Literal["connect", "write", "read", "pool"]  # reqwest never says "write": see its module
ClientName = Literal["reqwest", "httpx"]

USER_AGENT = f"bulkrelay/{__version__}"


class Response(NamedTuple):
    """A response as the engine sees it.

    `headers` is case-insensitive; `truncated` marks a body cut at max_body_bytes. A NamedTuple, like
    `PreparedRequest`: one is made per request, at less than half the cost of a frozen dataclass.
    """

    status: int
    headers: Mapping[str, str]
    body: bytes
    truncated: bool = False


class Transport(Protocol):
    async def send(self, request: PreparedRequest) -> Response: ...

    async def aclose(self) -> None: ...


class TransportError(Exception):
    """No usable response: the request may or may not have reached the target."""

    classification = "transport_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConnectFailed(TransportError):
    """No connection could be made (refused, DNS failure, TLS failure): the request was not sent."""

    classification = "connect_error"


class RequestTimeout(TransportError):
    """A phase of the exchange took longer than its timeout."""

    classification = "timeout_error"

    def __init__(self, message: str, *, phase: TimeoutPhase) -> None:
        super().__init__(message)
        self.phase = phase


class ProtocolFailed(TransportError):
    """The connection broke or the answer was not valid HTTP: reset, disconnect, malformed response."""

    classification = "protocol_error"


@dataclass(frozen=True, slots=True)
class ClientCertificate:
    """A client certificate for mutual TLS: PEM files (the key may sit in the certificate's file)."""

    cert_file: Path
    key_file: Path | None = None


@dataclass(frozen=True, slots=True)
class TransportSettings:
    concurrency: int
    connect_seconds: float
    read_seconds: float
    write_seconds: float
    pool_seconds: float
    max_body_bytes: int = MAX_BODY_BYTES
    http2: bool = False  # HTTP/2 only, by prior knowledge: no HTTP/1.1 fallback
    decompress: bool = False  # decode gzip/brotli/zstd/deflate answers: when the job sends Accept-Encoding
    client: ClientName = DEFAULT_CLIENT
    proxy: str = DEFAULT_PROXY  # "none", "environment" (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY), a URL
    client_certificate: ClientCertificate | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:  # checked once here, for every client
            raise UsageError("concurrency must be at least 1", context={"concurrency": self.concurrency})


def invalid_request() -> ConnectFailed:
    return ConnectFailed("cannot send: invalid URL or header")


def host_port(url: str) -> str:
    """host:port of the URL for messages, or "the target" when Python's parser reads no host (reqwest's
    WHATWG parser is more lenient: it reads http:///name as http://name/)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return "the target"
    if not parts.hostname:
        return "the target"
    return f"{parts.hostname}:{port or (443 if parts.scheme == 'https' else 80)}"


def tls_unavailable(cause: str) -> TlsUnavailable:
    """No authority to trust at all: said before any request, the same way by both clients."""
    return TlsUnavailable(
        f"cannot make an HTTP client: {cause}",
        suggestion="install the system's CA certificates (Debian: ca-certificates), "
        "or set SSL_CERT_FILE to a PEM bundle of the authorities to trust",
    )


ENCRYPTED_KEY = (
    "its private key is encrypted, and no pass phrase is ever asked for: "
    "give a decrypted key (openssl pkey -in KEY -out PLAIN_KEY)"
)


PEM_FILE_BYTES = 1 << 20  # a certificate chain and its key are a few KB


def read_pem(path: Path) -> bytes:
    """A PEM file's bytes (a regular file of at most PEM_FILE_BYTES: `read_small_file`), or a usage error
    naming the file."""
    try:
        return read_small_file(path, PEM_FILE_BYTES)
    except UnreadableFile as refused:
        raise UsageError(
            f"cannot read the client certificate file {path}: {refused.reason}", context={"path": str(path)}
        ) from None
