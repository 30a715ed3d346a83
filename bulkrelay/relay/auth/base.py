"""The seam between the senders and `request.auth`: each attempt's request, final in every other way,
is handed to the job's `Authenticator` right before the transport sends it, and comes back as it goes
on the wire: with a bearer token (oauth2.py), or signed over its exact bytes (sigv4.py, hmac.py).

Whoever sends a request (a row, a batch, a bulk job's call) calls `authorize` once per attempt, after
every other header is set, so that a retry carries a fresh date and signature. `renew` replaces an
OAuth2 token a 401 refused; `refusal` reads a halting answer for the reason a signer can name (a
signature or clock the target says is wrong).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.transport.base import Response


@dataclass(frozen=True, slots=True)
class Token:
    """An access token. `obtained`: when it came back; `refresh_at`: when to replace it (None: until a
    401). Both on the monotonic clock."""

    value: str = field(repr=False)
    obtained: float
    refresh_at: float | None
    expires_in: float | None = None

    def due(self, now: float) -> bool:
        return self.refresh_at is not None and now >= self.refresh_at


class Authorized(NamedTuple):
    """An attempt's request as it goes on the wire, the OAuth2 token it carries (None: signed), and the
    secrets made for this attempt alone (its signatures): hidden from whatever of its answer is written.
    (The job's secrets, the credentials and a token are the run's redactor's already.)"""

    request: PreparedRequest
    token: Token | None
    hidden: tuple[str, ...] = ()


class Authenticator(Protocol):
    async def authorize(self, request: PreparedRequest) -> Authorized | None:
        """`request` authenticated for this attempt; None when it cannot be (the run is stopping)."""
        ...

    async def renew(self, refused: Token) -> Token | None: ...

    def refusal(self, response: Response, hidden: Collection[str] = ()) -> str | None:
        """Why the target refused the request's authentication, when its answer says (else None), with
        the job's secrets and `hidden` (the refused attempt's: `Authorized.hidden`) not shown."""
        ...

    async def aclose(self) -> None: ...
