"""The HTTP seam: the engine sends a `PreparedRequest` and gets back a `Response` or a `TransportError`.

The engine only knows the `Transport` protocol; `open_transport()` returns the pyreqwest implementation,
and tests substitute in-process fakes. pyreqwest (Python bindings of Rust's reqwest and hyper) was chosen
because it is about twice as fast as aiohttp and several times faster than httpx on a small machine (see
docs/transport.md for the measurement).

Timeout phases map onto reqwest like this:

    pool     waiting for one of `concurrency` request slots (pool_timeout)                  -> phase "pool"
    connect  DNS, TCP and TLS of a new connection (connect_timeout)                         -> phase "connect"
    read     reqwest's read_timeout: from sending the request to its response headers, then the longest
             silence between pieces of the body                                             -> phase "read"
    write    reqwest has no write timer: reqwest's read timer already runs while the body is sent, and
             the whole exchange has a deadline, timeout = connect + write + read            -> phase "read"

What the transport accepts is decided here and nowhere else: `wire_url` and `header_value_refusal` ask
pyreqwest's own parsers (the ones `send` goes through), so preflight refuses exactly what the transport
would, and `render` shows the URL exactly as it goes on the wire.

reqwest's errors say less than we need (a reset after the request went out and a refused connection are
both a "ConnectError"), so `_translate` also reads the error's cause chain: only a failure inside hyper's
connect step ("client error (Connect)") means the request was never sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol
from urllib.parse import urlsplit

from pyreqwest import exceptions as rq
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.http import HeaderMap, Url
from pyreqwest.response import Response as StreamedResponse

from bulkrelay import __version__
from bulkrelay.errors import TlsUnavailable, UsageError
from bulkrelay.records import PreparedRequest

TimeoutPhase = Literal["connect", "read", "pool"]  # no "write": see the module docstring

_READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Response:
    """A response as the engine sees it.

    `headers` is case-insensitive (pyreqwest's HeaderMap); `truncated` marks a body cut at max_body_bytes.
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
class TransportSettings:
    concurrency: int
    connect_seconds: float
    read_seconds: float
    write_seconds: float
    pool_seconds: float
    max_body_bytes: int = 1 << 20
    http2: bool = False  # HTTP/2 only, by prior knowledge: no HTTP/1.1 fallback
    decompress: bool = False  # decode gzip/brotli/zstd/deflate answers: when the job sends Accept-Encoding


def open_transport(settings: TransportSettings) -> Transport:
    """The transport the engine uses. Call it inside the running event loop."""
    return ReqwestTransport(settings)


def wire_url(url: str) -> str:
    """`url` exactly as the transport sends it; raises `ValueError` (naming no part of it) when refused.

    reqwest parses URLs the WHATWG way: it resolves dot segments (`.`, `..`, `%2e`), lower-cases the
    scheme and host, drops a default port, percent-encodes what may not appear raw and silently drops
    tabs and line breaks. A fragment is never sent, so it is not part of what goes on the wire.
    """
    # One parse and one serialisation: this runs for every row. The first "#" always begins the fragment,
    # and a special scheme without a host does not parse.
    sent = str(Url(url.partition("#")[0]))
    if not sent.startswith(("http://", "https://")):
        raise ValueError("the scheme is not http or https")
    return sent


def header_value_refusal(value: str) -> str | None:
    """Why the transport would refuse `value` as a header value, or None when it is accepted.

    The reason names the offending character's code point, never the value (it may be a secret)."""
    if value.isascii() and value.isprintable():
        return None  # visible ASCII and spaces: every HTTP library accepts these; the common case, kept fast
    try:
        HeaderMap([("x", value)])
    except ValueError:
        bad = next((ch for ch in value if (ord(ch) < 32 and ch != "\t") or ord(ch) == 127), None)
        if bad is None:
            return "holds a character a header cannot carry"
        kind = "a line break" if bad in "\r\n" else "the control character"
        return f"holds {kind} U+{ord(bad):04X}"
    return None


class ReqwestTransport:
    """One pyreqwest client with a keep-alive pool of `concurrency` connections, no cookies, no redirects."""

    def __init__(self, settings: TransportSettings) -> None:
        if settings.concurrency < 1:
            raise UsageError("concurrency must be at least 1", context={"concurrency": settings.concurrency})
        self._settings = settings
        self._client = _build_client(settings)

    async def send(self, request: PreparedRequest) -> Response:
        try:
            builder = self._client.request(request.method, request.url).headers(request.headers)
            if request.body is not None:
                builder = builder.body_bytes(request.body)
            streamed = builder.build_streamed()
        except ValueError:  # pyreqwest's URL and header parsing; preflight has normally caught these
            raise _invalid_request() from None
        try:
            async with streamed as resp:
                body, truncated = await _read_bounded(resp, self._settings.max_body_bytes)
                return Response(resp.status, resp.headers, body, truncated)
        except rq.PyreqwestError as exc:
            raise _translate(exc, request.url) from None

    async def aclose(self) -> None:
        await self._client.close()


def _build_client(settings: TransportSettings) -> Client:
    builder = (
        ClientBuilder()
        .max_connections(settings.concurrency)
        .pool_max_idle_per_host(settings.concurrency)
        .pool_timeout(_seconds(settings.pool_seconds))
        .connect_timeout(_seconds(settings.connect_seconds))
        .read_timeout(_seconds(settings.read_seconds))
        .timeout(_seconds(settings.connect_seconds + settings.write_seconds + settings.read_seconds))
        .user_agent(f"bulkrelay/{__version__}")
        .follow_redirects(False)  # a 302 must not turn a POST into a GET behind the user's back
        .default_cookie_store(False)  # rows never influence each other through the transport
        .no_proxy()  # the target is what the job names, whatever the environment says
        .tcp_nodelay(True)
    )
    # The wire carries what the request says: no Accept-Encoding unless the job sets one, in which case
    # reqwest keeps the job's header and decodes the answer.
    decode = settings.decompress
    builder = builder.gzip(decode).brotli(decode).zstd(decode).deflate(decode)
    builder = builder.http2_prior_knowledge() if settings.http2 else builder.http1_only()
    try:
        return builder.build()
    except rq.BuilderError as exc:
        # reqwest loads the system's CA store when the client is built and refuses an empty one.
        raise TlsUnavailable(
            f"cannot make an HTTP client: {_root_cause(exc)}",
            suggestion="install the system's CA certificates (Debian: ca-certificates), "
            "or set SSL_CERT_FILE to a PEM bundle of the authorities to trust",
        ) from None


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


async def _read_bounded(resp: StreamedResponse, limit: int) -> tuple[bytes, bool]:
    """The body, at most `limit` bytes of it; the rest is not read (the connection is then dropped)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await resp.body_reader.read(_READ_CHUNK)
        if chunk is None:
            return b"".join(chunks), False
        chunks.append(bytes(chunk))
        size += len(chunk)
    return b"".join(chunks)[:limit], True


def _translate(exc: rq.PyreqwestError, url: str) -> TransportError:
    """The pyreqwest exception as one of our three kinds.

    Messages never quote the request URL, which may carry a secret; reqwest's own texts do.
    """
    in_connect = _failed_in_connect(exc)
    if isinstance(exc, rq.PoolTimeoutError):
        return RequestTimeout("pool timeout: no free connection slot in time", phase="pool")
    if isinstance(exc, rq.RequestTimeoutError):
        if in_connect:
            return RequestTimeout("connect timeout", phase="connect")
        return RequestTimeout("read timeout: no answer from the target in time", phase="read")
    if in_connect:
        return ConnectFailed(f"cannot connect to {_host_port(url)}: {_root_cause(exc)}")
    if isinstance(exc, rq.BuilderError):  # what reqwest refuses only when sending (a scheme, say)
        return _invalid_request()
    if isinstance(exc, rq.DecodeError):
        return ProtocolFailed(f"bad response: {_root_cause(exc)}")
    if isinstance(exc, rq.NetworkError):
        return ProtocolFailed(f"connection broken: {_root_cause(exc)}")
    return ProtocolFailed(f"{type(exc).__name__}: {_root_cause(exc)}")


def _invalid_request() -> ConnectFailed:
    return ConnectFailed("cannot send: invalid URL or header")


# hyper-util's text for a failure in its connect step (DNS, TCP, TLS): the request was not written.
_CONNECT_CAUSE = "client error (Connect)"


def _causes(exc: rq.PyreqwestError) -> list[str]:
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, dict) else None
    return [str(cause.get("message", "")) for cause in causes or ()]


def _failed_in_connect(exc: rq.PyreqwestError) -> bool:
    return _CONNECT_CAUSE in _causes(exc)


def _host_port(url: str) -> str:
    """host:port of the URL for messages, or "the target" when Python's parser reads no host (reqwest's
    WHATWG parser is more lenient: it reads http:///name as http://name/)."""
    parts = urlsplit(url)
    if not parts.hostname:
        return "the target"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def _root_cause(exc: rq.PyreqwestError) -> str:
    """The innermost cause reqwest reports ("Connection refused (os error 111)"), which names no URL."""
    causes = _causes(exc)
    return causes[-1] if causes and "://" not in causes[-1] else type(exc).__name__
