"""HMAC signatures (relay/auth/hmac.py), each scheme checked by the target's own verifier
(demo/signatures.py): over the exact bytes, one signature per secret during a rotation."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import make_mocked_request

from bulkrelay.demo.signatures import SignatureCheck, SignedPlan
from bulkrelay.errors import SecretInvalid
from bulkrelay.job.config import parse_job
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.signing import hmac_keys
from bulkrelay.relay.auth.hmac import HmacSigner

OLD, NEW = (
    "whsec_" + base64.b64encode(b"old-key-0123456789").decode(),
    "whsec_" + base64.b64encode(b"new-key").decode(),
)
BODY = '{"email":"a@example.com","name":"Zoë"}'.encode()
CUSTOM = {
    "header": "X-Signature",
    "algorithm": "sha512",
    "encoding": "base64",
    "prefix": "v=",
    "signed": "{timestamp}.{method}.{path}.{body}",
    "timestamp_header": "X-Timestamp",
}


def _signer(scheme: str, secrets: list[str], **custom: Any) -> HmacSigner:
    auth = {"scheme": scheme, "secret": [f"${{S{n}}}" for n in range(len(secrets))], **custom}
    text = f"""
version: 1
request:
  method: POST
  url: "https://hooks.example.com/in"
  body: "x"
  content_type: application/json
  idempotency_key: {{header: Idempotency-Key}}
  auth: {{hmac: {orjson.dumps(auth).decode()}}}
"""
    config = parse_job(text, file="job.yaml").request.auth
    assert config is not None and config.hmac is not None
    keys = hmac_keys(config.hmac, {f"S{n}": secret for n, secret in enumerate(secrets)})
    return HmacSigner(config.hmac, keys, "Idempotency-Key")


def _verified(plan: dict[str, Any], request: PreparedRequest) -> tuple[int, bytes] | None:
    path = request.url.removeprefix("https://hooks.example.com")
    received = make_mocked_request(request.method, path, headers=dict(request.headers))
    return SignatureCheck(SignedPlan.model_validate(plan)).refusal(received, request.body or b"")


def _request(body: bytes = BODY) -> PreparedRequest:
    headers = (("Content-Type", "application/json"), ("Idempotency-Key", "key-1"))
    return PreparedRequest("POST", "https://hooks.example.com/in?tenant=7", headers, body)


@pytest.mark.parametrize(
    ("scheme", "custom"), [("standard_webhooks", {}), ("github", {}), ("custom", CUSTOM)]
)
def test_each_scheme_is_accepted_by_an_independent_verifier(scheme: str, custom: dict[str, Any]) -> None:
    secret = NEW if scheme == "standard_webhooks" else "plain-secret"
    signed = _signer(scheme, [secret], **custom).sign(_request(), 1_700_000_000)
    plan = {"scheme": scheme, "secrets": [secret], "clock_skew_seconds": 1e10, **custom}
    assert _verified(plan, signed) is None
    tampered = signed._replace(body=BODY + b" ")
    assert _verified(plan, tampered) is not None  # over the exact bytes
    assert _verified({**plan, "secrets": ["another"]}, signed) is not None


def test_a_rotation_sends_one_signature_per_secret_and_either_receiver_accepts() -> None:
    signed = _signer("standard_webhooks", [OLD, NEW]).sign(_request(), 1_700_000_000)
    headers = dict(signed.headers)
    assert headers["webhook-id"] == "msg_key-1"  # the idempotency key: the same on a retry
    assert headers["webhook-timestamp"] == "1700000000"
    assert [part[:3] for part in headers["webhook-signature"].split(" ")] == ["v1,", "v1,"]
    for secret in (OLD, NEW):
        assert (
            _verified(
                {"scheme": "standard_webhooks", "secrets": [secret], "clock_skew_seconds": 1e10}, signed
            )
            is None
        )


def test_a_whsec_secret_that_is_not_base64_is_refused_naming_its_variable() -> None:
    with pytest.raises(SecretInvalid, match="S0 starts with whsec_") as refused:
        _signer("standard_webhooks", ["whsec_not base64!"])
    assert "not base64!" not in str(refused.value)
