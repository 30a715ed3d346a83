"""AiohttpTransport against the embedded target over real loopback sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from bulkrelay import __version__
from bulkrelay.errors import UsageError
from bulkrelay.records import PreparedRequest
from bulkrelay.target import RunningTarget, start_target
from bulkrelay.transport import (
    AiohttpTransport,
    ConnectFailed,
    ProtocolFailed,
    RequestTimeout,
    Transport,
    TransportSettings,
    open_transport,
)

pytestmark = pytest.mark.anyio


def _settings(**overrides: Any) -> TransportSettings:
    values: dict[str, Any] = {
        "concurrency": 4,
        "connect_seconds": 2.0,
        "read_seconds": 2.0,
        "write_seconds": 2.0,
        "pool_seconds": 2.0,
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


async def test_unread_upload_is_a_write_timeout() -> None:
    held: list[asyncio.StreamWriter] = []

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # keeps the connection without reading: the client's writes block

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = open_transport(_settings(connect_seconds=0.1, write_seconds=0.2, read_seconds=0.2))
    try:
        with pytest.raises(RequestTimeout) as caught:
            await transport.send(PreparedRequest("POST", f"http://127.0.0.1:{port}/", (), b"z" * (64 << 20)))
        assert caught.value.phase == "write"
    finally:
        await transport.aclose()
        for writer in held:
            writer.close()
            await writer.wait_closed()
        server.close()
        await server.wait_closed()


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
        responses = await asyncio.gather(*(transport.send(_post(f"{url}/r/{i}")) for i in range(200)))
        assert all(r.status == 200 for r in responses)
        assert target.state.stats()["requests"] == 200


async def test_http2_is_refused_with_an_explanation() -> None:
    with pytest.raises(UsageError, match="HTTP/2"):
        open_transport(_settings(http2=True))


async def test_concurrency_must_be_positive() -> None:
    with pytest.raises(UsageError):
        AiohttpTransport(_settings(concurrency=0))
