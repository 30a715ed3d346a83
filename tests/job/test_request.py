"""Record → request: URL and query encoding, headers, bodies, type coercion, redaction, idempotency keys."""

from __future__ import annotations

from textwrap import dedent
from typing import Any

import orjson
import pytest

from bulkrelay.errors import SecretMissing
from bulkrelay.job import request as request_module
from bulkrelay.job.config import RequestConfig, parse_job
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.job.request import RenderError, RequestRenderer, RowRequests, idempotency_key
from bulkrelay.job.template import Redactor
from bulkrelay.job.wire import wire_url

ENV = {"API_TOKEN": "tok-123", "API_BASE": "https://api.test/v1"}


def _request(yaml_request: str) -> RequestConfig:
    text = "version: 1\nrequest:\n" + "\n".join("  " + line for line in dedent(yaml_request).splitlines())
    return parse_job(text, file="job.yaml").request


def _renderer(yaml_request: str, env: dict[str, str] | None = None) -> RequestRenderer:
    return RequestRenderer.from_config(_request(yaml_request), ENV if env is None else env)


def _record(**fields: Any) -> Record:
    return Record(row_number=3, line=4, fields=fields)


def _json(request: PreparedRequest) -> Any:
    assert request.body is not None
    return orjson.loads(request.body)


ALPHA = """\
method: POST
url: "${API_BASE}/customers/{customer_id}"
query: { source: migration, batch: "{batch}" }
headers:
  Authorization: "Bearer ${API_TOKEN}"
  X-Customer: "{customer_id}"
json:
  email: { from: email }
  source: { value: migration }
  address: { city: { from: city }, tags: { value: [a, b] } }
  age: { from: age, type: integer }
idempotency_key: { header: Idempotency-Key }
"""

ROW = {"customer_id": "C 1/2", "email": "ada@example.com", "city": "London", "age": "36", "batch": "a&b"}


def test_render_json_request() -> None:
    renderer = _renderer(ALPHA)
    request = renderer.render(_record(**ROW))
    assert request.method == "POST"
    assert request.url == "https://api.test/v1/customers/C%201%2F2?source=migration&batch=a%26b"
    assert request.headers == (
        ("Authorization", "Bearer tok-123"),
        ("X-Customer", "C 1/2"),
        ("Content-Type", "application/json"),
    )
    assert _json(request) == {
        "email": "ada@example.com",
        "source": "migration",
        "address": {"city": "London", "tags": ["a", "b"]},
        "age": 36,
    }


def test_fields_used() -> None:
    assert _renderer(ALPHA).fields_used == {"customer_id", "batch", "email", "city", "age"}


def test_query_appends_to_an_existing_query_string() -> None:
    renderer = _renderer("method: GET\nurl: 'https://x.test/s?q=1'\nquery: { page: '{p}' }\n")
    assert renderer.render(_record(p="2")).url == "https://x.test/s?q=1&page=2"


def test_no_body_for_a_bare_delete() -> None:
    request = _renderer("method: DELETE\nurl: 'https://x.test/c/{id}'\n").render(_record(id="7"))
    assert request.body is None and request.headers == ()


def test_form_body() -> None:
    renderer = _renderer(
        "method: POST\nurl: https://x.test/\nform: { name: '{first} {last}', id: { from: id } }\n"
    )
    request = renderer.render(_record(first="Ada", last="L&L", id=7))
    assert request.body == b"name=Ada+L%26L&id=7"
    assert ("Content-Type", "application/x-www-form-urlencoded") in request.headers
    assert renderer.fields_used == {"first", "last", "id"}


def test_raw_body_with_content_type() -> None:
    text = """\
        method: PUT
        url: https://x.test/
        body: '<id>{id}</id><t>${API_TOKEN}</t>'
        content_type: application/xml
        """
    request = _renderer(text).render(_record(id="é"))
    assert request.body == "<id>é</id><t>tok-123</t>".encode()
    assert request.headers == (("Content-Type", "application/xml"),)


def test_configured_content_type_header_wins_for_json() -> None:
    text = """\
        method: PATCH
        url: https://x.test/
        headers: { content-type: application/merge-patch+json }
        json: { a: { value: 1 } }
        """
    request = _renderer(text).render(_record())
    assert request.headers == (("content-type", "application/merge-patch+json"),)


def test_missing_field_names_the_field() -> None:
    with pytest.raises(RenderError) as caught:
        _renderer(ALPHA).render(_record(**{k: v for k, v in ROW.items() if k != "email"}))
    assert caught.value.field == "email"
    assert "missing" in caught.value.message


def test_missing_url_field_names_the_field() -> None:
    with pytest.raises(RenderError) as caught:
        _renderer(ALPHA).render(_record(**{k: v for k, v in ROW.items() if k != "customer_id"}))
    assert caught.value.field == "customer_id"


def test_header_injection_is_refused() -> None:
    with pytest.raises(RenderError) as caught:
        _renderer(ALPHA).render(_record(**{**ROW, "customer_id": "x\r\nEvil: 1"}))
    assert caught.value.field == "customer_id" and "line break" in caught.value.message


def _typed(type_name: str, *extra: str) -> RequestRenderer:
    options = ", ".join((f"type: {type_name}", *extra))
    return _renderer(f"method: POST\nurl: https://x.test/\njson: {{ v: {{ from: v, {options} }} }}\n")


@pytest.mark.parametrize(
    ("type_name", "raw", "expected"),
    [
        ("integer", "42", 42),
        ("integer", " -7 ", -7),
        ("integer", "9223372036854775807", 2**63 - 1),
        ("integer", "-9223372036854775808", -(2**63)),
        ("integer", 42, 42),
        ("integer", "0" * 5000 + "7", 7),
        ("integer", "-" + "0" * 5000, 0),
        ("number", "4.5", 4.5),
        ("number", "42", 42),
        ("number", "1e3", 1000.0),
        ("number", 3, 3),
        ("boolean", "TRUE", True),
        ("boolean", "no", False),
        ("boolean", "1", True),
        ("boolean", 0, False),
        ("boolean", True, True),
        ("json", '{"a": [1, null]}', {"a": [1, None]}),
        ("json", [1, 2], [1, 2]),
        ("json", None, None),
        ("json", "[18446744073709551615, -9223372036854775808]", [2**64 - 1, -(2**63)]),
        ("string", "007", "007"),
        ("string", 42, "42"),
        ("string", "", ""),
    ],
)
def test_coercion(type_name: str, raw: Any, expected: Any) -> None:
    body = _json(_typed(type_name).render(_record(v=raw)))
    assert body == {"v": expected}
    assert type(body["v"]) is type(expected)


@pytest.mark.parametrize(
    ("type_name", "raw", "fragment"),
    [
        ("integer", "4.0", "not an integer"),
        ("integer", "abc", "not an integer"),
        ("integer", True, "not an integer"),
        ("integer", 4.0, "not an integer"),
        ("integer", "1_000", "not an integer"),
        ("integer", "99999999999999999999999", "64-bit"),
        ("integer", "9223372036854775808", "signed 64-bit"),
        ("integer", "-9223372036854775809", "signed 64-bit"),
        ("integer", 2**64 - 1, "signed 64-bit"),
        ("integer", 2**63, "signed 64-bit"),
        ("integer", "9" * 5000, "signed 64-bit"),
        ("integer", "-" + "1" * 4301, "signed 64-bit"),
        ("number", "9" * 5000, "signed 64-bit"),
        ("json", '{"id": 123456789012345678901234567890}', "integer 123456789012345678901234567890, outside"),
        ("json", "[-9223372036854775809]", "outside the 64-bit range"),
        ("json", '{"a": 18446744073709551616}', "outside the 64-bit range"),
        ("integer", "", "is empty"),
        ("integer", None, "is null"),
        ("number", "nan", "not a finite number"),
        ("number", "1e999", "not a finite number"),
        ("number", True, "not a finite number"),
        ("boolean", "maybe", "not a boolean"),
        ("boolean", 2, "not a boolean"),
        ("json", "{nope", "not valid JSON"),
        ("string", None, "is null"),
    ],
)
def test_coercion_failures_name_the_field(type_name: str, raw: Any, fragment: str) -> None:
    with pytest.raises(RenderError) as caught:
        _typed(type_name).render(_record(v=raw))
    assert caught.value.field == "v"
    assert fragment in caught.value.message


def test_default_fills_absent_null_and_empty_values() -> None:
    renderer = _typed("integer", "default: 0")
    assert _json(renderer.render(_record(v=""))) == {"v": 0}
    assert _json(renderer.render(_record(v=None))) == {"v": 0}
    assert _json(renderer.render(_record())) == {"v": 0}
    assert _json(renderer.render(_record(v="5"))) == {"v": 5}
    assert _json(_typed("string", "default: n/a").render(_record(v=""))) == {"v": ""}


def test_untyped_values_pass_as_read() -> None:
    renderer = _renderer("method: POST\nurl: https://x.test/\njson: { v: { from: v } }\n")
    assert _json(renderer.render(_record(v="42"))) == {"v": "42"}
    assert _json(renderer.render(_record(v={"nested": 1}))) == {"v": {"nested": 1}}
    assert _json(renderer.render(_record(v=None))) == {"v": None}


def test_whole_body_from_one_json_field() -> None:
    renderer = _renderer("method: POST\nurl: https://x.test/\njson: { from: payload, type: json }\n")
    assert renderer.render(_record(payload='{"a": 1}')).body == b'{"a":1}'


MIXED_BODY = """\
method: POST
url: https://x.test/
json:
  kind: { value: customer }
  age: { from: age, type: integer }
  address: { city: { from: city }, zip: { from: zip, type: string, default: none }, tags: { value: [a] } }
  email: { from: email }
"""


def test_a_json_body_keeps_its_configured_key_order_literals_and_types() -> None:
    request = _renderer(MIXED_BODY).render(_record(age="42", city="Oslo", email="e@x.test"))
    assert request.body == (
        b'{"kind":"customer","age":42,"address":{"city":"Oslo","zip":"none","tags":["a"]},"email":"e@x.test"}'
    )


@pytest.mark.parametrize(
    ("fields", "field", "fragment"),
    [
        ({"age": "x"}, "age", "not an integer"),  # the first bad leaf in order, though email is missing too
        ({"age": "", "city": "c", "email": "e"}, "age", "is empty"),
        ({"age": None, "city": "c", "email": "e"}, "age", "is null"),
        ({"age": "1", "email": "e"}, "city", "missing"),
        ({"age": "1", "city": "c"}, "email", "missing"),
    ],
)
def test_a_json_body_names_the_first_leaf_that_fails(
    fields: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(RenderError) as caught:
        _renderer(MIXED_BODY).render(_record(**fields))
    assert caught.value.field == field and fragment in caught.value.message


def test_a_value_json_cannot_carry_names_the_body() -> None:
    renderer = _renderer("method: POST\nurl: https://x.test/\njson: { a: { from: a }, n: { from: n } }\n")
    with pytest.raises(RenderError) as caught:
        renderer.render(_record(a="x", n=2**70))  # beyond 64 bits: orjson refuses it
    assert caught.value.field == "json" and "cannot be written as JSON" in caught.value.message


def test_a_json_body_nested_deeper_than_python_compiles_still_renders() -> None:
    depth = 250  # deeper than the Python parser nests brackets in one expression
    body = "{ v: { from: a } }"
    for _ in range(depth):
        body = f"{{ n: {body} }}"
    request = _renderer(f"method: POST\nurl: https://x.test/\njson: {body}\n").render(_record(a=1))
    assert request.body == b'{"n":' * depth + b'{"v":1}' + b"}" * depth


def test_secret_missing_names_all() -> None:
    with pytest.raises(SecretMissing) as caught:
        _renderer(ALPHA, env={})
    assert caught.value.context == {"missing": ["API_BASE", "API_TOKEN"]}


def test_redact_hides_every_secret() -> None:
    text = """\
        method: POST
        url: 'https://x.test/?key=${API_TOKEN}'
        query: { k: '${API_TOKEN}' }
        body: 'secret=${API_TOKEN}'
        content_type: text/plain
        """
    env = {"API_TOKEN": "a+b/c"}
    renderer = _renderer(text, env)
    request = renderer.render(_record())
    assert "a%2Bb%2Fc" in request.url  # the query encoder encoded the secret
    shown = renderer.redact(request)
    assert shown == {
        "method": "POST",
        "url": "https://x.test/?key=***&k=***",
        "headers": [["Content-Type", "text/plain"]],
        "body": "secret=***",
    }
    assert "a+b/c" not in orjson.dumps(shown).decode()


def test_redact_alpha_request() -> None:
    renderer = _renderer(ALPHA)
    shown = renderer.redact(renderer.render(_record(**ROW)))
    assert ["Authorization", "Bearer ***"] in shown["headers"]
    assert "tok-123" not in orjson.dumps(shown).decode()


def test_idempotency_key_is_stable_and_content_sensitive() -> None:
    renderer = _renderer(ALPHA)
    request = renderer.render(_record(**ROW))
    key = renderer.idempotency_key("fp1", "key:C1", request)
    assert len(key) == 32 and int(key, 16) >= 0
    assert renderer.idempotency_key("fp1", "key:C1", renderer.render(_record(**ROW))) == key
    assert renderer.idempotency_key("fp1", "key:C1", renderer.render(_record(**{**ROW, "age": "37"}))) != key
    assert renderer.idempotency_key("fp1", "key:C2", request) != key
    assert renderer.idempotency_key("fp2", "key:C1", request) != key


def test_a_delivery_scopes_the_key_and_without_one_the_key_is_what_it_was() -> None:
    renderer = _renderer(ALPHA)
    request = renderer.render(_record(**ROW))
    plain = renderer.idempotency_key("fp1", "key:C1", request)
    night_1 = renderer.idempotency_key("fp1", "key:C1", request, delivery="run-1")
    assert renderer.idempotency_key("fp1", "key:C1", request, delivery="run-1") == night_1
    assert len({plain, night_1, renderer.idempotency_key("fp1", "key:C1", request, delivery="run-3")}) == 3
    assert renderer.idempotency_key("fp1", "key:C1", request, delivery=None) == plain


def test_idempotency_key_ignores_secret_rotation() -> None:
    before = _renderer(ALPHA, {**ENV, "API_TOKEN": "old-token"})
    after = _renderer(ALPHA, {**ENV, "API_TOKEN": "new-token"})
    old = before.render(_record(**ROW))
    new = after.render(_record(**ROW))
    assert old.headers != new.headers
    assert before.idempotency_key("fp", "key:C1", old) == after.idempotency_key("fp", "key:C1", new)


def test_idempotency_key_ignores_its_own_header() -> None:
    renderer = _renderer(ALPHA)
    request = renderer.render(_record(**ROW))
    key = renderer.idempotency_key("fp", "row:3", request)
    stamped = renderer.with_idempotency_key(request, key)
    assert stamped.headers[-1] == ("Idempotency-Key", key)
    assert renderer.idempotency_key("fp", "row:3", stamped) == key


def test_module_idempotency_key_matches_the_method() -> None:
    renderer = _renderer(ALPHA)
    request = renderer.render(_record(**ROW))
    direct = idempotency_key(
        "fp", "row:3", request, redactor=renderer.redactor, skip_header="idempotency-key"
    )
    assert direct == renderer.idempotency_key("fp", "row:3", request)
    assert idempotency_key("fp", "row:3", request, redactor=Redactor([])) != direct


def test_with_idempotency_key_without_a_header_is_unchanged() -> None:
    renderer = _renderer("method: DELETE\nurl: 'https://x.test/c/{id}'\n")
    request = renderer.render(_record(id="1"))
    assert renderer.with_idempotency_key(request, "k") is request


def test_row_requests_stamp_the_rows_key_as_the_renderer_computes_it() -> None:
    renderer = _renderer(ALPHA)
    record = _record(**ROW)
    request, key = RowRequests(renderer, "fp", "customer_id").keyed(record)
    expected = renderer.idempotency_key("fp", f"key:{ROW['customer_id']}", renderer.render(record))
    assert key == expected
    assert request == renderer.with_idempotency_key(renderer.render(record), expected)
    by_row, row_key = RowRequests(renderer, "fp", None).keyed(record)  # no input.key: the row number
    assert row_key == renderer.idempotency_key("fp", "row:3", renderer.render(record)) != key
    assert by_row.headers[-1] == ("Idempotency-Key", row_key)
    delivered = RowRequests(renderer, "fp", "customer_id", delivery="run-1")  # a delta run's scope
    assert delivered.keyed(record)[1] == renderer.idempotency_key(
        "fp", f"key:{ROW['customer_id']}", renderer.render(record), delivery="run-1"
    )
    assert delivered.keyed(record)[1] != key


def test_row_requests_without_an_idempotency_header_send_the_render_as_it_is() -> None:
    renderer = _renderer("method: DELETE\nurl: 'https://x.test/c/{id}'\n")
    record = _record(id="1")
    rows = RowRequests(renderer, "fp", "id")
    assert rows.keyed(record) == (renderer.render(record), None)
    assert len(rows.key(record, renderer.render(record))) == 32  # a batch item's id all the same


def test_a_url_without_fields_renders_as_its_constant() -> None:
    renderer = _renderer("method: POST\nurl: 'https://x.test/v1/customers'\njson:\n  id: {from: id}\n")
    assert renderer.render(_record(id="7")).url == "https://x.test/v1/customers"
    assert renderer.render(_record(id="8")).body == b'{"id":"8"}'


def test_a_dot_segment_is_refused_only_where_it_would_leave_the_path_segment() -> None:
    renderer = _renderer('method: GET\nurl: "https://x.test/a/{p}{s}/b?q={q}"\n')
    assert renderer.render(_record(p="...", s="x", q="..")).url == "https://x.test/a/...x/b?q=.."
    assert renderer.render(_record(p=".", s=".json", q=".")).url == "https://x.test/a/..json/b?q=."
    assert renderer.render(_record(p="%2e", s=".", q="y")).url == "https://x.test/a/%252e./b?q=y"
    with pytest.raises(RenderError) as together:
        renderer.render(_record(p=".", s=".", q="x"))  # two fields that make ".." between them
    assert together.value.field == "p" and "path segment '..'" in together.value.message
    last = _renderer('method: GET\nurl: "https://x.test/a/{p}"\n')
    for value in (".", ".."):
        with pytest.raises(RenderError) as caught:
            last.render(_record(p=value))
        assert caught.value.field == "p" and f"path segment {value!r}" in caught.value.message


def test_the_url_is_rendered_as_the_transport_sends_it() -> None:
    url = "HTTPS://X.test:443/./a/../caf\u00e9/{p}#top"
    renderer = _renderer(f'method: GET\nurl: "{url}"\nquery: {{ q: "{{p}}" }}\n')
    assert renderer.render(_record(p="1")).url == "https://x.test/caf%C3%A9/1?q=1"


# Templates whose text is already in wire form (the renderer then skips the per-row parse) and ones
# that are not, or where a field could complete a literal "%" into "%2e" (it must keep the parse).
WIRE_TEMPLATES = [
    "https://x.test/v1/customers/{a}",
    "https://x.test/v1/{a}/x/{b}?k={a}",
    "https://x.test/{a}{b}",
    "https://x.test/v1/{a}.{b}/",
    "https://x.test/%2e{a}/x",
    "https://x.test/a/%{a}",
    "https://x.test/a/%2{a}/{b}",
    "http://x.test:80/A/{a}",
    "HTTPS://X.test/./v1/{a}",
    "https://x.test/x#{a}",
]
TRICKY_VALUES = ["id-1", "", ".", "..", "%2e", "%2E", "e", "2e", "E", "a/b", "a\\b", "q?x=1", "f#g"]
TRICKY_VALUES += ["a b", "t\tb", "l\nb", "caf\u00e9", "\u65e5", "\x00", "\x7f", "'\"<>`{}|^", "+&=;"]
TRICKY_VALUES += ["%", "%zz"]


def _outcome(renderer: RequestRenderer, record: Record) -> str:
    try:
        return renderer.render(record).url
    except RenderError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("template", WIRE_TEMPLATES)
def test_the_rendered_url_is_the_wire_form_for_any_value(
    template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether or not the renderer parses each row's URL, it renders what a parse of every row would
    give (the wire form, a fixed point of `wire_url`) and refuses exactly what that would refuse."""
    config = f'method: GET\nurl: "{template}"\nquery: {{ q: "{{b}}" }}\n'
    renderer = _renderer(config)
    with monkeypatch.context() as patched:  # the reference: the transport's parser asked of every row
        patched.setattr(request_module, "_sent_as_rendered", lambda url, query: False)
        parsing = _renderer(config)
    for a in TRICKY_VALUES:
        for b in ("b", *TRICKY_VALUES):
            record = _record(a=a, b=b)
            outcome = _outcome(renderer, record)
            assert outcome == _outcome(parsing, record), (a, b)
            assert outcome.startswith("refused: ") or wire_url(outcome) == outcome, (a, b)


def test_a_url_in_wire_form_is_not_parsed_per_row() -> None:
    assert _renderer('method: GET\nurl: "https://x.test/v1/{a}"\n')._url_sent_as_rendered
    for template in (
        "http://x.test:80/{a}",
        "https://x.test/%2{a}",
        "https://{a}.test/",
        "https://x.test/#{a}",
    ):
        assert not _renderer(f'method: GET\nurl: "{template}"\n')._url_sent_as_rendered, template


RENDER_SHAPES = [
    MIXED_BODY,
    "method: PUT\nurl: https://x.test/c/{id}\njson: { id: { from: id, type: integer }, e: { from: e } }\n",
    "method: POST\nurl: https://x.test/c/{id}/{e}\nquery: { q: '{e}' }\nheaders: { X-E: '{e}' }\n"
    "json: { from: e, type: json }\n",
    "method: POST\nurl: https://x.test/c/{id}\nform: { a: { from: e }, b: lit }\n",
    "method: POST\nurl: https://x.test/c/{id}\ncontent_type: text/plain\nbody: 'x={e}'\n",
    "method: DELETE\nurl: https://x.test/c/{id}\n",
]
RENDER_ROWS: list[dict[str, Any]] = [
    {"id": "17", "e": "e@x.test", "age": "42", "city": "Oslo", "zip": ""},
    {"id": "a.b", "e": '{"k": 1}', "age": " 7 ", "city": None, "zip": "0150"},
    {"id": "caf\u00e9", "e": "x\r\ny", "age": "4.5", "city": "c"},
    {"id": "", "e": "e", "age": None, "city": "c", "email": "e"},
    {"id": 5, "e": 2**70, "age": 42, "city": ["l"], "email": {"n": 1}},
    {"e": "e"},
    {"id": "..", "e": "e"},
    {"id": "1", "e": "e", "age": "\u00b2", "city": "c", "email": "e"},  # a digit, not an ASCII one
    {"id": "1", "e": "e", "age": "9223372036854775808", "city": "c", "email": "e"},
    {"id": "1", "e": "e", "age": "922337203685477580", "city": "c", "email": "e"},
]


def _rendered(renderer: RequestRenderer, fields: dict[str, Any]) -> PreparedRequest | str:
    try:
        return renderer.render(_record(**fields))
    except RenderError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("shape", RENDER_SHAPES)
def test_the_compiled_render_renders_and_refuses_as_the_reference_does(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer = _renderer(shape)
    with monkeypatch.context() as patched:  # no generated code at all: the reference closures
        patched.setattr(request_module._Generated, "define", lambda self, name, source: None)
        reference = _renderer(shape)
    for fields in RENDER_ROWS:
        assert _rendered(renderer, fields) == _rendered(reference, fields), fields
