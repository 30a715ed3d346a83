"""Leaves beyond a field copy (job/values.py): format, transform, coalesce, when, datetime, decimal,
Liquid, and what a null does (`nulls`), each in request.json and in a batch item."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from textwrap import dedent
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ConfigInvalid, InputInvalid
from bulkrelay.job.config import JobConfig, RequestConfig, load_job, parse_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.job.records import Record
from bulkrelay.job.request import RenderError, RequestRenderer, json_renderer


def _request(json_tree: str, *, nulls: str | None = None) -> RequestConfig:
    head = "version: 1\nrequest:\n  method: PATCH\n  url: http://127.0.0.1/c\n"
    if nulls is not None:
        head += f"  nulls: {nulls}\n"
    tree = "\n".join("    " + line for line in dedent(json_tree).splitlines())
    return parse_job(head + "  json:\n" + tree + "\n", file="job.yaml").request


def _body(json_tree: str, fields: dict[str, Any], *, nulls: str | None = None) -> Any:
    renderer = RequestRenderer.from_config(_request(json_tree, nulls=nulls), {})
    body = renderer.render(Record(row_number=7, line=8, fields=fields)).body
    assert body is not None
    return orjson.loads(body)


def _raw_body(json_tree: str, fields: dict[str, Any]) -> bytes:
    body = RequestRenderer.from_config(_request(json_tree), {}).render(Record(1, 2, fields)).body
    assert body is not None
    return body


def _error(json_tree: str, fields: dict[str, Any], *, nulls: str | None = None) -> RenderError:
    with pytest.raises(RenderError) as caught:
        _body(json_tree, fields, nulls=nulls)
    return caught.value


def test_format_joins_fields_and_names_a_missing_one() -> None:
    assert _body('name: { format: "{first} {last}" }', {"first": "Ada", "last": "Lovelace"}) == {
        "name": "Ada Lovelace"
    }
    error = _error('name: { format: "{first} {last}" }', {"first": "Ada"})
    assert error.field == "last"
    assert "missing" in error.message


def test_transforms_apply_in_order() -> None:
    tree = """\
    a: { from: email, transform: [trim, lower] }
    b: { from: email, transform: [trim, lower, sha256] }
    c: { from: email, transform: [trim, md5] }
    d: { from: email, transform: [trim, upper, base64] }
    """
    out = _body(tree, {"email": "  Ada@Example.COM "})
    assert out == {
        "a": "ada@example.com",
        "b": hashlib.sha256(b"ada@example.com").hexdigest(),
        "c": hashlib.md5(b"Ada@Example.COM").hexdigest(),
        "d": base64.b64encode(b"ADA@EXAMPLE.COM").decode(),
    }


def test_coalesce_takes_the_first_present_non_null_non_empty_value() -> None:
    tree = "phone: { coalesce: [ { from: mobile }, { from: phone }, { value: none } ] }"
    assert _body(tree, {"mobile": "", "phone": "555"}) == {"phone": "555"}
    assert _body(tree, {"phone": None}) == {"phone": "none"}
    assert _body(tree, {"mobile": "1", "phone": "2"}) == {"phone": "1"}
    nothing = "phone: { coalesce: [ { from: mobile } ], default: unknown }"
    assert _body(nothing, {}) == {"phone": "unknown"}
    assert _body("phone: { coalesce: [ { from: mobile } ] }", {}) == {"phone": None}


@pytest.mark.parametrize(
    ("test", "fields", "chosen"),
    [
        ("{ field: spend, above: 1000 }", {"spend": "1500.5"}, "gold"),
        ("{ field: spend, above: 1000 }", {"spend": "1000"}, "standard"),
        ("{ field: spend, above: 1000 }", {"spend": ""}, "standard"),
        ("{ field: spend, below: 10 }", {"spend": 9}, "gold"),
        ("{ field: plan, equals: pro }", {"plan": "pro"}, "gold"),
        ("{ field: plan, equals: 5 }", {"plan": "5"}, "gold"),
        ("{ field: plan, equals: true }", {"plan": 1}, "standard"),
        ("{ field: plan, in: [a, b] }", {"plan": "b"}, "gold"),
        ("{ field: plan, in: [a, b] }", {}, "standard"),
        ("{ field: plan, present: true }", {"plan": "x"}, "gold"),
        ("{ field: plan, present: true }", {"plan": ""}, "standard"),
        ("{ field: plan, present: false }", {"plan": None}, "gold"),
    ],
)
def test_when_chooses_then_or_else(test: str, fields: dict[str, Any], chosen: str) -> None:
    tree = f"tier: {{ when: {test}, then: {{ value: gold }}, else: {{ value: standard }} }}"
    assert _body(tree, fields) == {"tier": chosen}


def test_when_without_else_is_null_and_a_bad_number_is_named() -> None:
    tree = "tier: { when: { field: spend, above: 1 }, then: { from: spend, type: number } }"
    assert _body(tree, {"spend": "0"}) == {"tier": None}
    assert _body(tree, {"spend": "2"}) == {"tier": 2}
    error = _error(tree, {"spend": "lots"})
    assert (error.field, error.message) == ("spend", "'lots' is not a number (when: above)")


PARIS = 'in_format: "%Y-%m-%d %H:%M:%S", timezone: Europe/Paris'


@pytest.mark.parametrize(
    ("options", "value", "sent"),
    [
        (f"{PARIS}, to: epoch_ms", "2024-03-01 10:00:00", 1709283600000),  # winter: UTC+1
        (f"{PARIS}, to: epoch_ms", "2024-07-01 10:00:00", 1719820800000),  # summer: UTC+2
        ("to: epoch_s", "2024-03-01T09:00:00Z", 1709283600),
        ("timezone: America/New_York", "2024-03-01T09:00:00Z", "2024-03-01T04:00:00-05:00"),
        ("to: date, timezone: Asia/Tokyo", "2024-03-01T20:00:00+00:00", "2024-03-02"),
        ('in_format: "%d/%m/%Y", to: "%Y%m%d"', "05/01/2024", "20240105"),
        ("in_format: epoch_ms", "1709283600123", "2024-03-01T09:00:00.123000+00:00"),
        ("in_format: epoch_s, to: epoch_ms", 1709283600, 1709283600000),
        ("{}", "2024-03-01", "2024-03-01T00:00:00+00:00"),
    ],
)
def test_datetime_reads_converts_and_writes(options: str, value: Any, sent: Any) -> None:
    options = "" if options == "{}" else ", " + options
    assert _body(f"at: {{ from: at, type: datetime{options} }}", {"at": value}) == {"at": sent}


def test_a_date_that_does_not_parse_is_named_with_its_value() -> None:
    error = _error('at: { from: at, type: datetime, in_format: "%Y-%m-%d" }', {"at": "2024-13-45"})
    assert error.field == "at"
    assert error.message == "'2024-13-45' is not a date and time (in_format '%Y-%m-%d')"


@pytest.mark.parametrize(
    ("options", "value"),
    [
        ("timezone: Pacific/Kiritimati", "9999-12-31T23:59:59Z"),  # written in +14:00: year 10000
        ("timezone: America/Los_Angeles", "0001-01-01T00:00:00Z"),  # written in -08:00: year 0
        ("timezone: America/Los_Angeles, to: date", "0001-01-01T00:00:00Z"),
        ('timezone: America/Los_Angeles, to: "%Y"', "0001-01-01T00:00:00Z"),
        ("in_format: epoch_ms, timezone: America/Los_Angeles", "-62135596800000"),
        ('in_format: "%Y-%m-%d %z"', "0001-01-01 +0100"),
        ("in_format: epoch_s", "1e20"),
    ],
)
def test_a_date_beyond_the_years_1_to_9999_is_named_with_its_value(options: str, value: str) -> None:
    error = _error(f"at: {{ from: at, type: datetime, {options} }}", {"at": value})
    assert error.field == "at"
    assert error.message.startswith(f"{value!r} is ")
    assert "out of range" in error.message or "is not a date and time" in error.message


def test_an_epoch_of_a_million_digits_is_refused_at_once() -> None:
    """`int()` of such a number took 39 s of one CPU for one row (no timed assertion: a loaded machine
    would make one flaky; a regression shows as this test's own minutes)."""
    error = _error("at: { from: at, type: datetime, in_format: epoch_s }", {"at": "1e999990"})
    assert error.message == "'1e999990' is not a date and time (in_format 'epoch_s')"


def test_a_year_before_1000_is_written_with_four_digits() -> None:
    """glibc's strftime writes year 999 as `999`, which no reader takes for a year of ISO 8601."""
    tree = 'at: { from: at, type: datetime, to: "%Y-%m-%d %G 100%%Y" }'
    assert _body(tree, {"at": "0999-03-01"}) == {"at": "0999-03-01 0999 100%Y"}


def test_a_when_above_that_meets_no_finite_number_is_named() -> None:
    tree = "t: { when: { field: n, above: 3 }, then: { value: 1 } }"
    for bad in ("NaN", "sNaN", "-Infinity", float("nan")):
        error = _error(tree, {"n": bad})
        assert error.field == "n"
        assert error.message.endswith("is not a finite number (when: above)")


def test_decimal_keeps_the_digits_of_the_text() -> None:
    tree = "price: { from: price, type: decimal }"
    assert _raw_body(tree, {"price": "12.50"}) == b'{"price":12.50}'
    assert _raw_body(tree, {"price": "+007.100"}) == b'{"price":7.100}'
    assert _raw_body(tree, {"price": "-.5e3"}) == b'{"price":-0.5e3}'
    assert _raw_body(tree, {"price": "12345678901234567890.000000001"}) == (
        b'{"price":12345678901234567890.000000001}'
    )
    assert _raw_body(tree, {"price": 3}) == b'{"price":3}'
    for bad in ("1,5", "abc", ".", "NaN", True):
        assert "is not a decimal number" in _error(tree, {"price": bad}).message


def test_a_decimal_is_within_the_range_a_double_reads_as_type_number_is() -> None:
    tree = "price: { from: price, type: decimal }"
    for within in ("1.7976931348623157e308", "-1e308", "1e-308", "0e-999999999", "0.000"):
        assert _raw_body(tree, {"price": within}) == b'{"price":' + within.encode() + b"}"
    too_small = "0." + "0" * 400 + "1"
    for beyond in ("1e400", "1e999999999", "-1.8e308", "1e-400", "1e-999999999", "9" * 400, too_small):
        error = _error(tree, {"price": beyond})
        assert error.message.endswith("is beyond the range of a double (1e-308 to 1.8e308, or 0)"), error
    for infinite in (float("inf"), float("nan")):  # a float from a query or a Parquet file
        assert _error(tree, {"price": infinite}).message == f"{infinite} is not a finite number"
    assert "is not a finite number" in _error("n: { from: n, type: number }", {"n": "1e400"}).message


@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, "true"), ({"a": None}, '{"a":null}'), ([1, "x"], '[1,"x"]'), (False, "false")],
)
def test_a_value_that_does_not_fit_is_shown_as_json_spells_it(value: Any, shown: str) -> None:
    error = _error("at: { from: at, type: datetime }", {"at": value})
    assert error.message == f"{shown} is not a date and time (ISO 8601)"
    assert _error("d: { from: d, type: decimal }", {"d": value}).message.startswith(shown)


def test_liquid_renders_strictly_and_its_text_can_be_typed() -> None:
    tree = """\
    label: { liquid: "{{ first | capitalize }} from {{ city | default: 'nowhere' }}" }
    count: { liquid: "{{ a | plus: b }}", type: integer }
    """
    assert _body(tree, {"first": "ada", "city": None, "a": 2, "b": 3}) == {
        "label": "Ada from nowhere",
        "count": 5,
    }
    error = _error(tree, {"city": "x", "a": 1, "b": 1})
    assert error.field == "label"
    assert "'first' is undefined" in error.message


def test_a_liquid_error_names_the_leafs_place_in_the_body() -> None:
    tree = """\
    first: { liquid: "{{ a }}" }
    nested:
      second: { liquid: "{{ b }}" }
      third: { when: { field: a, present: true }, then: { liquid: "{{ c }}" } }
    """
    assert _error(tree, {"b": 1, "c": 1}).field == "first"
    assert _error(tree, {"a": 1, "c": 1}).field == "nested.second"
    assert _error(tree, {"a": 1, "b": 1}).field == "nested.third"
    assert _error('{ liquid: "{{ x | plus: 1 }}", type: integer }', {}).field == "liquid"  # the whole body


@pytest.mark.parametrize("when", ["now", "today"])
def test_liquid_dates_are_made_of_the_row_alone_never_of_the_clock(when: str) -> None:
    """A body that changes from one send to the next changes its idempotency key: a row sent again after
    a kill -9 would be a new request to the target, applied twice."""
    error = _error(f"t: {{ liquid: \"{{{{ '{when}' | date: '%Y-%m-%d' }}}}\" }}", {})
    assert error.field == "t"
    assert f"'{when}'" in error.message and "the row" in error.message


@pytest.mark.slow  # a process of its own for each time zone: a zone set within one is not read again
def test_liquid_reads_an_epoch_in_utc_whatever_the_hosts_time_zone() -> None:
    """A resume under another TZ (cron's, a terminal's) must send the body the first call sent."""
    script = (
        "from bulkrelay.job.liquidtext import compile_liquid, render_liquid\n"
        "t = compile_liquid(\"{{ at | date: '%Y-%m-%d %H:%M' }}\")\n"
        "print(render_liquid(t, {'at': 1700000000}), render_liquid(t, {'at': '1700000000'}))\n"
    )
    made = {
        subprocess.run(
            [sys.executable, "-c", script], env={**os.environ, "TZ": zone}, capture_output=True, check=True
        ).stdout
        for zone in ("UTC", "Pacific/Kiritimati", "America/Los_Angeles")
    }
    assert made == {b"2023-11-14 22:13 2023-11-14 22:13\n"}


def test_liquid_reads_no_file() -> None:
    tree = "t: { liquid: \"{% include '/etc/passwd' %}\" }"
    error = _error(tree, {})
    assert "template not found" in error.message


def test_a_liquid_syntax_error_is_a_job_file_error_at_its_line() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        _request('t: { liquid: "{{ x " }')
    (problem,) = caught.value.problems
    assert problem.path == "request.json.t.liquid"
    assert problem.line == 6


def test_nulls_omit_drops_the_key_send_sends_null_fail_refuses() -> None:
    tree = "a: { from: a }\nb: { from: b, type: integer }\nc: { from: c, nulls: send }"
    row = {"a": None, "b": "", "c": None}
    assert _body(tree, row, nulls="omit") == {"c": None}
    assert _body(tree, {"a": 1, "b": "2", "c": None}, nulls="omit") == {"a": 1, "b": 2, "c": None}
    assert _body(tree, row, nulls="send") == {"a": None, "b": None, "c": None}
    error = _error(tree, row, nulls="fail")
    assert (error.field, error.message) == ("a", "is null (nulls: fail)")


def test_without_nulls_a_typed_null_is_still_an_error() -> None:
    error = _error("b: { from: b, type: integer }", {"b": None})
    assert error.message.startswith("is null; type integer needs a value")
    assert _body("a: { from: a }", {"a": None}) == {"a": None}


def test_nulls_omit_reaches_the_leaves_inside_when_and_coalesce() -> None:
    tree = """\
    t: { when: { field: x, present: true }, then: { from: x } }
    u: { coalesce: [ { from: y } ] }
    v: { format: "{x}", nulls: send }
    """
    assert _body(tree, {"x": "1"}, nulls="omit") == {"t": "1", "v": "1"}


def test_an_object_whose_every_key_is_omitted_is_sent_as_an_empty_object() -> None:
    """Decided (issue 38, item 14): the object the job writes is sent, as `{}` (docs/configuration.md)."""
    tree = "id: { value: 1 }\naddress: { city: { from: city }, zip: { from: zip, when_missing: omit } }"
    assert _body(tree, {"city": None}, nulls="omit") == {"id": 1, "address": {}}
    dropped = "address: { when: { field: city, present: true }, then: { city: { from: city } } }"
    assert _body(dropped, {"city": None}, nulls="omit") == {}


def _omitting_post(rest: str) -> JobConfig:
    """A POST job with `nulls: omit` and `rest` (YAML under `request:`)."""
    head = "version: 1\nrequest:\n  method: POST\n  url: http://127.0.0.1/x\n  nulls: omit\n"
    return parse_job(head + "\n".join("  " + line for line in dedent(rest).splitlines()), file="job.yaml")


def test_a_batch_item_takes_the_same_leaves_and_the_jobs_nulls() -> None:
    config = _omitting_post("""\
        batch:
          max_items: 10
          item: { email: { from: email, transform: [lower] }, note: { from: note } }
        """)
    assert config.request.batch is not None and config.request.batch.item is not None
    render = json_renderer(config.request.batch.item, nulls=config.request.nulls)  # type: ignore[arg-type]
    assert orjson.loads(render({"email": "A@B", "note": None})) == {"email": "a@b"}


def test_the_typed_options_leave_old_fingerprints_alone() -> None:
    request = _request("a: { from: a, type: integer }")
    dumped = request.model_dump(mode="json", by_alias=True)
    assert dumped["json"] == {"a": {"from": "a", "type": "integer"}}
    assert "nulls" not in dumped


@pytest.mark.parametrize(
    ("leaf", "message"),
    [
        ("{ from: a, to: epoch_ms }", "to is for type: datetime"),
        ("{ from: a, type: datetime, timezone: Mars/Olympus }", "is not an IANA time zone"),
        ("{ from: a, type: datetime, timezone: localtime }", "is the host's zone"),
        ("{ when: { field: a }, then: { value: 1 } }", "exactly one of equals, in, present, above, below"),
        ('{ format: "${TOKEN}" }', "json values are literal"),
        ("{ from: a, transform: [rot13] }", "'trim', 'lower', 'upper', 'sha256', 'md5' or 'base64'"),
        ("{ coalesce: [] }", "at least 1 item"),
        ('{ from: a, type: datetime, to: "%Y\\uDCFF" }', "is not a strftime format"),
    ],
)
def test_a_bad_leaf_is_refused_when_the_job_is_loaded(leaf: str, message: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        _request(f"x: {leaf}")
    assert message in str(caught.value)


def test_liquid_loops_are_bounded() -> None:
    nested = "{% for i in (1..200) %}{% for j in (1..200) %}{% endfor %}{% endfor %}"  # 40,000 turns
    error = _error(f't: {{ liquid: "{nested}" }}', {})
    assert "loop iteration limit reached" in error.message


@pytest.mark.parametrize(
    "template",
    [
        "{{ (1..3000000) | join | size }}",  # built 22 MB before its size was taken
        "{{ (1..n) | size }}",
        "{% if (1..n) contains 'a' %}a{% endif %}",  # a text in a range: Python walks every number
        "{% assign r = (1..n) %}{{ r | map: 'x' | size }}",
    ],
)
def test_a_range_longer_than_a_loop_may_turn_is_refused(template: str) -> None:
    error = _error(f't: {{ liquid: "{template}" }}', {"n": "2000000"})
    assert "range limit reached" in error.message
    assert "more than 10,000 items" in error.message


def test_a_range_a_loop_may_turn_is_made() -> None:
    tree = "t: { liquid: \"{{ (1..10000) | size }} {{ (n..3) | join: ',' }}\" }"
    assert _body(tree, {"n": "-1"}) == {"t": "10000 -1,0,1,2,3"}


@pytest.mark.parametrize(
    "template",
    [
        "{{ s | split: '' | join: s | size }}",  # 2,000 items joined by 2,000 characters: 4 million
        "{{ s | replace: 'x', s | size }}",  # each of 2,000 characters made 2,000
        "{{ s | replace: '', s | size }}",
        "{{ s | append: s | append: s | append: s | append: s | append: s | size }}",
        # A list of the same text eight times: little to the namespace limit, eight times the text to join.
        "{% assign l = s | split: ',' %}{% for i in (1..3) %}{% assign l = l | concat: l %}{% endfor %}",
    ],
)
def test_a_filter_that_would_make_a_value_past_the_limit_is_refused(template: str) -> None:
    fields = {"s": "x" * (2_000 if "join" in template or "replace" in template else 20_000)}
    error = _error(f't: {{ liquid: "{template}" }}', fields)
    assert "value limit reached" in error.message
    assert "more than 100,000 characters" in error.message


def test_filters_within_the_limits_render_as_before() -> None:
    template = "{{ s | split: ',' | join: '; ' | upcase }}|{{ s | replace: ',', '--' }}|{{ l | sort | last }}"
    assert _body(f't: {{ liquid: "{template}" }}', {"s": "a,b", "l": [3, 1, 2]}) == {"t": "A; B|a--b|3"}


def test_a_form_takes_the_same_leaves_as_text() -> None:
    config = _omitting_post("""\
        form:
          email: { from: email, transform: [trim, lower] }
          name: { format: "{first} {last}" }
          price: { from: price, type: decimal }
          day: { from: at, type: datetime, to: date }
          note: { from: note }
          plain: { from: first }
        """)
    renderer = RequestRenderer.from_config(config.request, {})
    row = {
        "email": " A@B.C ",
        "first": "Ada",
        "last": "L",
        "price": "1.50",
        "at": "2024-03-01T10:00Z",
        "note": None,
    }
    body = renderer.render(Record(1, 2, row)).body
    assert body == b"email=a%40b.c&name=Ada+L&price=1.50&day=2024-03-01&plain=Ada"
    assert config.model_dump(by_alias=True)["request"]["form"]["plain"] == {"from": "first"}


@pytest.mark.parametrize(
    ("in_format", "texts"),
    [
        (
            "%Y-%m-%d %H:%M:%S",
            ["2024-03-01 10:00:00", "2024-3-1 1:2:3", "2024-03-01  10:00:00", "2024-02-30 10:00:00"],
        ),
        (
            "%Y-%m-%dT%H:%M:%S",
            ["2024-03-01T10:00:00", "2024-03-01 10:00:00", "2024-W09-5T10:00:00", "2024-03-01T10:00:00Z"],
        ),
        (
            "%Y-%m-%d",
            ["2024-03-01", "2024-W09-5", "20240301", "2024-3-01"],
        ),
        ("%d/%m/%Y", ["05/01/2024", "5/1/2024", "31/04/2024", "05-01-2024", "05/01/2024 "]),
        ("%Y%m%d", ["20240105", "2024015", "2024-01-05"]),
        ("100%% %Y.%m.%d", ["100% 2024.01.05", "100%% 2024.01.05"]),
    ],
)
def test_a_numeric_in_format_reads_as_strptime_does(in_format: str, texts: list[str]) -> None:
    """Such formats take a faster reader than strptime (job/values.py): the same dates, the same refusals."""
    tree = f"at: {{ from: at, type: datetime, in_format: {orjson.dumps(in_format).decode()} }}"
    for text in texts:
        try:
            expected: Any = datetime.strptime(text.strip(), in_format).replace(tzinfo=UTC).isoformat()
        except ValueError:
            expected = None
        if expected is None:
            assert "is not a date and time" in _error(tree, {"at": text}).message
        else:
            assert _body(tree, {"at": text}) == {"at": expected}, text


def test_a_bad_value_that_holds_a_secret_is_named_redacted(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"id": 1, "at": "tok-5ecr3t-value"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(
        "version: 1\ninput: { file: rows.jsonl }\nrequest:\n  method: POST\n  url: http://127.0.0.1/x\n"
        '  headers: { Authorization: "Bearer ${API_TOKEN}" }\n'
        "  json: { at: { from: at, type: datetime } }\n"
    )
    with pytest.raises(InputInvalid) as caught:
        run_preflight(load_job(job), env={"API_TOKEN": "tok-5ecr3t-value"})
    (problem,) = caught.value.problems
    assert (problem.row, problem.field) == (1, "at")
    assert problem.message == "'***' is not a date and time (ISO 8601)"
