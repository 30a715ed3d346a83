"""Loopback listeners that misbehave below HTTP, for the transport's and the token endpoint's tests:
`never_accepting()` yields a URL whose connect hangs until the client's connect timeout."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def never_accepting() -> Iterator[str]:
    """The URL (path `/x`) of a listener with a full accept backlog: the kernel drops further SYNs, so
    a connect() to it hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
            yield f"http://127.0.0.1:{port}/x"
        finally:
            for filler in fillers:
                filler.close()
