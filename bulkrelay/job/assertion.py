"""The signed JWT of OAuth2's `grant: jwt_bearer` and `client_auth: private_key_jwt` (RFC 7523).

The key is a PEM private key from the environment (`private_key: "${NAME}"`) or a file
(`private_key_file`, relative to the job file), loaded once when the job is read, so that a key that
cannot sign is refused before any row (exit 2, naming where it was looked for): unreadable, not a
regular file or larger than KEY_FILE_BYTES, encrypted with a passphrase, not a private key, or of a
type other than RSA (RS256) or EC P-256 (ES256).

Each assertion is made fresh for one token request: `iss` the client id, `sub`, `aud`, `iat` now,
`exp` ASSERTION_SECONDS ahead (Salesforce refuses more than 3 minutes) and a random `jti` never used
again. PyJWT signs it (with `cryptography`, which it wraps): docs/auth.md says why that library.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bulkrelay.errors import ConfigInvalid, Problem
from bulkrelay.private import UnreadableFile, read_small_file

if TYPE_CHECKING:  # imported where a key is loaded: PyJWT and cryptography cost ~35 ms of each start-up
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

ASSERTION_SECONDS = 180  # at most 3 minutes ahead, as Salesforce requires
# The most of a key file read: a PEM private key is a few KB (RSA 4096: ~3.3 KB), so a larger file is no
# key, and the bound keeps a wrong path (a log, an image) from being read whole into memory.
KEY_FILE_BYTES = 1 << 20
_PLACE = "request.auth.oauth2"


@dataclass(frozen=True, slots=True)
class AssertionKey:
    """A private key able to sign assertions, and the algorithm its type implies."""

    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = field(repr=False)
    algorithm: str  # RS256 | ES256
    pem: str = field(repr=False)  # the text it was read from: a secret the redactor hides

    def assertion(self, issuer: str, subject: str, audience: str) -> str:
        """A signed JWT, fresh: its own `jti` and a lifetime of ASSERTION_SECONDS."""
        now = int(time.time())
        claims = {"iss": issuer, "sub": subject, "aud": audience, "iat": now, "exp": now + ASSERTION_SECONDS}
        claims["jti"] = secrets.token_urlsafe(24)
        import jwt

        return jwt.encode(claims, self.key, algorithm=self.algorithm)


def read_key_file(path: Path) -> str:
    """The text of `private_key_file`; a file that cannot be read is refused naming it (a regular file of
    at most KEY_FILE_BYTES only: `read_small_file`)."""
    try:
        data = read_small_file(path, KEY_FILE_BYTES)
    except UnreadableFile as refused:
        raise _unreadable(path, refused.reason) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _unreadable(path, "it is not UTF-8 text") from None


def _unreadable(path: Path, why: str) -> ConfigInvalid:
    return _refused(f"cannot read the private key file: {why}", str(path), "private_key_file")


def load_key(pem: str, where: str, key: str) -> AssertionKey:
    """The key in `pem`, read from `where` (`$NAME` or a file's path) for `key` (the job file's key)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        loaded = load_pem_private_key(pem.strip().encode(), password=None)
    except TypeError:  # a passphrase is needed
        message = "the private key is encrypted (a passphrase is needed); give it unencrypted"
        raise _refused(message, where, key) from None
    except (ValueError, UnsupportedAlgorithm):  # its words may quote the text: not repeated
        said = "not a usable PEM private key" if "PRIVATE KEY-----" in pem else "not a PEM private key"
        raise _refused(said, where, key) from None
    if isinstance(loaded, rsa.RSAPrivateKey):
        return AssertionKey(loaded, "RS256", pem)
    if isinstance(loaded, ec.EllipticCurvePrivateKey) and isinstance(loaded.curve, ec.SECP256R1):
        return AssertionKey(loaded, "ES256", pem)
    kind = f"EC on {loaded.curve.name}" if isinstance(loaded, ec.EllipticCurvePrivateKey) else _kind(loaded)
    raise _refused(f"the private key is {kind}: RS256 needs RSA, ES256 EC P-256", where, key)


def _kind(loaded: object) -> str:
    names = [cls.__name__ for cls in type(loaded).__mro__ if cls.__name__.endswith("PrivateKey")]
    return (names[-1] if names else type(loaded).__name__).removesuffix("PrivateKey")


def _refused(message: str, where: str, key: str) -> ConfigInvalid:
    return ConfigInvalid([Problem(f"{message} (looked for in {where})", path=f"{_PLACE}.{key}")])
