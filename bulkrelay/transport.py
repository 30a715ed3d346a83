"""The HTTP seam: the engine sends a `PreparedRequest` and gets back a `Response` or a `TransportError`.

The engine only knows the `Transport` protocol; `open_transport()` returns the aiohttp implementation,
and tests substitute in-process fakes. aiohttp was chosen because it is several times faster than httpx on
a small machine (see docs/transport.md for the measurement).

Timeout phases map onto aiohttp like this (aiohttp has no write timeout of its own):

    pool     waiting for one of `concurrency` request slots, enforced here by a semaphore   -> phase "pool"
    connect  ClientTimeout.connect and .sock_connect (DNS, TCP and TLS of a new connection) -> phase "connect"
    read     ClientTimeout.sock_read: the longest silence while waiting for response bytes  -> phase "read"
    write    a deadline on the whole exchange, ClientTimeout.total = connect + write + read;
             it fires "write" before the response headers arrived, "read" after
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import aiohttp

from bulkrelay import __version__
from bulkrelay.errors import UsageError
from bulkrelay.records import PreparedRequest

TimeoutPhase = Literal["connect", "read", "write", "pool"]

_READ_CHUNK = 64 * 1024
_LARGE_BODY = 1 << 20  # aiohttp warns about bigger bytes bodies; they are streamed from a BytesIO instead


@dataclass(frozen=True, slots=True)
class Response:
    """A response as the engine sees it.

    `headers` is case-insensitive (a CIMultiDictProxy); `truncated` marks a body cut at max_body_bytes.
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
    http2: bool = False


def open_transport(settings: TransportSettings) -> Transport:
    """The transport the engine uses. Call it inside the running event loop."""
    if settings.http2:
        raise UsageError(
            "HTTP/2 is not supported: the transport (aiohttp) speaks HTTP/1.1 only",
            suggestion="remove the http2 setting; keep-alive connections are pooled per target",
            context={"setting": "http2"},
        )
    return AiohttpTransport(settings)


class AiohttpTransport:
    """One aiohttp session with a keep-alive pool of `concurrency` connections, no cookies, no redirects."""

    def __init__(self, settings: TransportSettings) -> None:
        if settings.concurrency < 1:
            raise UsageError("concurrency must be at least 1", context={"concurrency": settings.concurrency})
        self._settings = settings
        self._slots = asyncio.Semaphore(settings.concurrency)
        connector = aiohttp.TCPConnector(
            limit=settings.concurrency, limit_per_host=settings.concurrency, force_close=False
        )
        timeout = aiohttp.ClientTimeout(
            total=settings.connect_seconds + settings.write_seconds + settings.read_seconds,
            connect=settings.connect_seconds,
            sock_connect=settings.connect_seconds,
            sock_read=settings.read_seconds,
        )
        # The wire carries what the request says: no implicit Content-Type, and no
        # Accept-Encoding unless the job asks for compression (the body is then decoded).
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": f"bulkrelay/{__version__}"},
            skip_auto_headers=("Accept-Encoding", "Content-Type"),
            raise_for_status=False,
        )

    async def send(self, request: PreparedRequest) -> Response:
        if self._slots.locked():
            await self._wait_for_slot()
        else:
            await self._slots.acquire()
        try:
            return await self._exchange(request)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        await self._session.close()

    async def _wait_for_slot(self) -> None:
        try:
            async with asyncio.timeout(self._settings.pool_seconds):
                await self._slots.acquire()
        except TimeoutError:
            waited = self._settings.pool_seconds
            raise RequestTimeout(f"pool timeout: no free slot within {waited}s", phase="pool") from None

    async def _exchange(self, request: PreparedRequest) -> Response:
        headers_received = False
        body = request.body
        data = io.BytesIO(body) if body is not None and len(body) > _LARGE_BODY else body
        try:
            async with self._session.request(
                request.method,
                request.url,
                headers=request.headers,
                data=data,
                allow_redirects=False,
            ) as resp:
                headers_received = True
                body, truncated = await _read_bounded(resp, self._settings.max_body_bytes)
                return Response(resp.status, resp.headers, body, truncated)
        except aiohttp.ClientError as exc:
            raise _translate(exc) from exc
        except TimeoutError as exc:  # the whole-exchange deadline (ClientTimeout.total)
            phase: TimeoutPhase = "read" if headers_received else "write"
            raise RequestTimeout(f"{phase} timeout: the exchange took too long", phase=phase) from exc


async def _read_bounded(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """The body, at most `limit` bytes of it; the rest is not read (the connection is then dropped)."""
    if resp.content_length is not None and resp.content_length <= limit:
        return await resp.read(), False
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await resp.content.read(_READ_CHUNK)
        if not chunk:
            return b"".join(chunks), False
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:limit], True


def _translate(exc: aiohttp.ClientError) -> TransportError:
    """The aiohttp exception as one of our three kinds.

    Messages never quote the request URL, which may carry a secret; aiohttp's own texts sometimes do.
    """
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return RequestTimeout("connect timeout", phase="connect")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return RequestTimeout("read timeout: the target went silent", phase="read")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectFailed(f"cannot connect to {exc.host}:{exc.port}: {_os_reason(exc.os_error)}")
    if isinstance(exc, aiohttp.InvalidURL):
        return ConnectFailed("cannot connect: invalid URL")
    if isinstance(exc, aiohttp.ClientOSError):
        return ProtocolFailed(f"connection broken: {_os_reason(exc)}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return ProtocolFailed(f"bad response: {exc.message}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return ProtocolFailed(f"bad response body: {exc}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return ProtocolFailed("server disconnected without a response")
    return ProtocolFailed(type(exc).__name__)


def _os_reason(error: OSError) -> str:
    return error.strerror or type(error).__name__
