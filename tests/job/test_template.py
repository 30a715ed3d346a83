"""Templates: parsing, field and secret discovery, rendering, secret lookup and redaction."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bulkrelay.errors import SecretMissing
from bulkrelay.job.template import (
    FieldRef,
    Redactor,
    RenderError,
    SecretRef,
    TemplateSyntaxError,
    compile_template,
    resolve_secrets,
)


def test_parts_fields_and_secrets() -> None:
    template = compile_template("${API_BASE}/customers/{customer_id}?x={{y}}")
    assert template.parts == (SecretRef("API_BASE"), "/customers/", FieldRef("customer_id"), "?x={y}")
    assert template.fields == {"customer_id"}
    assert template.secrets == {"API_BASE"}


def test_field_names_are_taken_verbatim() -> None:
    assert compile_template("{First Name}-{e-mail}").fields == {"First Name", "e-mail"}


def test_dollar_before_double_brace_is_literal() -> None:
    template = compile_template("cost: $5, ${{literal}}")
    assert template.parts == ("cost: $5, ${literal}",)


@pytest.mark.parametrize(
    ("source", "fragment", "column"),
    [
        ("https://x/{id", "unclosed '{'", 11),
        ("a}b", "single '}'", 2),
        ("x {} y", "empty field name", 3),
        ("Bearer ${api_token}", "invalid secret name 'api_token'", 8),
        ("Bearer ${TOKEN", "unclosed '${'", 8),
    ],
)
def test_syntax_errors_name_the_column(source: str, fragment: str, column: int) -> None:
    with pytest.raises(TemplateSyntaxError) as caught:
        compile_template(source)
    assert fragment in str(caught.value)
    assert caught.value.column == column


def test_render_substitutes_secrets_once_and_fields_per_record() -> None:
    bound = compile_template("Bearer ${TOKEN} for {user}").bind({"TOKEN": "s3cret"})
    assert bound.render({"user": "ada"}) == "Bearer s3cret for ada"
    assert bound.fields == {"user"}
    assert bound.constant is None
    assert compile_template("Bearer ${TOKEN}").bind({"TOKEN": "t"}).constant == "Bearer t"


def test_url_binding_percent_encodes_fields_but_not_secrets() -> None:
    bound = compile_template("${BASE}/c/{id}").bind({"BASE": "https://api.test/v1"}, url=True)
    assert bound.render({"id": "a/b c?d&é"}) == "https://api.test/v1/c/a%2Fb%20c%3Fd%26%C3%A9"


def test_url_refuses_an_empty_field() -> None:
    bound = compile_template("https://x.test/c/{id}").bind({}, url=True)
    with pytest.raises(RenderError) as caught:
        bound.render({"id": ""})
    assert caught.value.field == "id" and "empty" in caught.value.message


def test_missing_field_names_the_field() -> None:
    bound = compile_template("{a}-{b}").bind({})
    with pytest.raises(RenderError) as caught:
        bound.render({"a": "1"})
    assert caught.value.field == "b"
    assert "missing" in caught.value.message
    assert "'b'" in str(caught.value)


def test_typed_values_render_in_json_spelling() -> None:
    bound = compile_template("{i}|{f}|{b}|{o}").bind({})
    assert bound.render({"i": 42, "f": 1.5, "b": True, "o": {"k": [1]}}) == '42|1.5|true|{"k":[1]}'
    with pytest.raises(RenderError, match="null"):
        bound.render({"i": None, "f": 1, "b": False, "o": 1})


ONE_FIELD_VALUES = [
    "abc123",
    "ABC",
    "",
    ".",
    "..",
    "a.b",
    "a/b",
    "caf\u00e9",
    "\u00b2",
    "x y",
    "%2e",
    7,
    1.5,
    True,
    None,
]


@pytest.mark.parametrize("url", [False, True])
@pytest.mark.parametrize("value", ONE_FIELD_VALUES)
def test_a_one_field_template_renders_as_the_general_loop_does(url: bool, value: object) -> None:
    """A template with one field has a short way for plain values; it must agree with the long way."""
    bound = compile_template("https://x.test/c/{id}/x").bind({}, url=url)

    def outcome(render: Callable[[dict[str, object]], str], fields: dict[str, object]) -> str:
        try:
            return render(fields)
        except RenderError as exc:
            return f"refused: {exc}"

    for fields in ({"id": value}, {}):
        assert outcome(bound.render, fields) == outcome(bound._render_slots, fields)


def test_resolve_secrets_names_every_missing_variable() -> None:
    with pytest.raises(SecretMissing) as caught:
        resolve_secrets(["TOKEN", "B_SECRET", "PRESENT", "EMPTY"], {"PRESENT": "x", "EMPTY": ""})
    error = caught.value
    assert error.context == {"missing": ["B_SECRET", "EMPTY", "TOKEN"]}
    assert "B_SECRET, EMPTY, TOKEN" in error.message
    assert error.code == "SECRET_MISSING" and error.exit_code == 4


def test_resolve_secrets_returns_values() -> None:
    assert resolve_secrets(["A", "A"], {"A": "1", "B": "2"}) == {"A": "1"}
    assert resolve_secrets([], {}) == {}


def test_redactor_hides_raw_and_encoded_values_longest_first() -> None:
    redactor = Redactor(["tok", "tok+en/1", ""])
    text = "a tok+en/1 b tok%2Ben%2F1 c tok d"
    assert redactor.redact(text) == "a *** b *** c *** d"


def test_redactor_without_secrets_is_identity() -> None:
    assert Redactor([]).redact("nothing to hide") == "nothing to hide"
    assert Redactor([""]).redact("x") == "x"


def test_redactor_escapes_regex_characters() -> None:
    assert Redactor(["a.b*"]).redact("axb a.b*") == "axb ***"
