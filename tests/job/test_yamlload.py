"""The strict YAML loader: plain values, line numbers, and every YAML-only value refused with its line."""

from __future__ import annotations

import pytest

from bulkrelay.errors import ConfigInvalid
from bulkrelay.job.yamlload import LineMap, format_path, load_yaml


def _problem(text: str) -> tuple[str, int | None, str | None]:
    with pytest.raises(ConfigInvalid) as caught:
        load_yaml(text, "job.yaml")
    first = caught.value.problems[0]
    assert first.file == "job.yaml"
    return first.message, first.line, first.path


def test_plain_values_and_lines() -> None:
    text = "a: 1\nb:\n  c: [1, 2.5]\n  d: x\ne: true\nf: ~\ng: '2026-01-01'\n"
    value, lines = load_yaml(text, "job.yaml")
    assert value == {"a": 1, "b": {"c": [1, 2.5], "d": "x"}, "e": True, "f": None, "g": "2026-01-01"}
    assert lines.line(("b", "d")) == 4
    assert lines.line(("b", "c", 1)) == 3
    assert lines.line(("g",)) == 7


def test_line_of_a_missing_path_is_its_nearest_parent() -> None:
    lines = LineMap({(): 1, ("request",): 3, ("request", "json"): 5})
    assert lines.line(("request", "json", "age", "type")) == 5
    assert lines.line(("other",)) == 1


def test_format_path() -> None:
    assert format_path(("request", "json", "age")) == "request.json.age"
    assert format_path(("retry", "statuses", 2)) == "retry.statuses[2]"
    assert format_path(()) == ""


def test_duplicate_key_names_both_lines() -> None:
    message, line, path = _problem("request:\n  method: GET\n  url: x\n  method: POST\n")
    assert line == 4
    assert path == "request.method"
    assert "duplicate key 'method'" in message and "line 2" in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("when: 2026-01-01\n", "date"),
        ("when: 2026-01-01T10:00:00Z\n", "date"),
        ("rate: .inf\n", "finite"),
        ("rate: -.Inf\n", "finite"),
        ("rate: .nan\n", "finite"),
        ("flag: yes\n", "YAML 1.1 boolean"),
        ("flag: off\n", "YAML 1.1 boolean"),
        ("mode: 0755\n", "octal"),
        ("time: 1:30\n", "base-60"),
        ("count: 9223372036854775808\n", "64-bit"),
        ("count: -9223372036854775809\n", "64-bit"),
        ("data: !!binary aGk=\n", "binary"),
        ("thing: !custom 1\n", "tag"),
    ],
)
def test_yaml_only_scalars_are_refused(text: str, fragment: str) -> None:
    message, line, path = _problem("version: 1\n" + text)
    assert fragment in message
    assert "quote it" in message
    assert line == 2
    assert path == text.split(":", maxsplit=1)[0]


def test_sets_and_merge_keys_and_aliases_are_refused() -> None:
    assert "set" in _problem("a: !!set {x, y}\n")[0]
    assert "merge keys" in _problem("base: {a: 1}\nother:\n  <<: {a: 2}\n")[0]
    message, line, _ = _problem("a: &anchor 1\nb: *anchor\n")
    assert "anchors and aliases" in message and line == 1


def test_non_string_keys_are_refused() -> None:
    message, line, _ = _problem("query:\n  1: one\n")
    assert "keys must be strings" in message and line == 2


def test_every_problem_is_reported() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load_yaml("a: yes\nb: .inf\nc: 1\nc: 2\n", "job.yaml")
    assert [p.line for p in caught.value.problems] == [1, 2, 4]


def test_syntax_error_names_the_line() -> None:
    message, line, _ = _problem("request:\n  method: POST\n  url: [unclosed\n")
    assert message.startswith("invalid YAML")
    assert line == 4


def test_a_tab_indent_is_a_syntax_error() -> None:
    message, line, _ = _problem("request:\n\tmethod: POST\n")
    assert message.startswith("invalid YAML") and line == 2


@pytest.mark.parametrize("character", ["\x00", "\x07", "\ufffe"])
def test_a_character_yaml_does_not_allow_names_its_line(character: str) -> None:
    message, line, _ = _problem(f"version: 1\nname: a{character}b\n")
    assert line == 2
    assert f"U+{ord(character):04X}" in message and "not allowed" in message


def test_two_documents_are_refused() -> None:
    assert "single document" in _problem("a: 1\n---\nb: 2\n")[0]


def test_empty_document_is_none() -> None:
    assert load_yaml("", "job.yaml")[0] is None
    assert load_yaml("# only a comment\n", "job.yaml")[0] is None


def test_the_64_bit_integer_range_is_accepted_to_its_ends() -> None:
    value, _ = load_yaml("low: -9223372036854775808\nhigh: 9223372036854775807\n", "job.yaml")
    assert value == {"low": -(2**63), "high": 2**63 - 1}


def test_quoted_and_explicit_strings_stay_strings() -> None:
    value, _ = load_yaml("a: 'yes'\nb: \"2026-01-01\"\nc: !!str 0755\nd: '.inf'\n", "job.yaml")
    assert value == {"a": "yes", "b": "2026-01-01", "c": "0755", "d": ".inf"}


@pytest.mark.parametrize("word", ["on", "On", "ON", "off", "yes", "No", "y", "N"])
def test_a_plain_yaml_11_boolean_word_as_a_key_is_that_text(word: str) -> None:
    value, lines = load_yaml(f"notify:\n  - {word}: [failure, halt]\n    webhook: x\n", "job.yaml")
    assert value == {"notify": [{word: ["failure", "halt"], "webhook": "x"}]}
    assert lines.line(("notify", 0, word)) == 2


@pytest.mark.parametrize("word", ["on", "yes", "off", "No"])
def test_a_yaml_11_boolean_word_as_a_value_is_still_refused(word: str) -> None:
    message, line, path = _problem(f"execution:\n  pin_cpu: {word}\n")
    assert "YAML 1.1 boolean" in message and (line, path) == (2, "execution.pin_cpu")


def test_true_as_a_key_is_still_not_a_string() -> None:
    message, line, _ = _problem("true: 1\n")
    assert "mapping keys must be strings" in message and line == 1
