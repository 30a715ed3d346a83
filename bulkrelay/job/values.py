"""The values of a request's leaves beyond a field copy: each compiled once per job into a getter.

A getter takes a record's fields and returns the leaf's value, or `OMIT` (its key is left out of its
object), or raises `RenderError` naming the field and the value that does not fit. Preflight renders
every row through the same getters the relay sends with, so every value is checked before anything
is sent. A leaf is made in three steps:

    source     from (as request.py reads it), format, coalesce, when/then/else, liquid
    nulls      a null (or, for a typed leaf, an empty text) is omitted, sent or refused (`nulls`)
    finish     `transform` in order, then `type` (request.py's plain types, datetime, decimal)

A plain `{from: ...}` or `{value: ...}` never comes here: request.py keeps its fast paths for them
(`is_plain`). A new kind of leaf is one more entry of `_SOURCES`.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from functools import reduce
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

import orjson
from typing_extensions import TypeIs

from bulkrelay.job.config import (
    CoalesceLeaf,
    Condition,
    FormatLeaf,
    FormField,
    JsonField,
    JsonLookup,
    JsonNode,
    JsonValue,
    KindLeaf,
    LiquidLeaf,
    Nulls,
    RowsLeaf,
    WhenLeaf,
    _Typed,
)
from bulkrelay.job.liquidtext import LiquidProblem, compile_liquid, render_liquid
from bulkrelay.job.template import RenderError, compile_template, value_text

__all__ = [
    "OMIT",
    "ROWS_MARKER",
    "LeafParts",
    "form_getter",
    "is_plain",
    "leaf_getter",
    "may_omit",
    "with_nulls",
]

Fields = Mapping[str, Any]
Getter = Callable[[Fields], Any]
Coercer = Callable[[str, Any], Any]

OMIT: Any = object()  # a leaf that sends nothing: its key is left out of its object
# Where a grouped job's `{rows: ...}` list goes in a row's body: job/groups.py puts the group's entries there.
ROWS_MARKER = "\0bulkrelay-rows\0"
_ABSENT = object()
_NULLISH_TYPES = frozenset({"integer", "number", "boolean", "datetime", "decimal"})  # "" is no value
_DECIMAL = re.compile(r"([+-]?)0*([0-9]*)(?:\.([0-9]*))?([eE][+-]?[0-9]+)?")
_DIGIT = re.compile(r"[0-9]")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# Microseconds from the epoch beyond any datetime's (years 1 to 9999 are within ±3.2e17): refused before
# `int()`, which takes 39 s of a CPU to make the integer of an epoch written `1e999990`.
_EPOCH_MICROS_BEYOND = Decimal(10) ** 18


class LeafParts(NamedTuple):
    """What request.py lends the leaves: how it reads a `{from: ...}` as written (absence, pointer,
    default, `when_missing`), its plain types' coercers, and the getter of any tree (then/else objects)
    at a place in the body (`nested.key`, which names a Liquid leaf in its errors)."""

    read: Callable[[JsonField], Getter]
    coercers: Mapping[str, Coercer]
    node: Callable[[JsonNode, str], Getter]


def is_plain(node: JsonNode) -> TypeIs[JsonField | JsonValue | dict[str, JsonNode]]:
    """A node request.py renders itself: an object, a `{value: ...}`, a `{from: ...}` with at most a plain
    type, a default and a `when_missing`. (False also for a `{from: ...}` that needs more: the type
    checker then takes it for one of the other kinds, which only `leaf_getter` is given.)"""
    if isinstance(node, dict | JsonValue):
        return True
    if isinstance(node, JsonField):
        return not node.transform and node.nulls is None and node.type not in ("datetime", "decimal")
    return False


def may_omit(node: JsonNode) -> bool:
    """Whether the node's value may be `OMIT` (its object cannot then be one dict display)."""
    if isinstance(node, JsonField) and node.when_missing == "omit":
        return True
    if isinstance(node, WhenLeaf):
        branches = (node.then,) if node.else_ is None else (node.then, node.else_)
        return node.nulls == "omit" or any(may_omit(branch) for branch in branches)
    return isinstance(node, _Typed) and node.nulls == "omit"


def with_nulls(node: JsonNode, nulls: Nulls | None) -> JsonNode:
    """The tree with `request.nulls` given to every leaf that does not set its own."""
    if nulls is None or isinstance(node, JsonValue | JsonLookup):  # a lookup's miss is its on_miss
        return node
    if isinstance(node, dict):
        return {key: with_nulls(child, nulls) for key, child in node.items()}
    if isinstance(node, RowsLeaf):
        return node.model_copy(update={"rows": with_nulls(node.rows, nulls)})
    update: dict[str, Any] = {"nulls": nulls} if node.nulls is None else {}
    if isinstance(node, WhenLeaf):
        update["then"] = with_nulls(node.then, nulls)
        update["else_"] = None if node.else_ is None else with_nulls(node.else_, nulls)
    elif isinstance(node, CoalesceLeaf):
        update["coalesce"] = tuple(with_nulls(child, nulls) for child in node.coalesce)
    return node.model_copy(update=update)


def leaf_getter(leaf: JsonNode, parts: LeafParts, path: str = "") -> Getter:
    """The leaf's getter (a node `is_plain` refuses): its source, then what a null does, then its
    transforms and type. A `{rows: ...}` stands in as `ROWS_MARKER`. `path` is its place in the body
    (`nested.key`; "" for the whole body)."""
    if isinstance(leaf, RowsLeaf):
        return lambda fields: ROWS_MARKER
    assert isinstance(leaf, _Typed), leaf
    source, name = _SOURCES[type(leaf)](leaf, parts, path)
    finish = _finisher(leaf, name, parts)

    def get(fields: Fields) -> Any:
        value = source(fields)
        return value if value is OMIT else finish(value)

    return get


def form_getter(
    leaf: FormField | KindLeaf, nulls: Nulls | None, parts: LeafParts, path: str = ""
) -> Callable[[Fields], Any]:
    """A form value's getter: the leaf's value as text, or `OMIT`; a `null` cannot be sent in a form."""
    as_json = (
        JsonField.model_validate(leaf.model_dump(by_alias=True)) if isinstance(leaf, FormField) else leaf
    )
    get = leaf_getter(with_nulls(as_json, nulls), parts, path)
    name = leaf.from_ if isinstance(leaf, FormField) else "form"

    def text(fields: Fields) -> Any:
        value = get(fields)
        if value is OMIT or type(value) is str:
            return value
        if value is None:
            raise RenderError(name, "is null, which a form cannot send (nulls: omit leaves it out)")
        return value_text(name, value)  # a decimal's Fragment too: its JSON text is its digits

    return text


# --- sources ---------------------------------------------------------------------------------


def _from_source(leaf: Any, parts: LeafParts, path: str) -> tuple[Getter, str]:
    as_written = leaf.model_copy(update={"type": None, "transform": (), "nulls": None})
    return parts.read(as_written), leaf.from_


def _format_source(leaf: Any, parts: LeafParts, path: str) -> tuple[Getter, str]:
    template = compile_template(leaf.format).bind({})
    return template.render, min(template.fields, default="format")


def _coalesce_source(leaf: Any, parts: LeafParts, path: str) -> tuple[Getter, str]:
    # A `{from: ...}` among the choices may be absent: that only passes to the next choice.
    choices = tuple(parts.node(_absent_omitted(child), path) for child in leaf.coalesce)
    fallback = leaf.default

    def get(fields: Fields) -> Any:
        for choice in choices:
            value = choice(fields)
            if value is not OMIT and value is not None and value != "":
                return value
        return fallback

    return get, "coalesce"


def _absent_omitted(node: JsonNode) -> JsonNode:
    if isinstance(node, JsonField) and not node.optional:
        return node.model_copy(update={"when_missing": "omit"})
    return node


def _when_source(leaf: Any, parts: LeafParts, path: str) -> tuple[Getter, str]:
    test = _test(leaf.when)
    then = parts.node(leaf.then, path)
    otherwise = parts.node(leaf.else_, path) if leaf.else_ is not None else (lambda fields: None)

    def get(fields: Fields) -> Any:
        return then(fields) if test(fields) else otherwise(fields)

    return get, leaf.when.field


def _liquid_source(leaf: Any, parts: LeafParts, path: str) -> tuple[Getter, str]:
    template = compile_liquid(leaf.liquid)
    name = path or "liquid"  # its place in the body: two Liquid leaves are told apart

    def get(fields: Fields) -> str:
        try:
            return render_liquid(template, fields)
        except (LiquidProblem, ArithmeticError, TypeError, ValueError) as exc:
            message = str(exc) if isinstance(exc, LiquidProblem) else f"{type(exc).__name__}: {exc}"
            raise RenderError(name, f"Liquid fails: {message}") from None

    return get, name


_SOURCES: dict[type[_Typed], Callable[[Any, LeafParts, str], tuple[Getter, str]]] = {
    JsonField: _from_source,
    FormatLeaf: _format_source,
    CoalesceLeaf: _coalesce_source,
    WhenLeaf: _when_source,
    LiquidLeaf: _liquid_source,
}


# --- when: tests -----------------------------------------------------------------------------


_TESTS = ("equals", "in_", "present", "above", "below")


def _test(condition: Condition) -> Callable[[Fields], bool]:
    name = condition.field
    test = next(key for key in _TESTS if key in condition.model_fields_set)
    if test == "present":
        wanted = condition.present
        return lambda fields: (fields.get(name) not in (None, "")) is wanted
    if test in ("equals", "in_"):
        choices = (condition.equals,) if test == "equals" else condition.in_ or ()
        return lambda fields: name in fields and any(_same(fields[name], choice) for choice in choices)
    limit = Decimal(str(condition.above if test == "above" else condition.below))
    above = test == "above"

    def compare(fields: Fields) -> bool:
        value = fields.get(name)
        if value is None or value == "":
            return False  # nothing to compare: not above, not below
        number = _number(name, value, test.rstrip("_"))
        return number > limit if above else number < limit

    return compare


def _same(value: Any, choice: Any) -> bool:
    """`equals`/`in`: the same value, or a text (CSV) whose words are the choice's (`"5"` equals 5)."""
    if type(value) is str and type(choice) is not str and choice is not None:
        return value.strip() == value_text("", choice)
    if type(value) in (int, float) and type(choice) in (int, float):
        return bool(value == choice)
    return type(value) is type(choice) and bool(value == choice)


def _number(name: str, value: Any, test: str) -> Decimal:
    number = _decimal_of(value)
    if number is None:
        raise RenderError(name, f"{_shown(value)} is not a number (when: {test})")
    if not number.is_finite():  # NaN compares to nothing (Decimal raises), and `type: number` refuses both
        raise RenderError(name, f"{_shown(value)} is not a finite number (when: {test})")
    return number


def _decimal_of(value: Any) -> Decimal | None:
    if type(value) in (int, float):
        return Decimal(str(value))
    try:
        return Decimal(value.strip()) if type(value) is str else None
    except InvalidOperation:
        return None


# --- nulls, transforms, types ----------------------------------------------------------------


def _finisher(leaf: _Typed, name: str, parts: LeafParts) -> Callable[[Any], Any]:
    type_name, nulls = leaf.type, leaf.nulls
    has_default = "default" in leaf.model_fields_set and not isinstance(leaf, CoalesceLeaf)
    default = getattr(leaf, "default", None)
    transform = _transformer(leaf.transform, name)
    coerce = _coercer(leaf, name, parts)
    empty_is_null = type_name in _NULLISH_TYPES

    def finish(value: Any) -> Any:
        if value is None or (empty_is_null and value == ""):
            state = "null" if value is None else "empty"
            if nulls == "omit":
                return OMIT
            if nulls == "fail":
                raise RenderError(name, f"is {state} (nulls: fail)")
            if has_default:
                return default
            if nulls == "send" or (type_name in (None, "json") and value is None):
                return None
            raise RenderError(name, f"is {state}; type {type_name} needs a value (nulls: send allows it)")
        return coerce(transform(value))

    return finish


_TRANSFORMS: dict[str, Callable[[str], str]] = {
    "trim": str.strip,
    "lower": str.lower,
    "upper": str.upper,
    "sha256": lambda text: hashlib.sha256(text.encode()).hexdigest(),
    "md5": lambda text: hashlib.md5(text.encode(), usedforsecurity=False).hexdigest(),
    "base64": lambda text: base64.b64encode(text.encode()).decode("ascii"),
}


def _transformer(names: tuple[str, ...], field: str) -> Callable[[Any], Any]:
    if not names:
        return lambda value: value
    steps = tuple(_TRANSFORMS[name] for name in names)

    def transform(value: Any) -> str:
        text = value if type(value) is str else value_text(field, value)
        return reduce(lambda done, step: step(done), steps, text)

    return transform


def _coercer(leaf: _Typed, name: str, parts: LeafParts) -> Callable[[Any], Any]:
    if leaf.type is None:
        return lambda value: value
    if leaf.type == "datetime":
        return _datetime_coercer(leaf, name)
    if leaf.type == "decimal":
        return lambda value: _decimal(name, value)
    plain = parts.coercers[leaf.type]
    return lambda value: plain(name, value)


def _decimal(name: str, value: Any) -> orjson.Fragment:
    """A JSON number with exactly the digits of the text (`12.50` stays `12.50`, never 12.5), of a size
    a double holds: its digits are exact, but a target reading JSON numbers as doubles (most do) would
    read `1e400` as infinity and `1e-400` as 0, and an exponent of a billion is no amount at all."""
    if type(value) is int:
        return orjson.Fragment(str(value))  # 64-bit, as every input reads integers
    if type(value) is float:
        if not math.isfinite(value):  # orjson would write null
            raise RenderError(name, f"{_shown(value)} is not a finite number")
        return orjson.Fragment(orjson.dumps(value))
    match = _DECIMAL.fullmatch(value.strip()) if type(value) is str else None
    if match is None or not _DIGIT.search(value):
        raise RenderError(name, f"{_shown(value)} is not a decimal number")
    sign, whole, fraction, exponent = match.groups()
    text = ("-" if sign == "-" else "") + (whole or "0") + (f".{fraction}" if fraction else "")
    if exponent is not None or len(whole) > 308 or (not whole and len(fraction or "") > 308):
        text += exponent or ""
        if not _double_sized(Decimal(text)):
            raise RenderError(
                name, f"{_shown(value)} is beyond the range of a double (1e-308 to 1.8e308, or 0)"
            )
    return orjson.Fragment(text)


_LARGEST_DOUBLE = Decimal("1.7976931348623157e308")


def _double_sized(number: Decimal) -> bool:
    return number.is_zero() or (-308 <= number.adjusted() <= 308 and number.copy_abs() <= _LARGEST_DOUBLE)


def _datetime_coercer(leaf: _Typed, name: str) -> Callable[[Any], Any]:
    zone = ZoneInfo(leaf.timezone or "UTC")
    read = _datetime_reader(leaf.in_format or "iso8601", zone, name)
    write = _datetime_writer(leaf.to or "iso8601", zone)

    def coerce(value: Any) -> Any:
        moment = read(value)
        try:
            return write(moment)
        except OverflowError:  # an instant near the years 1 or 9999, written in a zone that passes them
            raise RenderError(
                name, f"{_shown(value)} is out of range: in {zone.key} it falls outside the years 1 to 9999"
            ) from None

    return coerce


def _datetime_reader(in_format: str, zone: ZoneInfo, name: str) -> Callable[[Any], datetime]:
    described = "ISO 8601" if in_format == "iso8601" else f"in_format {in_format!r}"
    numeric = _numeric_format(in_format)

    def parse(text: str) -> datetime:
        if in_format in ("epoch_s", "epoch_ms"):
            micro = Decimal(text) * (1000 if in_format == "epoch_ms" else 1_000_000)
            if not abs(micro) < _EPOCH_MICROS_BEYOND:  # NaN too
                raise OverflowError(text)
            return _EPOCH + timedelta(microseconds=int(micro))
        if in_format == "iso8601":
            return datetime.fromisoformat(text)
        if numeric is not None:
            return numeric(text)
        return datetime.strptime(text, in_format)

    def read(value: Any) -> datetime:
        if type(value) is bool or type(value) not in (str, int, float):
            raise RenderError(name, f"{_shown(value)} is not a date and time ({described})")
        try:
            moment = parse(value.strip() if type(value) is str else str(value))
        except (ValueError, ArithmeticError, OverflowError):
            raise RenderError(name, f"{_shown(value)} is not a date and time ({described})") from None
        return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment

    return read


_NUMERIC_DIRECTIVES = {"Y": r"(\d{4})", "m": r"(\d{1,2})", "d": r"(\d{1,2})", "H": r"(\d{1,2})"}
_NUMERIC_DIRECTIVES |= {"M": r"(\d{1,2})", "S": r"(\d{1,2})"}
_DIRECTIVE = re.compile(r"%(.)")
_ISO_SHAPED = {
    "%Y-%m-%d %H:%M:%S": re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", re.ASCII),
    "%Y-%m-%dT%H:%M:%S": re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", re.ASCII),
    "%Y-%m-%d": re.compile(r"\d{4}-\d\d-\d\d", re.ASCII),
}


def _numeric_format(in_format: str) -> Callable[[str], datetime] | None:
    """A reader for a format of numeric fields only (`%Y-%m-%d %H:%M:%S`, `%d/%m/%Y`): a regular
    expression and `datetime(...)` read what strptime reads, at a fifth of its cost (strptime parses its
    format again on every call). None for any other directive: strptime reads those."""
    parts: list[str] = []
    order: list[str] = []
    pos = 0
    for match in _DIRECTIVE.finditer(in_format):
        if match[1] not in _NUMERIC_DIRECTIVES or match[1] in order:
            return None
        parts.append(_literal(in_format[pos : match.start()]))
        parts.append(_NUMERIC_DIRECTIVES[match[1]])
        order.append(match[1])
        pos = match.end()
    parts.append(_literal(in_format[pos:]))
    if not {"Y", "m", "d"} <= set(order):
        return None
    pattern = re.compile("".join(parts), re.ASCII)
    slots = tuple(order.index(key) if key in order else None for key in "YmdHMS")
    iso = _ISO_SHAPED.get(in_format)  # zero-padded text in this format is ISO 8601, read faster still

    def read(text: str) -> datetime:
        if iso is not None and iso.fullmatch(text):
            return datetime.fromisoformat(text)
        match = pattern.fullmatch(text)
        if match is None:
            raise ValueError(text)
        found = match.groups()
        year, month, day, hour, minute, second = (0 if at is None else int(found[at]) for at in slots)
        return datetime(year, month, day, hour, minute, second)

    return read


def _literal(text: str) -> str:
    # strptime: "%%" is a "%", and whitespace in the format matches any run of whitespace.
    return r"\s+".join(re.escape(word.replace("%%", "%")) for word in re.split(r"\s+", text))


def _datetime_writer(to: str, zone: ZoneInfo) -> Callable[[datetime], Any]:
    if to == "epoch_s":
        return lambda moment: (moment - _EPOCH) // timedelta(seconds=1)
    if to == "epoch_ms":
        return lambda moment: (moment - _EPOCH) // _MS
    if to == "iso8601":
        return lambda moment: moment.astimezone(zone).isoformat()
    if to == "date":
        return lambda moment: moment.astimezone(zone).date().isoformat()
    return _strftime_writer(to, zone)


_YEAR_OR_PERCENT = re.compile(r"%[%YG]")


def _strftime_writer(to: str, zone: ZoneInfo) -> Callable[[datetime], str]:
    """strftime, but a year before 1000 written with four digits as everywhere else (`0999`): glibc
    writes `999`, which no reader takes for the year of a date."""
    has_year = _YEAR_OR_PERCENT.search(to.replace("%%", "")) is not None

    def write(moment: datetime) -> str:
        local = moment.astimezone(zone)
        if local.year > 1000 or not has_year:  # the ISO year (%G) of 1 January 1000 may be 999
            return local.strftime(to)
        years = {"%Y": f"{local.year:04d}", "%G": f"{local.isocalendar().year:04d}", "%%": "%%"}
        return local.strftime(_YEAR_OR_PERCENT.sub(lambda found: years[found[0]], to))

    return write


def _shown(value: Any) -> str:
    """The value in an error: a text quoted, anything else as JSON spells it (`true`, `{"a":1}`)."""
    if type(value) is str or (type(value) is float and not math.isfinite(value)):
        text = repr(value)  # NaN and infinities have no JSON spelling (orjson writes null)
    else:
        try:
            text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
        except orjson.JSONEncodeError:
            text = repr(value)  # no JSON value (a date a query made, say): as Python writes it
    return text if len(text) <= 40 else f"{text[:37]}..."
