"""The HTTP seam (`base`) and its two clients: `reqwest` (the default) and `httpx`."""

from __future__ import annotations

from bulkrelay.relay.transport.base import Transport, TransportSettings


def open_transport(settings: TransportSettings) -> Transport:
    """The transport the job names. Call it inside the running event loop.

    Each client is imported only when chosen, so a run pays for one HTTP library.
    """
    if settings.client == "httpx":
        from bulkrelay.relay.transport.httpx import HttpxTransport

        return HttpxTransport(settings)
    from bulkrelay.relay.transport.reqwest import ReqwestTransport

    return ReqwestTransport(settings)
