"""The httpx transport: the Python ecosystem's standard client, chosen with `execution.client: httpx`.

It is slower than reqwest here (docs/transport.md) but has what some targets need: httpx's own write
timeout (the `write` phase), and the same proxy and client-certificate handling as our users' own code.
TLS trusts the system's store as `ssl.create_default_context()` loads it (SSL_CERT_FILE and SSL_CERT_DIR
name a private authority), like the reqwest transport, rather than httpx's bundled certifi.

Timeout phases map one to one: httpx's connect, write, read and pool timeouts. httpx's read timeout is
the longest silence, so an answer that trickles a byte now and then would hold a row (and a SIGTERM'd run)
for ever: the whole exchange also has reqwest's deadline, connect + write + read (phase "read").
"""

from __future__ import annotations

import asyncio
import os
import ssl
import zlib
from collections.abc import Iterable, Iterator
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

from bulkrelay.errors import UsageError
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.transport.base import (
    ENCRYPTED_KEY,
    USER_AGENT,
    ConnectFailed,
    ProtocolFailed,
    RequestTimeout,
    Response,
    TransportError,
    TransportSettings,
    host_port,
    invalid_request,
    read_pem,
    tls_unavailable,
)

# Headers httpx adds by default that the job did not ask for: the wire carries what the request says.
_UNASKED_DEFAULTS = ("Accept", "Accept-Encoding")


class HttpxTransport:
    """One httpx client with a keep-alive pool of `concurrency` connections, no cookies, no redirects."""

    def __init__(self, settings: TransportSettings) -> None:
        self._settings = settings
        self._client = _build_client(settings)
        self._deadline = settings.connect_seconds + settings.write_seconds + settings.read_seconds

    async def send(self, request: PreparedRequest) -> Response:
        try:
            outgoing = self._client.build_request(
                request.method, request.url, headers=_utf8_headers(request.headers), content=request.body
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, httpx.LocalProtocolError, ValueError):
            raise invalid_request() from None
        if not _sendable(outgoing.url):
            raise invalid_request()
        try:
            async with asyncio.timeout(self._deadline):
                streamed = await self._client.send(outgoing, stream=True)
                try:
                    body, truncated = await self._read_bounded(streamed)
                finally:
                    await streamed.aclose()
        except httpx.TransportError as exc:
            raise _translate(exc, request.url) from None
        except TimeoutError:  # the deadline on the whole exchange; httpx's own timeouts are TransportErrors
            raise RequestTimeout(
                f"read timeout: the whole exchange took longer than {self._deadline:g} s", phase="read"
            ) from None
        return Response(streamed.status_code, streamed.headers, body, truncated)

    async def _read_bounded(self, response: httpx.Response) -> tuple[bytes, bool]:
        """The body, at most max_body_bytes of it, decoded only when the job sent Accept-Encoding."""
        limit = self._settings.max_body_bytes
        inflater = _Inflater.for_answer(response.headers) if self._settings.decompress else None
        parts: list[bytes] = []
        size = 0
        async for raw in response.aiter_raw():
            pieces = (raw,) if inflater is None else inflater.pieces(raw, limit + 1 - size)
            for piece in pieces:
                parts.append(piece)
                size += len(piece)
                if size > limit:
                    return b"".join(parts)[:limit], True
        return b"".join(parts), False

    async def aclose(self) -> None:
        await self._client.aclose()


# The codings decoded here, with zlib's window bits for each (gzip's header, deflate's zlib header).
_ZLIB_CODINGS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class _Inflater:
    """gzip or deflate, decoded at most `most` bytes at a time.

    httpx's own decoders inflate each piece read (up to 64 KiB) whole, and gzip inflates a thousandfold:
    some 64 MiB for an answer cut at 1 MiB. Here nothing is inflated beyond what the cut keeps.
    Like httpx, "deflate" is tried with zlib's header, then as a raw stream. Other codings (br, zstd,
    several codings stacked) are not decoded: the body is kept as it came (docs/transport.md).
    """

    def __init__(self, coding: str) -> None:
        self._raw_deflate_allowed = coding == "deflate"
        self._zlib = zlib.decompressobj(_ZLIB_CODINGS[coding])

    @classmethod
    def for_answer(cls, headers: httpx.Headers) -> _Inflater | None:
        codings = [value.strip().lower() for value in headers.get_list("content-encoding", split_commas=True)]
        codings = [coding for coding in codings if coding not in ("", "identity")]
        if len(codings) == 1 and codings[0] in _ZLIB_CODINGS:
            return cls(codings[0])
        return None

    def pieces(self, data: bytes, most: int) -> Iterator[bytes]:
        while data:
            try:
                piece = self._zlib.decompress(data, most)
            except zlib.error as exc:
                if self._raw_deflate_allowed:  # the first bytes were no zlib header: a raw deflate stream
                    self._raw_deflate_allowed = False
                    self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise ProtocolFailed(f"bad response: {exc}") from None
            self._raw_deflate_allowed = False
            data = self._zlib.unconsumed_tail
            yield piece


def _sendable(url: httpx.URL) -> bool:
    """What reqwest refuses and httpx would try: no host, a host with characters it had to escape
    (a space, say: httpx would look that name up), a port out of range."""
    host = url.host
    return bool(host) and "%" not in host and " " not in host and (url.port is None or 0 < url.port < 65536)


def _build_client(settings: TransportSettings) -> httpx.AsyncClient:
    client = httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency
        ),
        timeout=httpx.Timeout(
            connect=settings.connect_seconds,
            read=settings.read_seconds,
            write=settings.write_seconds,
            pool=settings.pool_seconds,
        ),
        http1=not settings.http2,
        http2=settings.http2,
        follow_redirects=False,  # a 302 must not turn a POST into a GET behind the user's back
        cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),  # rows never influence each other
        verify=_tls_context(settings),
        trust_env=settings.proxy == "environment",
        proxy=None if settings.proxy in ("none", "environment") else settings.proxy,
        headers={"User-Agent": USER_AGENT},
    )
    for name in _UNASKED_DEFAULTS:
        del client.headers[name]
    return client


def _tls_context(settings: TransportSettings) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if _trusts_nothing(context):
        raise tls_unavailable("no trusted certificate authority was found")
    certificate = settings.client_certificate
    if certificate is not None:
        # read_pem refuses what is no small regular file, which OpenSSL would read without end (a device)
        # or wait on forever (a named pipe); OpenSSL then loads the files by their paths
        for path in (certificate.cert_file, certificate.key_file):
            if path is not None:
                read_pem(path)
        try:
            context.load_cert_chain(certificate.cert_file, certificate.key_file, password=_no_pass_phrase)
        except (OSError, ssl.SSLError, _KeyEncrypted) as exc:
            reason = ENCRYPTED_KEY if isinstance(exc, _KeyEncrypted) else str(exc)
            raise UsageError(
                f"cannot load the client certificate {certificate.cert_file}: {reason}",
                context={"path": str(certificate.cert_file)},
            ) from None
    return context


class _KeyEncrypted(Exception):
    pass


def _no_pass_phrase() -> bytes:
    """OpenSSL's default, without this, is to ask for the pass phrase on the terminal and wait."""
    raise _KeyEncrypted


def _trusts_nothing(context: ssl.SSLContext) -> bool:
    """True when the store is empty: no authority loaded from a file and no directory to look in
    (a directory's certificates load lazily, so the count says nothing about it)."""
    if context.cert_store_stats()["x509_ca"]:
        return False
    capath = ssl.get_default_verify_paths().capath
    return not (capath and os.path.isdir(capath))


def _translate(exc: httpx.TransportError, url: str) -> TransportError:
    """The httpx exception as one of our kinds; messages never quote the URL."""
    if isinstance(exc, httpx.PoolTimeout):
        return RequestTimeout("pool timeout: no free connection slot in time", phase="pool")
    if isinstance(exc, httpx.ConnectTimeout):
        return RequestTimeout("connect timeout", phase="connect")
    if isinstance(exc, httpx.WriteTimeout):
        return RequestTimeout("write timeout: the target did not take the request in time", phase="write")
    if isinstance(exc, httpx.TimeoutException):
        return RequestTimeout("read timeout: no answer from the target in time", phase="read")
    if isinstance(exc, httpx.ConnectError | httpx.ProxyError):
        return ConnectFailed(f"cannot connect to {host_port(url)}: {_cause(exc)}")
    if isinstance(exc, httpx.UnsupportedProtocol) or _refused_by_h11(exc):
        return invalid_request()
    if isinstance(exc, httpx.RemoteProtocolError) and "disconnected without sending a response" not in str(
        exc
    ):
        return ProtocolFailed(f"bad response: {_cause(exc)}")
    return ProtocolFailed(f"connection broken: {_cause(exc)}")


def _refused_by_h11(exc: httpx.TransportError) -> bool:
    """A LocalProtocolError raised by h11, which refuses to write a request it cannot send (a bad header)
    before any byte of it: nothing went out. Over HTTP/2 httpcore raises the same class for any protocol
    error of h2's, a malformed frame from the target included, after the request may have gone out."""
    if not isinstance(exc, httpx.LocalProtocolError):
        return False
    return type(_innermost(exc)).__module__.partition(".")[0] == "h11"


def _utf8_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """Values as UTF-8 bytes, as reqwest sends them and preflight accepts them: httpx encodes a str
    value as ASCII and would refuse `Zoë` row by row, as if the target could not be reached."""
    return [(name.encode(), value.encode()) for name, value in headers]


def _innermost(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return exc


def _cause(exc: BaseException) -> str:
    """The innermost cause ("[Errno 111] Connection refused"), which names no URL."""
    exc = _innermost(exc)
    text = str(exc)
    return text if text and "://" not in text else type(exc).__name__
