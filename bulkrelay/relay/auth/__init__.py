"""The relay's authentication, one module per kind (oauth2, sigv4, hmac) behind one seam (base.py): each
attempt's request, every other header set, is authorized (a token added, or signed over its exact bytes)
right before it is sent."""

from bulkrelay.relay.auth.base import Authenticator, Authorized, Token
from bulkrelay.relay.auth.oauth2 import (
    TOKEN_ATTEMPTS,
    TokenFailure,
    TokenSource,
    check_token,
    fetch_token,
    open_token_source,
)
from bulkrelay.relay.auth.seam import check_auth, open_authenticator, shown_with_auth

__all__ = [
    "TOKEN_ATTEMPTS",
    "Authenticator",
    "Authorized",
    "Token",
    "TokenFailure",
    "TokenSource",
    "check_auth",
    "check_token",
    "fetch_token",
    "open_authenticator",
    "open_token_source",
    "shown_with_auth",
]
