"""The transport contract, kept by both clients (reqwest and httpx) over real loopback sockets.

Every test here runs once per client; where the two differ by design (which phase a stuck upload
times out in), the test says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import socket
import ssl
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config as HypercornConfig

from bulkrelay._version import __version__
from bulkrelay.demo.target import RunningTarget, start_target
from bulkrelay.errors import TlsUnavailable, UsageError
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.retry import quota_exhausted_for, retry_after_of
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import (
    ClientCertificate,
    ClientName,
    ConnectFailed,
    ProtocolFailed,
    RequestTimeout,
    Response,
    Transport,
    TransportError,
    TransportSettings,
)
from tests.listeners import never_accepting
from tests.waiting import HANG_S

pytestmark = pytest.mark.anyio

_BACKEND: dict[str, ClientName] = {"client": "reqwest"}


@pytest.fixture(params=["reqwest", "httpx"], autouse=True)
def client(request: pytest.FixtureRequest) -> Iterator[ClientName]:
    """The client every test of this module builds through `_settings()`."""
    _BACKEND["client"] = request.param
    yield request.param
    _BACKEND["client"] = "reqwest"


def _settings(**overrides: Any) -> TransportSettings:
    values: dict[str, Any] = {
        "concurrency": 4,
        "connect_seconds": 2.0,
        "read_seconds": 2.0,
        "write_seconds": 2.0,
        "pool_seconds": 2.0,
        "client": _BACKEND["client"],
    }
    values.update(overrides)
    return TransportSettings(**values)


@asynccontextmanager
async def _setup(
    plan: dict[str, Any] | None = None, **overrides: Any
) -> AsyncIterator[tuple[RunningTarget, Transport]]:
    target = await start_target(plan)
    transport = open_transport(_settings(**overrides))
    try:
        yield target, transport
    finally:
        await transport.aclose()
        await target.stop()


def _post(url: str, body: bytes = b'{"a":1}', *headers: tuple[str, str]) -> PreparedRequest:
    return PreparedRequest("POST", url, (("Content-Type", "application/json"), *headers), body)


async def test_success_returns_status_headers_and_body() -> None:
    async with _setup() as (target, transport):
        response = await transport.send(
            _post(target.url + "/v1/x?q=1", b'{"a":1}', ("Idempotency-Key", "k1"))
        )
        assert response.status == 200
        assert response.headers["content-type"] == "application/json"  # case-insensitive
        assert response.body == b'{"id":"1"}'
        assert response.truncated is False
        [record] = target.state.requests()
        assert (record["method"], record["path"], record["query"]) == ("POST", "/v1/x", "q=1")
        assert record["body"] == '{"a":1}'
        headers = {k.lower(): v for k, v in record["headers"].items()}
        assert headers["idempotency-key"] == "k1"
        assert headers["content-type"] == "application/json"
        assert headers["user-agent"] == f"bulkrelay/{__version__}"
        assert "accept-encoding" not in headers  # no compression unless the job asks for it
        assert "cookie" not in headers


async def test_no_implicit_content_type_and_bodyless_get() -> None:
    async with _setup() as (target, transport):
        await transport.send(PreparedRequest("PUT", target.url + "/raw", (), b"raw bytes"))
        await transport.send(PreparedRequest("GET", target.url + "/get", (), None))
        put, get = target.state.requests()
        assert "content-type" not in {k.lower() for k in put["headers"]}
        assert (put["method"], put["body"]) == ("PUT", "raw bytes")
        assert (get["method"], get["body"]) == ("GET", "")


async def test_the_jobs_own_user_agent_wins() -> None:
    async with _setup() as (target, transport):
        await transport.send(_post(target.url + "/ua", b"{}", ("User-Agent", "migration/7")))
        [record] = target.state.requests()
        user_agents = [v for k, v in record["headers"].items() if k.lower() == "user-agent"]
        assert user_agents == ["migration/7"]


async def test_redirects_are_returned_not_followed() -> None:
    plan = {"rules": [{"match": {"path_contains": "/old"}, "status": 302, "headers": {"Location": "/new"}}]}
    async with _setup(plan) as (target, transport):
        response = await transport.send(_post(target.url + "/old"))
        assert response.status == 302
        assert response.headers["location"] == "/new"
        assert target.state.stats()["requests"] == 1


async def test_slow_response_is_a_read_timeout() -> None:
    async with _setup({"rules": [{"delay_ms": 1000}]}, read_seconds=0.2) as (target, transport):
        with pytest.raises(RequestTimeout) as caught:
            await transport.send(_post(target.url + "/slow"))
        assert caught.value.phase == "read"
        assert caught.value.classification == "timeout_error"
        assert target.url not in str(caught.value)


@asynccontextmanager
async def _raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[str]:
    """The URL of a loopback server answering each connection with `handle` (raw bytes, no HTTP library);
    with `tls`, an https URL naming localhost, the name its certificate is for.

    TLS is started inside the handler, not by the server, so that a connection whose handshake fails is
    still ours to close: one the server dropped unclosed was a ResourceWarning in some later test."""
    writers: list[asyncio.StreamWriter] = []

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):  # ssl.SSLError is an OSError
            if tls is not None:
                await writer.start_tls(tls)
            await handle(reader, writer)

    server = await asyncio.start_server(keep, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://localhost:{port}/" if tls else f"http://127.0.0.1:{port}/"
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()  # at once, TLS or not: no close handshake with a client gone
        await server.wait_closed()


async def _never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keeps the connection without reading: the client's writes block."""


async def test_unread_upload_times_out(client: ClientName) -> None:
    # reqwest's read timer starts when the request is sent, so a stuck upload ends at read_seconds,
    # before the whole-exchange deadline (connect + write + read); httpx has a write timer, which must
    # end it well before that deadline, however slowly a busy machine fills the socket's buffers.
    read_seconds = 0.2 if client == "reqwest" else 5.0
    transport = open_transport(_settings(connect_seconds=0.2, write_seconds=0.2, read_seconds=read_seconds))
    async with _raw_server(_never_read) as url:
        with pytest.raises(RequestTimeout) as caught:
            await transport.send(PreparedRequest("POST", url, (), b"z" * (64 << 20)))
        assert caught.value.phase == ("read" if client == "reqwest" else "write")
    await transport.aclose()


async def _trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers the headers, then one body byte every 50 ms, for ever: never silent for a read timeout."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
    while True:
        writer.write(b"x")
        await writer.drain()
        await asyncio.sleep(0.05)


async def test_a_trickling_answer_ends_at_the_whole_exchange_deadline() -> None:
    """Each silence is shorter than read_seconds; the exchange as a whole is bounded by connect + write +
    read on both clients (issue 22.11: httpx had no such deadline, so the row and the run never ended)."""
    transport = open_transport(_settings(connect_seconds=0.3, write_seconds=0.3, read_seconds=0.4))
    async with _raw_server(_trickle) as url:
        with pytest.raises(RequestTimeout) as caught:
            await asyncio.wait_for(transport.send(PreparedRequest("GET", url, (), b"")), HANG_S)
        assert caught.value.phase == "read"
        assert caught.value.classification == "timeout_error"
    await transport.aclose()


async def test_connect_that_never_completes_is_a_connect_timeout() -> None:
    with never_accepting() as url:
        transport = open_transport(_settings(connect_seconds=0.3))
        try:
            with pytest.raises(RequestTimeout) as caught:
                await transport.send(_post(url))
            assert caught.value.phase == "connect" and str(caught.value) == "connect timeout"
        finally:
            await transport.aclose()


async def test_a_connect_hang_outlasting_the_read_timeout_is_not_called_a_plain_read_timeout(
    client: ClientName,
) -> None:
    """reqwest's read timer starts with the request, so with read_seconds no longer than connect_seconds
    it ends a hanging connect, and its error is the same as for a connected target that never answers:
    the message must not claim the target was reached (audit of issue 25). httpx times connects alone."""
    with never_accepting() as url:
        transport = open_transport(_settings(connect_seconds=1.0, read_seconds=0.3))
        try:
            with pytest.raises(RequestTimeout) as caught:
                await asyncio.wait_for(transport.send(_post(url)), HANG_S)
        finally:
            await transport.aclose()
    if client == "httpx":
        assert caught.value.phase == "connect" and str(caught.value) == "connect timeout"
    else:
        assert caught.value.phase == "read"  # the request may have gone out, as far as the error tells
        message = str(caught.value)
        assert message.startswith("read timeout: no answer from the target in time, or no connection")
        assert "also runs while connecting" in message


async def test_a_slow_answer_is_a_plain_read_timeout_when_read_outlasts_connect() -> None:
    plan = {"rules": [{"delay_ms": 2000}]}
    async with _setup(plan, connect_seconds=0.2, read_seconds=0.3) as (target, transport):
        with pytest.raises(RequestTimeout) as caught:
            await transport.send(_post(target.url + "/slow"))
    assert caught.value.phase == "read"
    assert str(caught.value) == "read timeout: no answer from the target in time"


async def _close_after_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


async def _answer_garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HELLO WORLD\r\n\r\n")
    await writer.drain()


async def _answer_switching_protocols(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """101 to a request that asked for no upgrade: HTTP forbids it, and no answer to the request follows."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    await writer.drain()


async def _answer_short_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
    await writer.drain()
    writer.close()


@pytest.mark.parametrize(
    ("handle", "words"),
    [
        (_close_after_request, "connection broken"),
        (_answer_garbage, "bad response"),
        (_answer_short_body, "bad response"),
        (_answer_switching_protocols, "bad response"),
    ],
)
async def test_a_request_that_went_out_and_got_no_valid_answer_is_protocol_failed(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], words: str
) -> None:
    transport = open_transport(_settings())
    async with _raw_server(handle) as url:
        with pytest.raises(ProtocolFailed) as caught:
            await transport.send(_post(url + "secret-path"))
        assert caught.value.classification == "protocol_error"
        assert words in caught.value.message
        assert "secret-path" not in caught.value.message
    await transport.aclose()


async def _answer_ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):  # a refused handshake ends it early
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()


def _tls_context(authority: trustme.CA) -> ssl.SSLContext:
    """A server context with a certificate for localhost signed by `authority`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    return context


async def test_https_trusts_the_authorities_named_by_ssl_cert_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SSL_CERT_FILE replaces the system's store, so the test does not depend on the machine's.
    authority, stranger = trustme.CA(), trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ours.pem"))
    stranger.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    async with _raw_server(_answer_ok, _tls_context(authority)) as url:
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "other.pem"))
        untrusting = open_transport(_settings())
        with pytest.raises(ConnectFailed, match="certificate"):
            await untrusting.send(PreparedRequest("GET", url, (), None))
        await untrusting.aclose()

        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ours.pem"))
        trusting = open_transport(_settings())
        response = await trusting.send(PreparedRequest("GET", url, (), None))
        await trusting.aclose()
        assert (response.status, response.body) == (200, b"ok")


async def test_no_trusted_authority_at_all_is_tls_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "missing"))
    with pytest.raises(TlsUnavailable) as caught:
        open_transport(_settings())
    assert caught.value.to_dict()["code"] == "TLS_UNAVAILABLE"
    assert "SSL_CERT_FILE" in (caught.value.suggestion or "")


async def test_an_invalid_url_is_connect_failed() -> None:
    transport = open_transport(_settings())
    with pytest.raises(ConnectFailed, match="invalid URL"):
        await transport.send(_post("http://exa mple.com:99999/"))
    await transport.aclose()


@pytest.mark.parametrize("header", [("Bad Name", "v"), ("X-Ok", "bad\nvalue")])
async def test_an_invalid_header_is_connect_failed_and_the_next_request_goes_out(
    header: tuple[str, str],
) -> None:
    async with _setup() as (target, transport):
        with pytest.raises(ConnectFailed, match="invalid URL or header"):
            await transport.send(_post(target.url + "/bad", b"{}", header))
        assert (await transport.send(_post(target.url + "/good", b"{}", ("X-Ok", "fine")))).status == 200
        assert [r["path"] for r in target.state.requests()] == ["/good"]


async def test_connection_refused_is_connect_failed() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago and has no listener
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    transport = open_transport(_settings())
    try:
        with pytest.raises(ConnectFailed) as caught:
            await transport.send(_post(f"http://127.0.0.1:{port}/x"))
        assert caught.value.classification == "connect_error"
        assert str(port) in caught.value.message
    finally:
        await transport.aclose()


async def test_connection_reset_is_protocol_failed() -> None:
    async with _setup({"rules": [{"times": 1, "reset": True}]}) as (target, transport):
        with pytest.raises(ProtocolFailed) as caught:
            await transport.send(_post(target.url + "/reset"))
        assert caught.value.classification == "protocol_error"
        assert (await transport.send(_post(target.url + "/after"))).status == 200


async def test_body_is_truncated_at_the_limit() -> None:
    plan = {"rules": [{"match": {"path_contains": "/big"}, "body": "x" * 5000}]}
    async with _setup(plan, max_body_bytes=1000) as (target, transport):
        big = await transport.send(_post(target.url + "/big"))
        assert (big.status, len(big.body), big.truncated) == (200, 1000, True)
        assert big.body == b"x" * 1000
        small = await transport.send(_post(target.url + "/small"))
        assert (small.body, small.truncated) == (b'{"id":"1"}', False)


async def test_body_exactly_at_the_limit_is_whole() -> None:
    plan = {"rules": [{"body": "y" * 1000}]}
    async with _setup(plan, max_body_bytes=1000) as (target, transport):
        response = await transport.send(_post(target.url + "/edge"))
        assert (len(response.body), response.truncated) == (1000, False)


async def _answer_in_pieces(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive answers whose bodies come in several writes: chunked (no length) when the path says
    so, else with a Content-Length."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
        size = int(head.split(b" ")[1].rsplit(b"/", 1)[1])
        pieces = [b"p" * (size // 3), b"q" * (size // 3), b"r" * (size - 2 * (size // 3))]
        if b"/chunked/" in head.split(b"\r\n")[0]:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in pieces:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
        await writer.drain()


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_bodies_in_several_pieces_are_whole_up_to_the_limit_and_cut_beyond(framing: str) -> None:
    """A body that declares a length within the limit is read at once; one without a length, or with
    one beyond the limit, piece by piece and cut at the limit."""
    transport = open_transport(_settings(max_body_bytes=1000))
    async with _raw_server(_answer_in_pieces) as url:
        for size, truncated in ((999, False), (1000, False), (1001, True), (200_000, True)):
            response = await transport.send(_post(f"{url}{framing}/{size}"))
            expected = (b"p" * (size // 3) + b"q" * (size // 3) + b"r" * size)[: min(size, 1000)]
            assert (response.body, response.truncated) == (expected, truncated), (size, framing)
    await transport.aclose()


async def test_waiting_for_a_slot_is_a_pool_timeout() -> None:
    plan = {"rules": [{"delay_ms": 600}]}
    async with _setup(plan, concurrency=1, pool_seconds=0.1) as (target, transport):
        slow = asyncio.create_task(transport.send(_post(target.url + "/first")))
        await asyncio.sleep(0.05)
        with pytest.raises(RequestTimeout) as caught:
            await transport.send(_post(target.url + "/second"))
        assert caught.value.phase == "pool"
        assert (await slow).status == 200


async def test_many_concurrent_requests_all_arrive() -> None:
    async with _setup(concurrency=8) as (target, transport):
        url = target.url
        window = asyncio.Semaphore(8)  # as the engine's window does: a request's deadline counts no queueing

        async def send(i: int) -> Response:
            async with window:
                return await transport.send(_post(f"{url}/r/{i}"))

        responses = await asyncio.gather(*(send(i) for i in range(200)))
        assert all(r.status == 200 for r in responses)
        assert target.state.stats()["requests"] == 200


async def _echo_http_version(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app answering each request with the HTTP version it arrived in."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["http_version"].encode()})


@asynccontextmanager
async def _hypercorn(certificate: Path | None = None) -> AsyncIterator[str]:
    """A loopback hypercorn server, which speaks HTTP/1.1 and HTTP/2 on one port: h2c by prior knowledge
    in cleartext, ALPN over TLS when `certificate` (key and chain, PEM) is given."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "WARNING"
    if certificate is not None:
        config.certfile = config.keyfile = str(certificate)
    stop = asyncio.Event()
    server = asyncio.create_task(hypercorn_serve(_echo_http_version, config, shutdown_trigger=stop.wait))
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
            await asyncio.sleep(0.05)
        yield f"{'https' if certificate else 'http'}://localhost:{port}/"
    finally:
        stop.set()
        await server


@pytest.mark.parametrize("tls", [False, True])
async def test_http2_option_speaks_http2_and_the_default_http1(
    tls: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certificate = None
    if tls:
        authority = trustme.CA()
        authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        certificate = tmp_path / "server.pem"
        authority.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(certificate))
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    async with _hypercorn(certificate) as url:
        for http2, version in ((True, b"2"), (False, b"1.1")):
            transport = open_transport(_settings(http2=http2))
            try:
                responses = await asyncio.gather(*(transport.send(_post(url)) for _ in range(10)))
                assert {(r.status, r.body) for r in responses} == {(200, version)}
            finally:
                await transport.aclose()


async def test_http2_against_an_http1_only_target_is_a_protocol_error() -> None:
    async with _setup(http2=True) as (target, transport):
        with pytest.raises(ProtocolFailed):
            await transport.send(_post(target.url + "/x"))
        assert target.state.stats()["requests"] == 0


async def _answer_a_broken_http2_frame(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Takes what the client sends (its preface, then the request), then answers with a SETTINGS frame and
    a DATA frame on stream 0, which HTTP/2 forbids (a connection error)."""
    await reader.read(65536)
    writer.write(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x02\x00\x00\x00\x00\x00\x00ab")
    await writer.drain()


async def test_a_malformed_http2_answer_is_a_protocol_error_not_an_unsent_request() -> None:
    """The request may have gone out: httpx (httpcore) raises the LocalProtocolError it uses for a
    request h11 refused to write, which must not be read as "not sent" over HTTP/2."""
    transport = open_transport(_settings(http2=True))
    async with _raw_server(_answer_a_broken_http2_frame) as url:
        with pytest.raises(ProtocolFailed) as caught:
            await transport.send(_post(url + "secret-path"))
    await transport.aclose()
    assert caught.value.classification == "protocol_error"
    assert "secret-path" not in caught.value.message


async def _answer_gzip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    body = gzip.compress(b'{"id":"zipped"}')
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()


@pytest.mark.parametrize("decompress", [True, False])
async def test_compressed_answers_are_decoded_only_when_asked(decompress: bool) -> None:
    transport = open_transport(_settings(decompress=decompress))
    async with _raw_server(_answer_gzip) as url:
        response = await transport.send(_post(url, b"{}", ("Accept-Encoding", "gzip")))
    await transport.aclose()
    if decompress:
        assert response.body == b'{"id":"zipped"}'
    else:
        assert gzip.decompress(response.body) == b'{"id":"zipped"}'


async def _answer_bad_gzip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\nnot gzip!!")
    await writer.drain()


async def test_an_answer_that_does_not_decode_is_protocol_failed() -> None:
    """A body that says gzip and is not: a bad response like any other, on both clients (httpx raises
    its DecodingError, which is not one of its TransportErrors)."""
    transport = open_transport(_settings(decompress=True))
    async with _raw_server(_answer_bad_gzip) as url:
        with pytest.raises(ProtocolFailed) as caught:
            await transport.send(_post(url + "secret-path", b"{}", ("Accept-Encoding", "gzip")))
    await transport.aclose()
    assert caught.value.message.startswith("bad response: ")
    assert "secret-path" not in caught.value.message


def _gzip_bomb(size: int) -> bytes:
    """`size` zero bytes, gzipped: about a thousandth of that on the wire."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = bytes(1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(size >> 20)) + packer.flush()


async def test_a_small_answer_that_inflates_hugely_is_cut_without_inflating_it_whole() -> None:
    """256 MiB of zeros in 256 KiB of gzip: what the Python side holds stays near max_body_bytes
    (httpx once decoded each 64 KiB it read at once, some 64 MiB). reqwest decodes in Rust, in pieces."""
    bomb = _gzip_bomb(256 << 20)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n"
        writer.write(head.encode() + bomb)
        await writer.drain()

    transport = open_transport(_settings(decompress=True, max_body_bytes=64 * 1024))
    async with _raw_server(answer) as url:
        tracemalloc.start()
        try:
            response = await transport.send(_post(url, b"{}", ("Accept-Encoding", "gzip")))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    await transport.aclose()
    assert response.truncated
    assert response.body == bytes(64 * 1024)
    assert peak < 8 << 20


async def test_concurrency_must_be_positive() -> None:
    with pytest.raises(UsageError):
        open_transport(_settings(concurrency=0))


async def test_cookies_are_never_sent_back() -> None:
    plan = {
        "rules": [{"match": {"path_contains": "/login"}, "headers": {"Set-Cookie": "session=abc; Path=/"}}]
    }
    async with _setup(plan) as (target, transport):
        await transport.send(_post(target.url + "/login"))
        await transport.send(_post(target.url + "/next"))
        _, second = target.state.requests()
        assert "cookie" not in {k.lower() for k in second["headers"]}


def _recording_proxy(
    seen: list[bytes],
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A loopback stand-in for a forward proxy: it records each request line and answers itself."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head.split(b"\r\n", 1)[0])
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nproxied")
                await writer.drain()

    return handle


async def test_an_explicit_proxy_carries_every_request() -> None:
    seen: list[bytes] = []
    async with _raw_server(_recording_proxy(seen)) as proxy:
        transport = open_transport(_settings(proxy=proxy.rstrip("/")))
        try:
            # .invalid never resolves: the request can only have gone through the proxy.
            response = await transport.send(_post("http://target.invalid/v1/x?q=1"))
        finally:
            await transport.aclose()
    assert (response.status, response.body) == (200, b"proxied")
    assert seen == [b"POST http://target.invalid/v1/x?q=1 HTTP/1.1"]


def _recording_socks5_proxy(
    seen: list[tuple[int, bytes, int]],
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A loopback stand-in for a SOCKS5 proxy (no authentication): it records each CONNECT's address
    (type, address bytes, port), then answers the HTTP request that comes through the tunnel itself."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            _, methods = await reader.readexactly(2)
            await reader.readexactly(methods)
            writer.write(b"\x05\x00")  # no authentication
            _, _, _, kind = await reader.readexactly(4)  # version, CONNECT, reserved, address type
            size = {1: 4, 4: 16}.get(kind) or (await reader.readexactly(1))[0]
            address = await reader.readexactly(size)
            seen.append((kind, address, int.from_bytes(await reader.readexactly(2), "big")))
            writer.write(b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00")  # granted
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nproxied")
            await writer.drain()

    return handle


async def test_a_socks5_proxy_carries_every_request() -> None:
    """Both clients, as docs/configuration.md promises (httpx needs its `socks` extra for it)."""
    seen: list[tuple[int, bytes, int]] = []
    async with _raw_server(_recording_socks5_proxy(seen)) as proxy:
        transport = open_transport(_settings(proxy=proxy.replace("http://", "socks5://").rstrip("/")))
        try:
            # nothing listens on port 9: the answer can only have come through the proxy
            response = await transport.send(PreparedRequest("GET", "http://127.0.0.1:9/x", (), None))
        finally:
            await transport.aclose()
    assert (response.status, response.body) == (200, b"proxied")
    assert [(address.decode() if kind == 3 else address, port) for kind, address, port in seen] in (
        [(b"\x7f\x00\x00\x01", 9)],
        [("127.0.0.1", 9)],
    )


async def test_proxies_from_the_environment_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bytes] = []
    async with _raw_server(_recording_proxy(seen)) as proxy, _setup() as (target, direct):
        monkeypatch.setenv("HTTP_PROXY", proxy.rstrip("/"))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        await direct.send(_post(target.url + "/direct"))  # "none", the default: the variables are ignored
        transport = open_transport(_settings(proxy="environment"))
        try:
            response = await transport.send(_post("http://target.invalid/env"))
            await transport.send(_post(target.url + "/bypass"))  # NO_PROXY names it: sent directly
        finally:
            await transport.aclose()
    assert response.body == b"proxied"
    assert seen == [b"POST http://target.invalid/env HTTP/1.1"]
    assert [r["path"] for r in target.state.requests()] == ["/direct", "/bypass"]


async def test_a_client_certificate_is_presented_when_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    identity = authority.issue_cert("relay-client@example.test")
    identity.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    identity.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    server = _tls_context(authority)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(cadata=authority.cert_pem.bytes().decode())
    peers: list[Any] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peercert"))
        await _answer_ok(reader, writer)

    certificate = ClientCertificate(tmp_path / "client.pem", tmp_path / "client.key")
    async with _raw_server(answer, server) as url:
        anonymous = open_transport(_settings())
        with pytest.raises(TransportError):
            await anonymous.send(PreparedRequest("GET", url, (), None))
        await anonymous.aclose()
        transport = open_transport(_settings(client_certificate=certificate))
        response = await transport.send(PreparedRequest("GET", url, (), None))
        await transport.aclose()
    assert (response.status, response.body) == (200, b"ok")
    assert any(peer and "relay-client@example.test" in str(peer) for peer in peers)


@pytest.mark.parametrize("fault", ["key of another certificate", "not PEM", "no key", "encrypted key"])
async def test_a_client_certificate_that_does_not_load_is_a_usage_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Said before any request, the same way by both clients: not "no trusted authority", no traceback."""
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))  # a store to trust, wherever this runs
    identity = authority.issue_cert("relay-client@example.test")
    identity.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    key = authority.issue_cert("other@example.test").private_key_pem
    key.write_to_path(str(tmp_path / "client.key"))
    certificate = ClientCertificate(tmp_path / "client.pem", tmp_path / "client.key")
    if fault == "not PEM":
        (tmp_path / "client.pem").write_text("not a certificate\n")
    elif fault == "no key":
        certificate = ClientCertificate(tmp_path / "client.pem")
    elif fault == "encrypted key":  # OpenSSL would ask for its pass phrase on the terminal, and wait
        plain = serialization.load_pem_private_key(identity.private_key_pem.bytes(), None)
        (tmp_path / "client.key").write_bytes(
            plain.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"pass phrase"),
            )
        )
    with pytest.raises(UsageError) as caught:
        open_transport(_settings(client_certificate=certificate))
    assert "client.pem" in str(caught.value)
    assert ("encrypted" in str(caught.value)) == (fault == "encrypted key")


@pytest.mark.parametrize("kind", ["larger than a key", "a named pipe", "a device"])
async def test_a_client_certificate_file_that_is_no_small_regular_file_is_refused_unread(
    tmp_path: Path, kind: str
) -> None:
    """`client_cert: /dev/zero` was read until memory ran out, and a named pipe waited forever for a
    writer: only a regular file of at most 1 MiB is read."""
    path = tmp_path / "client.pem"
    if kind == "larger than a key":
        path.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + b"A" * (2 << 20))
    elif kind == "a named pipe":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with pytest.raises(UsageError) as caught:
        open_transport(_settings(client_certificate=ClientCertificate(path)))
    assert "client.pem" in str(caught.value)
    assert ("larger than 1 MiB" if kind == "larger than a key" else "not a regular file") in str(caught.value)


async def _answer_non_ascii_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Values in UTF-8, and one in Latin-1."""
    await reader.readuntil(b"\r\n\r\n")
    head = "HTTP/1.1 429 Too Many\r\nRetry-After: 5é\r\nRateLimit: remaining=0, reset=ü\r\n".encode()
    writer.write(head + b"X-Note: caf\xe9\r\nContent-Length: 2\r\n\r\nok")
    await writer.drain()


async def test_header_values_that_are_not_ascii_read_without_raising() -> None:
    """HTTP allows any byte above 0x7f in a value, and the engine reads Retry-After and RateLimit on
    every response. pyreqwest refuses such a value as text (even valid UTF-8): the engine's readers
    then find no number in it, as in any other value that holds none."""
    transport = open_transport(_settings())
    async with _raw_server(_answer_non_ascii_headers) as url:
        response = await transport.send(_post(url))
    await transport.aclose()
    assert (response.status, response.body) == (429, b"ok")
    assert retry_after_of(response.headers) is None
    assert quota_exhausted_for(response.headers) is None
