"""The relay's authentication: one module per kind, behind the seam that signs each attempt's final bytes."""

from bulkrelay.relay.auth.oauth2 import (
    TOKEN_ATTEMPTS,
    Token,
    TokenFailure,
    TokenSource,
    check_token,
    fetch_token,
    open_token_source,
)

__all__ = [
    "TOKEN_ATTEMPTS",
    "Token",
    "TokenFailure",
    "TokenSource",
    "check_token",
    "fetch_token",
    "open_token_source",
]
