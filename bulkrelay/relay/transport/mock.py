"""The HTTP seam's fake, as httpx ships `MockTransport`: each request goes to a handler in this process,
no socket, so a test drives the engine, the sender or the token source exactly where it wants.

    async def answer(request: PreparedRequest) -> Response:
        return Response(200, {}, b'{"id":"x"}')

    transport = MockTransport(answer)  # or a handler that raises ConnectFailed, sleeps, counts, ...

A handler answers with a `Response` or raises a `TransportError` (`ConnectFailed`, `RequestTimeout`,
`ProtocolFailed`), as the real clients do. Tests use it instead of each writing a `Transport` by hand;
BulkRelay itself never does (the real ones are `reqwest.py` and `httpx.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.transport.base import Response

Handler = Callable[[PreparedRequest], Awaitable[Response]]


class MockTransport:
    """A `Transport` whose every request is answered by `handler`; `closed` once `aclose` was called."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.closed = False

    async def send(self, request: PreparedRequest) -> Response:
        return await self._handler(request)

    async def aclose(self) -> None:
        self.closed = True
