"""SigV4 (relay/auth/sigv4.py): the published AWS test vectors through our signer, and every request it
signs verified by the loopback target's verifier written from the specification (demo/signatures.py)."""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

import pytest
from botocore.credentials import Credentials
from multidict import CIMultiDict

from bulkrelay.demo.signatures import canonical_request, sigv4_signature
from bulkrelay.job.records import PreparedRequest
from bulkrelay.relay.auth.sigv4 import sign, sign_exact
from bulkrelay.relay.transport.base import USER_AGENT

VECTORS = Path(__file__).parent / "sigv4_vectors"
NAMES = sorted(path.stem for path in VECTORS.glob("*.req"))
ACCESS_KEY, SECRET_KEY = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"  # the suite's own
SUITE_DATE = datetime.datetime(2015, 8, 30, 12, 36, tzinfo=datetime.UTC)


def _parsed(text: str) -> tuple[str, str, list[tuple[str, str]], bytes]:
    """A vector's raw request: method, target, headers (as written), body."""
    head, _, body = text.partition("\n\n")
    request_line, *lines = head.split("\n")
    method, target = request_line.split(" ")[0], request_line.split(" ")[1]
    headers = [(name, value.lstrip()) for name, _, value in (line.partition(":") for line in lines)]
    return method, target, headers, body.encode()


def _token(name: str) -> str | None:
    for header, value in _parsed((VECTORS / f"{name}.sreq").read_text())[2]:
        if header.lower() == "x-amz-security-token":
            return value
    return None


def test_eleven_vectors_are_checked_in() -> None:
    assert len(NAMES) == 11 and "get-vanilla" in NAMES and "post-x-www-form-urlencoded" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_our_signer_gives_each_vector_its_authorization(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: SUITE_DATE)
    method, target, headers, body = _parsed((VECTORS / f"{name}.req").read_text())
    request = PreparedRequest(method, f"https://example.amazonaws.com{target}", tuple(headers), body or None)
    credentials = Credentials(ACCESS_KEY, SECRET_KEY, _token(name)).get_frozen_credentials()
    signed = dict(sign_exact(request, credentials, "service", "us-east-1").headers)
    assert signed["Authorization"] == (VECTORS / f"{name}.authz").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_the_targets_verifier_makes_each_vectors_canonical_request(name: str) -> None:
    method, target, headers, body = _parsed((VECTORS / f"{name}.req").read_text())
    received = CIMultiDict(headers)
    if name == "get-vanilla-with-session-token":
        received.add("X-Amz-Security-Token", _token(name) or "")
    authorization = (VECTORS / f"{name}.authz").read_text()
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    canonical = canonical_request(method, target, received, signed, body)
    assert canonical == (VECTORS / f"{name}.creq").read_text()
    signature = sigv4_signature(SECRET_KEY, "20150830T123600Z", "us-east-1", "service", canonical)
    assert authorization.endswith(f"Signature={signature}")


def test_a_signed_request_signs_every_header_and_the_exact_body() -> None:
    body = b'{"email":"a@example.com","note":"caf\xc3\xa9 & more"}'
    request = PreparedRequest(
        "POST",
        "https://search.example.com:8443/items/a%20b/_doc?refresh=true&b=%2F",
        (("Content-Type", "application/json"), ("Idempotency-Key", "k1"), ("X-Tenant", "t  1")),
        body,
    )
    credentials = Credentials("AKIDTEST", "secret/key+1", "session-token").get_frozen_credentials()
    signed = sign(request, credentials, "es", "eu-west-1")
    headers = CIMultiDict(signed.headers)
    headers["Host"] = "search.example.com:8443"
    assert headers["X-Amz-Content-SHA256"] == hashlib.sha256(body).hexdigest()
    assert headers["User-Agent"] == USER_AGENT
    names = headers["Authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert set(names) >= {
        "content-type",
        "idempotency-key",
        "x-tenant",
        "user-agent",
        "host",
        "x-amz-content-sha256",
        "x-amz-date",
        "x-amz-security-token",
    }
    canonical = canonical_request("POST", "/items/a%20b/_doc?refresh=true&b=%2F", headers, names, body)
    expected = sigv4_signature("secret/key+1", headers["X-Amz-Date"], "eu-west-1", "es", canonical)
    assert headers["Authorization"].endswith(f"Signature={expected}")


def test_signing_again_replaces_the_previous_signature() -> None:
    request = PreparedRequest("PUT", "https://example.com/x", (("Content-Type", "text/plain"),), b"one")
    credentials = Credentials("AKIDTEST", "secret").get_frozen_credentials()
    once = sign(request, credentials, "execute-api", "us-east-1")
    twice = sign(once, credentials, "execute-api", "us-east-1")
    names = [name.lower() for name, _ in twice.headers]
    added = ("authorization", "x-amz-date", "x-amz-content-sha256")
    assert [names.count(name) for name in added] == [1, 1, 1]
