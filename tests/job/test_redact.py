"""Redaction of secrets in what the target sends back: every encoding, every cut, captured values."""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Callable
from textwrap import dedent
from urllib.parse import quote, quote_plus

import orjson
import pytest

from bulkrelay.job.config import parse_job
from bulkrelay.job.redact import redact_url_credentials
from bulkrelay.job.request import RequestRenderer
from bulkrelay.job.template import Redactor
from bulkrelay.relay.response import ResponseReader

PLAIN = "tok-5ecr3t-Zq81xv-A7c9Lm"  # 24 characters, like the issue's token
TRICKY = "p\"a\\ss w\u00f6rd+/%&<>'\U0001f600-tail"  # quote, backslash, space, non-ASCII (BMP and not)
SECRETS = (PLAIN, TRICKY)


def _json_ascii_upper(value: str) -> str:
    escaped = json.dumps(value)[1:-1]
    return re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m[1].upper(), escaped)


def _go_json(value: str) -> str:
    escaped = orjson.dumps(value).decode()[1:-1]
    return escaped.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _html_numeric(value: str) -> str:
    return "".join(f"&#{ord(c)};" if c in "&<>\"'" else c for c in value)


def _b64(value: str, *, urlsafe: bool = False, pad: bool = True) -> str:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    text = encode(value.encode()).decode()
    return text if pad else text.rstrip("=")


ENCODINGS: dict[str, Callable[[str], str]] = {
    "raw": lambda s: s,
    "json": lambda s: orjson.dumps(s).decode()[1:-1],
    "json_ascii": lambda s: json.dumps(s)[1:-1],  # \u escapes, surrogate pairs, lower-case hex
    "json_ascii_upper": _json_ascii_upper,
    "json_escaped_slash": lambda s: orjson.dumps(s).decode()[1:-1].replace("/", "\\/"),
    "json_html_safe": _go_json,
    "url_all": lambda s: quote(s, safe=""),
    "url_lower_hex": lambda s: re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), quote(s, safe="")),
    "url_path": quote,
    "url_plus": quote_plus,
    "url_partial": lambda s: quote(s, safe="!$&'()*+,;=:@/\\%"),  # what a URL parser leaves alone
    "html": html.escape,
    "html_numeric": _html_numeric,
    "base64": _b64,
    "base64_unpadded": lambda s: _b64(s, pad=False),
    "base64_urlsafe": lambda s: _b64(s, urlsafe=True),
}

PREFIX = '{"error":"bad token '
SUFFIX = ' for you"}'


@pytest.mark.parametrize("secret", SECRETS, ids=["plain", "tricky"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_is_hidden_whole(secret: str, encoding: str) -> None:
    form = ENCODINGS[encoding](secret)
    assert Redactor(SECRETS).redact(PREFIX + form + SUFFIX) == PREFIX + "***" + SUFFIX


def _determined(prefix: bytes, secret: bytes) -> tuple[int, int]:
    """Where, in the base64 of `prefix + secret + ...`, the characters made of the secret's bits only lie."""
    start_bit, end_bit = 8 * len(prefix), 8 * (len(prefix) + len(secret))
    return -(-start_bit // 6), end_bit // 6


@pytest.mark.parametrize("secret", SECRETS, ids=["plain", "tricky"])
@pytest.mark.parametrize("lead", ["", "B", "Be", "Bearer "])
def test_base64_of_a_longer_text_is_hidden_at_every_alignment(secret: str, lead: str) -> None:
    # A target that base64-encodes the whole header it got ("Bearer <token>") shifts the token
    # by 0, 1 or 2 bytes within the base64 groups.
    stream = base64.b64encode(lead.encode() + secret.encode() + b" tail").decode()
    start, end = _determined(lead.encode(), secret.encode())
    assert Redactor(SECRETS).redact(f"x {stream} y") == f"x {stream[:start]}***{stream[end:]} y"


def test_overlapping_secrets_are_hidden_together() -> None:
    redactor = Redactor(["abcXYZ", "XYZdef"])
    assert redactor.redact("<abcXYZdef>") == "<***>"
    assert redactor.redact("<XYZdefabcXYZ>") == "<***>"


def test_a_secret_inside_another_is_hidden_whole() -> None:
    assert Redactor(["tok", "tok+en/1"]).redact("a tok b tok+en/1 c") == "a *** b *** c"


def test_long_runs_of_backslashes_do_not_stall_the_redactor() -> None:
    # A secret made of backslashes against a body of backslashes: many ways to read each run.
    redactor = Redactor(["\\" * 16 + "x"])
    body = "\\" * 4000 + "y"
    assert redactor.redact(body) == body
    assert redactor.redact("\\" * 32 + "x") == "***"


def test_without_secrets_text_is_returned_as_is() -> None:
    text = "nothing to hide " * 10
    assert Redactor([]).redact(text) is text
    reader = ResponseReader({"id": "/id"}, 8, Redactor([]))
    assert reader.failure_body(b'{"error": "x"}') == '{"error"'
    assert reader.captured(b'{"id": "42"}') == {"id": "42"}


# ----------------------------------------------------------------------- truncation


def _expected_cut(prefix: bytes, form: bytes, suffix: bytes, limit: int) -> str:
    """The first `limit` bytes, with the secret hidden whole when the cut falls inside it."""
    if limit <= len(prefix):
        return prefix[:limit].decode()
    kept = limit - len(prefix) - len(form)
    return prefix.decode() + "***" + (suffix[:kept].decode() if kept > 0 else "")


@pytest.mark.parametrize("secret", SECRETS, ids=["plain", "tricky"])
@pytest.mark.parametrize("encoding", ["raw", "json", "json_ascii", "url_all", "url_plus", "base64"])
def test_a_cut_at_every_offset_keeps_no_part_of_a_secret(secret: str, encoding: str) -> None:
    prefix, suffix = PREFIX.encode(), SUFFIX.encode()
    form = ENCODINGS[encoding](secret).encode()
    body = prefix + form + suffix
    for limit in range(1, len(body) + 2):
        kept = ResponseReader({}, limit, Redactor(SECRETS)).failure_body(body)
        assert kept == _expected_cut(prefix, form, suffix, limit), limit


def test_a_cut_after_earlier_secrets_keeps_no_part_of_a_later_one() -> None:
    # Redaction shortens the text: the cut must still be made in the body's own bytes.
    body = f"{PLAIN} {PLAIN} and then {PLAIN} end".encode()
    for limit in range(1, len(body) + 2):
        kept = ResponseReader({}, limit, Redactor([PLAIN])).failure_body(body)
        assert kept is not None
        assert not any(PLAIN[i : i + 2] in kept for i in range(len(PLAIN) - 1)), (limit, kept)


def test_a_body_cut_by_the_transport_keeps_no_partial_secret_at_its_end() -> None:
    # The transport reads at most max_body_bytes: a secret may be cut off at the body's very end.
    # Whatever could be the start of one is withheld; the rest is kept.
    for cut in range(1, len(PLAIN)):
        body = b"e" * 1000 + PLAIN[:cut].encode()
        kept = ResponseReader({}, 4096, Redactor([PLAIN])).failure_body(body, truncated=True)
        assert kept is not None and kept.startswith("e" * 500) and kept.endswith("***"), kept
        assert set(kept) == {"e", "*"}, kept
    whole = ResponseReader({}, 4096, Redactor([PLAIN])).failure_body(b"e" * 1000, truncated=False)
    assert whole == "e" * 1000


def test_the_issue_case_a_24_character_token_cut_after_15() -> None:
    body = b'{"error":"invalid token ' + PLAIN.encode() + b'"}'
    kept = ResponseReader({}, len(b'{"error":"invalid token ') + 15, Redactor([PLAIN])).failure_body(body)
    assert kept == '{"error":"invalid token ***'


# ----------------------------------------------------------------------- captured values


def test_captured_values_are_redacted_strings_keys_and_numbers() -> None:
    document = {
        "id": 7,
        "token": TRICKY,
        "nested": {"list": [f"Bearer {PLAIN}", 5, _b64(PLAIN)], TRICKY: "as a key"},
        "pin": 12345678,
        "url": "https://x.test/?t=" + quote_plus(TRICKY),
    }
    reader = ResponseReader(
        {"id": "/id", "token": "/token", "nested": "/nested", "pin": "/pin", "url": "/url"},
        2048,
        Redactor([PLAIN, TRICKY, "12345678"]),
    )
    assert reader.captured(orjson.dumps(document)) == {
        "id": 7,
        "token": "***",
        "nested": {"list": ["Bearer ***", 5, "***"], "***": "as a key"},
        "pin": "***",
        "url": "https://x.test/?t=***",
    }


# ----------------------------------------------------------------------- derived forms


def test_basic_auth_the_transport_builds_from_url_credentials_is_hidden() -> None:
    # reqwest turns user:password@ in the URL into `Authorization: Basic base64(user:password)`.
    text = dedent(
        """\
        version: 1
        request:
          method: POST
          url: "http://${API_USER}:${API_PASS}@127.0.0.1:9/items/{id}"
          body: "x"
          content_type: text/plain
        """
    )
    env = {"API_USER": "svc", "API_PASS": 'pa"ss w\u00f6rd'}
    renderer = RequestRenderer.from_config(parse_job(text, file="job.yaml").request, env)
    basic = _b64('svc:pa"ss w\u00f6rd')
    assert renderer.redactor.redact(f"got Basic {basic}.") == "got Basic ***."


def test_rendered_requests_are_matched_on_the_renderer_s_own_spellings() -> None:
    # The idempotency key hashes the redacted request: it must not move when redaction learns more.
    redactor = Redactor(["a+b/c"])
    assert redactor.redact_rendered("u?k=a+b/c&q=a%2Bb%2Fc&p=a%2bb%2fc") == "u?k=***&q=***&p=a%2bb%2fc"
    assert redactor.redact("u?k=a+b/c&q=a%2Bb%2Fc&p=a%2bb%2fc") == "u?k=***&q=***&p=***"


def test_a_long_secret_is_hidden_in_every_encoding() -> None:
    secret = ('k3y"\\ ' * 60) + "\u00e9nd"  # past the length up to which patterns are split
    redactor = Redactor([secret])
    for encoding in ("raw", "json", "json_ascii", "url_all", "url_plus", "base64"):
        assert redactor.redact(f"< {ENCODINGS[encoding](secret)} >") == "< *** >", encoding


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://***@h:6379/0"),
        ("redis://user:pw@h:6379/0", "redis://***@h:6379/0"),
        ("rediss://u%40x:p%40w@h/0", "rediss://***@h/0"),
        ("redis://h:6379/0?password=pw", "redis://h:6379/0?password=***"),
        ("redis://h/0?db=1&Username=u&PASSWORD=pw", "redis://h/0?db=1&Username=***&PASSWORD=***"),
        ("redis://h/0?pass%77ord=pw", "redis://h/0?pass%77ord=***"),
        ("rediss://h/0?ssl_password=pw", "rediss://h/0?ssl_password=***"),
        ("unix://:pw@/run/redis.sock?db=0", "unix://***@/run/redis.sock?db=0"),
        ("unix:///run/redis.sock?password=pw", "unix:///run/redis.sock?password=***"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_every_credential_a_redis_url_can_carry_is_hidden(url: str, shown: str) -> None:
    assert redact_url_credentials(url) == shown


# ----------------------------------------------------------------------- an attempt's own secrets

SIGNATURE = base64.b64encode(bytes(range(7, 39))).decode()  # a base64 HMAC: + / = among its characters
HEX_SIGNATURE = bytes(range(40, 72)).hex()


@pytest.mark.parametrize("signature", [SIGNATURE, HEX_SIGNATURE], ids=["base64", "hex"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_an_attempts_signature_is_hidden_in_every_encoding_beside_the_jobs_secrets(
    signature: str, encoding: str
) -> None:
    hiding = Redactor(SECRETS).hiding((signature,))
    text = PREFIX + ENCODINGS[encoding](signature) + " and " + ENCODINGS[encoding](PLAIN) + SUFFIX
    assert hiding.redact(text) == PREFIX + "*** and ***" + SUFFIX


def test_an_attempts_signature_is_hidden_inside_the_base64_of_its_header_and_across_a_cut() -> None:
    hiding = Redactor([PLAIN]).hiding((SIGNATURE,))
    header = base64.b64encode(f"v1,{SIGNATURE}".encode()).decode()
    shown = hiding.redact(f"got {header}!")
    assert shown.startswith("got ") and "***" in shown and header[6:-4] not in shown
    body = ('{"got": "' + SIGNATURE + '"}').encode()
    reader = ResponseReader({}, 20, Redactor([PLAIN])).hiding((SIGNATURE,))
    assert reader.failure_body(body) == '{"got": "***'


def test_overlapping_signature_and_secret_are_hidden_together() -> None:
    assert Redactor(["abcXYZ"]).hiding(["XYZdef"]).redact("<abcXYZdef>") == "<***>"


def test_hiding_nothing_is_the_same_redactor_and_the_jobs_redactor_is_unchanged() -> None:
    redactor = Redactor([PLAIN])
    assert redactor.hiding(()) is redactor and redactor.hiding([""]) is redactor
    redactor.hiding((SIGNATURE,)).redact(f"\\{SIGNATURE}")
    assert redactor.redact(SIGNATURE) == SIGNATURE
    assert Redactor([]).hiding((SIGNATURE,)).redact(f"x {SIGNATURE}") == "x ***"
