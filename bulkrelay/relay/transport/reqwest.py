"""The pyreqwest transport (Python bindings of Rust's reqwest and hyper), the default client.

Timeout phases map onto reqwest like this:

    pool     waiting for one of `concurrency` request slots (pool_timeout)                  -> phase "pool"
    connect  DNS, TCP and TLS of a new connection (connect_timeout)                         -> phase "connect"
    read     reqwest's read_timeout: from the start of the request (connecting included) to its response
             headers, then the longest silence between pieces of the body                   -> phase "read"
    write    reqwest has no write timer: reqwest's read timer already runs while the body is sent, and
             the whole exchange has a deadline, timeout = connect + write + read            -> phase "read"

reqwest's errors say less than we need (a reset after the request went out and a refused connection are
both a "ConnectError"), so `_translate` also reads the error's cause chain: only a failure inside hyper's
connect step ("client error (Connect)") means the request was never sent. pyreqwest's own classes do
not help: it raises ConnectTimeoutError for any timeout before the response headers, a target that took
the connection and never answered included.

reqwest's read timer starts with the request, before its connect timer. When `read_seconds` is not longer
than `connect_seconds`, a connect that hangs therefore ends by the read timer, with nothing in the error
to tell it from a connected target that never answered: the message then says so, and the phase stays
"read" (the request may have been sent, as far as anyone can tell).
"""

from __future__ import annotations

from datetime import timedelta

from pyreqwest import exceptions as rq
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.http import Url
from pyreqwest.proxy import ProxyBuilder
from pyreqwest.response import Response as StreamedResponse

from bulkrelay.errors import UsageError
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.transport.base import (
    ENCRYPTED_KEY,
    USER_AGENT,
    ClientCertificate,
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

_READ_CHUNK = 64 * 1024
_new_tuple = tuple.__new__


class ReqwestTransport:
    """One pyreqwest client with a keep-alive pool of `concurrency` connections, no cookies, no redirects."""

    def __init__(self, settings: TransportSettings) -> None:
        self._settings = settings
        self._client = _build_client(settings)
        # A decoded body may be far larger than the Content-Length of its compressed bytes.
        self._whole_limit = 0 if settings.decompress else settings.max_body_bytes
        self._last_url: tuple[str, Url] | None = None
        self._read_timeout = _read_timeout_text(settings)

    async def send(self, request: PreparedRequest) -> Response:
        try:
            builder = self._client.request(request.method, self._parsed(request.url))
            for name, value in request.headers:  # one by one: cheaper than .headers() building a map
                builder = builder.header(name, value)
            if request.body is not None:
                builder = builder.body_bytes(request.body)
            streamed = builder.build_streamed()
        except ValueError:  # pyreqwest's URL and header parsing; preflight has normally caught these
            raise invalid_request() from None
        try:
            async with streamed as resp:
                if resp.status == 101:  # hyper hands the connection over; httpx (h11) refuses it
                    raise ProtocolFailed("bad response: 101 Switching Protocols, no answer to the request")
                headers = resp.headers
                length = headers.get("content-length")  # none when chunked or read until close
                if length is not None and length.isdigit() and int(length) <= self._whole_limit:
                    # one await; hyper holds the body to its length. tuple.__new__: no Python-level __new__
                    return _new_tuple(Response, (resp.status, headers, bytes(await resp.bytes()), False))
                body, truncated = await _read_bounded(resp, self._settings.max_body_bytes)
                return Response(resp.status, headers, body, truncated)
        except rq.PyreqwestError as exc:
            raise _translate(exc, request.url, self._read_timeout) from None

    def _parsed(self, text: str) -> Url:
        """The URL parsed once while rows keep naming the same one (a job without a URL template):
        parsing a URL string is most of what starting a request costs on this side."""
        last = self._last_url
        if last is not None and last[0] == text:
            return last[1]
        url = Url(text)
        self._last_url = (text, url)
        return url

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
        .user_agent(USER_AGENT)
        .follow_redirects(False)  # a 302 must not turn a POST into a GET behind the user's back
        .default_cookie_store(False)  # rows never influence each other through the transport
        .tcp_nodelay(True)
    )
    builder = _with_proxy(builder, settings.proxy)
    certificate = settings.client_certificate
    if certificate is not None:
        pem = read_pem(certificate.cert_file)
        if certificate.key_file is not None:
            pem = read_pem(certificate.key_file) + b"\n" + pem
        try:
            builder = builder.identity_pem(pem)
        except ValueError:  # pyreqwest's only word for it: "builder error"
            # PKCS#8 "BEGIN ENCRYPTED PRIVATE KEY", or the older "Proc-Type: 4,ENCRYPTED"
            reason = ENCRYPTED_KEY if b"ENCRYPTED" in pem else "no PEM certificate and private key in it"
            raise _unloadable(certificate, reason) from None
    # The wire carries what the request says: no Accept-Encoding unless the job sets one, in which case
    # reqwest keeps the job's header and decodes the answer.
    decode = settings.decompress
    builder = builder.gzip(decode).brotli(decode).zstd(decode).deflate(decode)
    builder = builder.http2_prior_knowledge() if settings.http2 else builder.http1_only()
    try:
        return builder.build()
    except rq.BuilderError as exc:
        # reqwest loads the system's CA store when the client is built and refuses an empty one; it also
        # checks the client certificate then (a key that is not the certificate's).
        cause = _root_cause(exc)
        if certificate is not None and _NO_AUTHORITY not in cause:
            raise _unloadable(certificate, cause) from None
        raise tls_unavailable(cause) from None


# rustls-native-certs' text for an empty store: "No CA certificates were loaded from the system".
_NO_AUTHORITY = "No CA certificates"


def _unloadable(certificate: ClientCertificate, reason: str) -> UsageError:
    """The client certificate could not be used: said as the httpx transport says it."""
    return UsageError(
        f"cannot load the client certificate {certificate.cert_file}: {reason}",
        context={"path": str(certificate.cert_file)},
    )


def _with_proxy(builder: ClientBuilder, proxy: str) -> ClientBuilder:
    """reqwest reads HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY itself unless told not to."""
    if proxy == "environment":
        return builder
    builder = builder.no_proxy()  # "none": the target is what the job names, whatever the environment says
    return builder if proxy == "none" else builder.proxy(ProxyBuilder.all(proxy))


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


_READ_TIMEOUT = "read timeout: no answer from the target in time"


def _read_timeout_text(settings: TransportSettings) -> str:
    """What a timeout that is not the connect timer's says: with `read_seconds` no longer than
    `connect_seconds`, reqwest's read timer also ends connects that hang (see the module's docstring)."""
    if settings.read_seconds > settings.connect_seconds:
        return _READ_TIMEOUT
    return (
        f"{_READ_TIMEOUT}, or no connection: reqwest's read timer ({settings.read_seconds:g} s) also runs"
        f" while connecting, and is not longer than connect_seconds ({settings.connect_seconds:g} s)"
    )


def _translate(exc: rq.PyreqwestError, url: str, read_timeout: str = _READ_TIMEOUT) -> TransportError:
    """The pyreqwest exception as one of our three kinds; `read_timeout` is what a timeout outside the
    connect step says.

    Messages never quote the request URL, which may carry a secret; reqwest's own texts do.
    """
    in_connect = _failed_in_connect(exc)
    if isinstance(exc, rq.PoolTimeoutError):
        return RequestTimeout("pool timeout: no free connection slot in time", phase="pool")
    if isinstance(exc, rq.RequestTimeoutError):
        if in_connect:
            return RequestTimeout("connect timeout", phase="connect")
        return RequestTimeout(read_timeout, phase="read")
    if in_connect:
        return ConnectFailed(f"cannot connect to {host_port(url)}: {_root_cause(exc)}")
    if isinstance(exc, rq.BuilderError):  # what reqwest refuses only when sending (a scheme, say)
        return invalid_request()
    if isinstance(exc, rq.DecodeError):
        return ProtocolFailed(f"bad response: {_root_cause(exc)}")
    if isinstance(exc, rq.NetworkError):
        return ProtocolFailed(f"connection broken: {_root_cause(exc)}")
    return ProtocolFailed(f"{type(exc).__name__}: {_root_cause(exc)}")


# hyper-util's text for a failure in its connect step (DNS, TCP, TLS): the request was not written.
_CONNECT_CAUSE = "client error (Connect)"


def _causes(exc: rq.PyreqwestError) -> list[str]:
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, dict) else None
    return [str(cause.get("message", "")) for cause in causes or ()]


def _failed_in_connect(exc: rq.PyreqwestError) -> bool:
    return _CONNECT_CAUSE in _causes(exc)


def _root_cause(exc: rq.PyreqwestError) -> str:
    """The innermost cause reqwest reports ("Connection refused (os error 111)"), which names no URL."""
    causes = _causes(exc)
    return causes[-1] if causes and "://" not in causes[-1] else type(exc).__name__
