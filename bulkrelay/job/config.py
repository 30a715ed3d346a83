"""The job file, version 1: frozen pydantic models, and `load_job()`, the one way to read it.

Every model forbids unknown keys and validates strictly (no "8" for 8, no true for 1). A
validation error becomes `ConfigInvalid` whose problems name the YAML path and its line.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, cast, get_args, get_origin
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails
from typing_extensions import TypeAliasType

from bulkrelay.errors import ConfigInvalid, JobFileUnreadable, NotFound, Problem, UsageError
from bulkrelay.job.alphacompat import upgrade_alpha_spellings
from bulkrelay.job.durations import MAX_SECONDS, parse_duration_ms
from bulkrelay.job.liquidtext import LiquidProblem, compile_liquid
from bulkrelay.job.redact import UNENCODED_CREDENTIALS, unencoded_credentials, url_unsafe
from bulkrelay.job.template import SECRET_NAME, FieldRef, SecretRef, compile_template
from bulkrelay.job.wire import header_value_refusal, proxy_refusal, wire_url
from bulkrelay.job.yamlload import INT64_RANGE, LineMap, format_path, load_yaml
from bulkrelay.job.yamlload import Path as YamlPath

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
FieldType = Literal["integer", "number", "boolean", "json", "string", "datetime", "decimal"]
Transform = Literal["trim", "lower", "upper", "sha256", "md5", "base64"]
Nulls = Literal["omit", "send", "fail"]  # what a present null does (docs/configuration.md, "Nulls")

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_JSON_POINTER = re.compile(r"(/([^~/]|~[01])*)*")
_SECRET_REFERENCE = re.compile(r"\$\{[A-Z_][A-Z0-9_]*\}")
# Defaults the relay also needs before (or without) a job file: their one home. The models below use them,
# and so do relay/retry's RetryPolicy and the transport's TransportSettings.
DEFAULT_MAX_ATTEMPTS = 1  # includes the first request: no retries
DEFAULT_RETRY_STATUSES = (408, 425, 429, 500, 502, 503, 504)
DEFAULT_INITIAL_BACKOFF_SECONDS = 1.0
DEFAULT_MAX_BACKOFF_SECONDS = 30.0
DEFAULT_JITTER_RATIO = 0.2
DEFAULT_RESPECT_RETRY_AFTER = True
DEFAULT_MAX_RETRY_AFTER_SECONDS = 300.0
DEFAULT_HALT_STATUSES = (401, 403)
MAX_BODY_BYTES = 1 << 20  # the most of a response body the transport reads; a failure body is cut from it
BULK_ANSWER_BYTES = 256 << 20  # a bulk run's: a job's result set (CSV, JSON page, archive) is read whole
MAX_WORKERS = 64  # processes of one run (execution.workers); `auto` takes at most 8
DEFAULT_CLIENT: Literal["reqwest", "httpx"] = "reqwest"
DEFAULT_PROXY = "none"  # no proxy, whatever the environment says
DEFAULT_BATCH_BYTES = 1_000_000  # request.batch.max_bytes: the whole encoded body
MAX_BATCH_BYTES = 1 << 30


class _Model(BaseModel):
    # No populate_by_name: `json_` and `from_` are Python spellings, never job file keys.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


# --- field validators -----------------------------------------------------------------------


def _int_as_text(value: Any) -> Any:
    """Query, header and form values are text; a plain integer such as `limit: 100` is accepted."""
    return str(value) if type(value) is int else value


def _list_as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _upper(value: Any) -> Any:
    return value.upper() if isinstance(value, str) else value


def _input_format(value: Any) -> Any:
    if isinstance(value, str):
        value = value.lower()
        return "jsonl" if value == "ndjson" else value
    return value


def _encoding(value: Any) -> Any:
    return "utf-8" if isinstance(value, str) and value.lower() in ("utf-8", "utf8") else value


def _template(text: str) -> str:
    compile_template(text)  # raises TemplateSyntaxError, a ValueError, naming the column
    return text


def _url(text: str) -> str:
    parts = compile_template(text).parts
    first = parts[0] if parts else ""
    absolute = isinstance(first, str) and first.lower().startswith(("http://", "https://"))
    if not (absolute or isinstance(first, SecretRef)):
        raise ValueError("the URL must begin with http:// or https:// (or a ${NAME} secret holding one)")
    if not any(isinstance(part, SecretRef) for part in parts):
        # Each field stands in as "1": whatever the rows hold, this text can never be sent.
        sample = "".join("1" if isinstance(part, FieldRef) else str(part) for part in parts)
        try:
            wire_url(sample)
        except ValueError as exc:
            raise ValueError(f"the transport cannot send this URL: {exc}") from None
    return text


def _header_name(name: str) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid HTTP header name")
    return name


def _sendable_header_text(text: str) -> str:
    """The literal text of a header value must be what the transport accepts (fields are checked per row,
    secrets when they are read)."""
    for part in compile_template(text).parts:
        if isinstance(part, str):
            _sendable_header_literal(part)
    return text


def _sendable_header_literal(text: str) -> str:
    if (refusal := header_value_refusal(text)) is not None:
        raise ValueError(f"a header value {refusal}: the transport cannot send it")
    return text


def _non_empty(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


def _json_pointer(text: str) -> str:
    if not _JSON_POINTER.fullmatch(text):
        raise ValueError(f"{text!r} is not a JSON pointer (like /id or /data/0/id; ~0 and ~1 escape ~ and /)")
    return text


def _unique(values: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(values)) != len(values):
        raise ValueError("lists a status twice")
    return values


def _no_success(values: tuple[int, ...]) -> tuple[int, ...]:
    """A retry on a 2xx would send again what the target just accepted."""
    successes = [status for status in values if status // 100 == 2]  # the class, not the job's success rule
    if successes:
        raise ValueError(f"names {', '.join(map(str, successes))}: a 2xx is a success, never retried")
    return values


def _not_empty_json(value: Any) -> Any:
    if isinstance(value, dict) and not value:
        raise ValueError("is empty: every request would send {}; map at least one field")
    return value


TemplateText = Annotated[str, BeforeValidator(_int_as_text), AfterValidator(_template)]
HeaderValue = Annotated[
    str, BeforeValidator(_int_as_text), AfterValidator(_template), AfterValidator(_sendable_header_text)
]
# The message's framing and the connection's, which the transport owns (RFC 9112 §6-7: Content-Length,
# Transfer-Encoding; RFC 9110 §7.6.1 Connection and the hop-by-hop fields it lists, §10.1.1 Expect): set
# by the job, they would contradict the bytes sent or the connection's use. Host stays a job's to set.
_FRAMING_HEADERS = frozenset({
    "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection", "te",
    "trailer", "upgrade", "expect",
})  # fmt: skip


def _header_not_in(names: frozenset[str], why: str) -> AfterValidator:
    """A header name's check: refused (naming it, then `why`) when it is one of `names`, in any case."""

    def check(name: str) -> str:
        if name.lower() in names:
            raise ValueError(f"{name} {why}")
        return name

    return AfterValidator(check)


HeaderName = Annotated[
    str,
    AfterValidator(_header_name),
    _header_not_in(
        _FRAMING_HEADERS,
        "is the transport's to set (the message's framing or the connection's): a job's value would "
        "contradict the bytes it sends",
    ),
]
NonEmpty = Annotated[str, AfterValidator(_non_empty)]
StatusCode = Annotated[int, Field(ge=100, le=599)]
Statuses = Annotated[tuple[StatusCode, ...], BeforeValidator(_list_as_tuple), AfterValidator(_unique)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]  # beyond it, timers and clocks overflow
PauseSeconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
RequestsPerSecond = Annotated[float, Field(gt=0, le=1_000_000)]


# --- input ----------------------------------------------------------------------------------


# A query parameter's value: bound as it is written, never interpolated into the SQL.
QueryParam = Annotated[str | int | float | bool | None, Field(union_mode="left_to_right")]
_QUERY_KEYS = ("query", "database", "params")  # absent from a file job's fingerprint: as it always was


class InputConfig(_Model):
    file: NonEmpty | None = None
    format: Annotated[Literal["csv", "jsonl", "parquet"] | None, BeforeValidator(_input_format)] = None
    key: NonEmpty | None = None
    delimiter: str = ","
    encoding: Annotated[Literal["utf-8"], BeforeValidator(_encoding)] = "utf-8"
    query: NonEmpty | None = None  # read from `database` into the run's snapshot (docs/inputs.md)
    database: NonEmpty | None = None  # postgresql://... or sqlite:///path, usually "${DATABASE_URL}"
    params: dict[str, QueryParam] = Field(default_factory=dict)  # bound as :name
    results_of: NonEmpty | None = None  # another job's results, by its name: (docs/chains.md)
    where: Literal["success", "failed", "all"] | None = None  # with results_of; None: success

    @model_validator(mode="after")
    def _results_of_alone(self) -> InputConfig:
        if self.results_of is None:
            if self.where is not None:
                raise ValueError("input.where goes with input.results_of")
            return self
        clash = [k for k in ("file", "format", "delimiter", "query") if k in self.model_fields_set]
        if clash:
            raise ValueError(
                f"input.results_of reads another job's results: input.{clash[0]} does not go with it"
            )
        return self

    @model_validator(mode="after")
    def _delimiter_is_for_csv(self) -> InputConfig:
        if len(self.delimiter) != 1 or self.delimiter in '\r\n"':
            raise ValueError("input.delimiter must be one character other than a quote or a newline")
        if self.format in ("jsonl", "parquet") and "delimiter" in self.model_fields_set:
            raise ValueError("input.delimiter applies to CSV input only")
        return self

    @model_validator(mode="after")
    def _query_or_file(self) -> InputConfig:
        if self.query is None:
            if self.database is not None or self.params:
                raise ValueError("input.database and input.params go with input.query")
            return self
        if self.database is None:
            raise ValueError('input.query needs input.database (for example "${DATABASE_URL}")')
        clash = [name for name in ("file", "format", "delimiter") if name in self.model_fields_set]
        if clash:
            raise ValueError(f"input.query reads a database: input.{clash[0]} does not go with it")
        for name in self.params:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"input.params.{name}: a parameter is named like :name (letters, digits, _)")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_query(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.query is None:
            for key in _QUERY_KEYS:
                data.pop(key, None)
        if self.results_of is None:
            data.pop("results_of", None)
            data.pop("where", None)
        return data


# --- request: the json body tree ------------------------------------------------------------

_TYPE_CHECKS: dict[str, type | tuple[type, ...]] = {"integer": int, "number": (int, float), "boolean": bool}


_TYPED_KEYS = ("transform", "nulls", "in_format", "timezone", "to")


class _Typed(_Model):
    """What every leaf may do to the value it makes (job/values.py): `transform` it, in order, then give it
    a `type` (`datetime` reads `in_format` and `timezone` and writes `to`), and decide what a null does."""

    type: FieldType | None = None
    transform: Annotated[tuple[Transform, ...], BeforeValidator(_list_as_tuple)] = ()
    nulls: Nulls | None = None  # None: request.nulls, else as before (see docs/configuration.md)
    in_format: NonEmpty | None = None  # a strptime format, or iso8601 (the default), epoch_s, epoch_ms
    timezone: NonEmpty | None = None  # the IANA zone of a time without offset, and of the text written
    to: NonEmpty | None = None  # iso8601 (the default), epoch_s, epoch_ms, date, or a strftime format

    @model_validator(mode="after")
    def _datetime_options(self) -> _Typed:
        given = [key for key in ("in_format", "timezone", "to") if getattr(self, key) is not None]
        if given and self.type != "datetime":
            raise ValueError(f"{given[0]} is for type: datetime")
        if self.timezone == "localtime":  # tzdata's link to /etc/localtime
            raise ValueError(
                "timezone 'localtime' is the host's zone: a resume on another machine would send other "
                "values (and idempotency keys) for the same rows; name the zone (like Europe/Paris)"
            )
        if self.timezone is not None:
            try:
                ZoneInfo(self.timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(
                    f"timezone {self.timezone!r} is not an IANA time zone (like Europe/Paris)"
                ) from None
        if self.to is not None:
            try:  # what strftime refuses (a lone surrogate) it would refuse for every row
                datetime(2000, 1, 1, tzinfo=UTC).strftime(self.to)
            except ValueError as exc:
                raise ValueError(f"to {self.to!r} is not a strftime format ({exc})") from None
        return self


class JsonField(_Typed):
    """`{from: field, type?: ..., default?: ..., when_missing?: ...}`: a value taken from the record.
    A `from` beginning with `/` is a JSON pointer into the record (`/address/city`)."""

    from_: NonEmpty = Field(alias="from")
    type: FieldType | None = None  # None: as read (CSV text stays text, JSON Lines values keep their type)
    default: Any = None  # used when the field is absent or null, or empty under a non-string type
    # What a field absent from the record does: an error of the row, the key left out, or null.
    when_missing: Literal["error", "omit", "null"] = "error"

    @property
    def has_default(self) -> bool:
        return "default" in self.model_fields_set

    @property
    def pointer(self) -> tuple[str, ...] | None:
        """The reference tokens of a `from: /a/b` JSON pointer (RFC 6901, ~1 and ~0 unescaped); None for
        a plain field name."""
        return pointer_tokens(self.from_) if self.from_.startswith("/") else None

    @property
    def field(self) -> str:
        """The record's top-level field this leaf reads (a pointer's first token)."""
        pointer = self.pointer
        return self.from_ if pointer is None else pointer[0]

    @property
    def optional(self) -> bool:
        """A record may lack the field: a `default` or a `when_missing` other than `error` covers it."""
        return self.has_default or self.when_missing != "error"

    @field_validator("when_missing", mode="before")
    @classmethod
    def _yaml_null_is_null(cls, value: object) -> object:
        """`when_missing: null` as written reads as YAML's null, not the word: both mean send null."""
        return "null" if value is None else value

    @model_validator(mode="after")
    def _pointer_and_missing(self) -> JsonField:
        if self.from_.startswith("/"):
            _json_pointer(self.from_)
        if self.has_default and self.when_missing != "error":
            raise ValueError("give a default or a when_missing, not both (a default already covers absence)")
        return self

    @model_validator(mode="after")
    def _default_fits_type(self) -> JsonField:
        if not self.has_default or self.default is None or self.type in (None, "json", "datetime", "decimal"):
            return self
        expected = str if self.type == "string" else _TYPE_CHECKS[self.type]
        if (isinstance(self.default, bool) and self.type != "boolean") or not isinstance(
            self.default, expected
        ):
            raise ValueError(f"default {self.default!r} is not a valid {self.type}")
        if self.type == "integer" and self.default not in INT64_RANGE:
            raise ValueError(f"default {self.default!r} is out of the signed 64-bit integer range")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_default(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.has_default:
            data.pop("default", None)
        if self.when_missing == "error":
            data.pop("when_missing", None)  # jobs written before it keep their fingerprint
        for key in _TYPED_KEYS:
            if key not in self.model_fields_set:
                data.pop(key, None)
        return data


_LITERAL_JSON = "json values are literal; ${NAME} secrets work in url, query, headers, form and body"


class JsonValue(_Model):
    """`{value: literal}`: the same value in every request."""

    value: Any

    @model_validator(mode="after")
    def _no_secret_references(self) -> JsonValue:
        if _mentions_secret(self.value):
            raise ValueError(_LITERAL_JSON)
        return self


class JsonLookup(_Model):
    """`{lookup: NAME, key: {from: FIELD}, on_miss: fail | skip | null}`: the value the lookup map
    NAME holds for the record's key (docs/chains.md#lookups)."""

    lookup: NonEmpty
    key: JsonField
    on_miss: Literal["fail", "skip", "null"] = "fail"

    @field_validator("on_miss", mode="before")
    @classmethod
    def _yaml_null_is_null(cls, value: object) -> object:
        return "null" if value is None else value


def _mentions_secret(value: Any) -> bool:
    if isinstance(value, str):
        return _SECRET_REFERENCE.search(value) is not None
    if isinstance(value, dict):
        return any(_mentions_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_mentions_secret(v) for v in value)
    return False


class FormatLeaf(_Typed):
    """`{format: "{first_name} {last_name}"}`: record fields placed into a text (no `${NAME}` secrets)."""

    format: TemplateText

    @field_validator("format")
    @classmethod
    def _no_secrets(cls, text: str) -> str:
        if compile_template(text).secrets:
            raise ValueError(_LITERAL_JSON)
        return text


class CoalesceLeaf(_Typed):
    """`{coalesce: [LEAF, ...]}`: the first value present, non-null, non-empty (else `default`, or null)."""

    coalesce: Annotated[tuple[JsonNode, ...], BeforeValidator(_list_as_tuple), Field(min_length=1)]
    default: Any = None


class Condition(_Model):
    """`when:`'s test of one record field: exactly one of equals, in, present, above, below."""

    field: NonEmpty
    equals: Any = None
    in_: Annotated[tuple[Any, ...], BeforeValidator(_list_as_tuple)] | None = Field(default=None, alias="in")
    present: bool | None = None
    above: int | float | None = None
    below: int | float | None = None

    @model_validator(mode="after")
    def _one_test(self) -> Condition:
        tests = set(self.model_fields_set) - {"field"}
        if len(tests) != 1:
            raise ValueError("when: takes a field and exactly one of equals, in, present, above, below")
        return self


class WhenLeaf(_Typed):
    """`{when: {field: F, above: 1000}, then: LEAF, else: LEAF}`: a value chosen by a test (no else: null)."""

    when: Condition
    then: JsonNode
    else_: JsonNode | None = Field(default=None, alias="else")


class LiquidLeaf(_Typed):
    """`{liquid: "{{ first_name | capitalize }}"}`: a Liquid template's text (job/liquidtext.py)."""

    liquid: NonEmpty

    @field_validator("liquid")
    @classmethod
    def _parses(cls, text: str) -> str:
        try:
            compile_liquid(text)
        except LiquidProblem as exc:
            raise ValueError(f"Liquid does not parse: {exc}") from None
        return text


class RowsLeaf(_Model):
    """`{rows: NODE}` in a grouped job (request.group): a list with one NODE a row of the group."""

    rows: JsonNode


# The kinds of leaf beside `from` and `value`, by the key that names them: a new kind is one more entry
# here and one more tagged case in JsonNode below (job/values.py renders each).
_LEAF_KINDS: dict[str, type[_Model]] = {
    "format": FormatLeaf, "coalesce": CoalesceLeaf, "when": WhenLeaf, "liquid": LiquidLeaf, "rows": RowsLeaf,
}  # fmt: skip


# What makes a mapping a leaf of each kind, as `from` must be a string: a body key that happens to be called
# `format` or `when` (`format: { value: pdf }`) stays a key of an object.
_KIND_SHAPES: dict[str, Any] = {
    "format": lambda m: isinstance(m["format"], str),
    "liquid": lambda m: isinstance(m["liquid"], str),
    "coalesce": lambda m: isinstance(m["coalesce"], list),
    "when": lambda m: isinstance(m["when"], dict) and "then" in m,
    "rows": lambda m: set(m) == {"rows"} and isinstance(m["rows"], dict),
}


def _json_node_kind(value: Any) -> str | None:
    """A mapping is a leaf when it has a string `from`, is exactly `{value: ...}`, or has a key of
    `_LEAF_KINDS` in the shape `_KIND_SHAPES` asks; else an object."""
    if isinstance(value, JsonField | JsonValue):
        return "~from" if isinstance(value, JsonField) else "~value"
    if isinstance(value, JsonLookup) or (isinstance(value, dict) and isinstance(value.get("lookup"), str)):
        return "~lookup"
    for key, model in _LEAF_KINDS.items():
        if isinstance(value, model) or (
            isinstance(value, dict) and key in value and _KIND_SHAPES[key](value)
        ):
            return f"~{key}"
    if isinstance(value, dict):
        if isinstance(value.get("from"), str):
            return "~from"
        return "~value" if set(value) == {"value"} else "~object"
    return None


# mypy reads the plain recursive alias; pydantic validates the tagged union, which gives one clear
# error per bad node instead of one per union member.
KindLeaf = FormatLeaf | CoalesceLeaf | WhenLeaf | LiquidLeaf | RowsLeaf  # the kinds of `_LEAF_KINDS`
if TYPE_CHECKING:
    JsonNode = JsonField | JsonValue | JsonLookup | KindLeaf | dict[str, "JsonNode"]
else:
    JsonNode = TypeAliasType(
        "JsonNode",
        Annotated[
            Annotated[JsonField, Tag("~from")]
            | Annotated[JsonValue, Tag("~value")]
            | Annotated[JsonLookup, Tag("~lookup")]
            | Annotated[FormatLeaf, Tag("~format")]
            | Annotated[CoalesceLeaf, Tag("~coalesce")]
            | Annotated[WhenLeaf, Tag("~when")]
            | Annotated[LiquidLeaf, Tag("~liquid")]
            | Annotated[RowsLeaf, Tag("~rows")]
            | Annotated[dict[str, "JsonNode"], Tag("~object")],
            Discriminator(
                _json_node_kind,
                custom_error_type="json_node",
                custom_error_message=(
                    "expected {from: FIELD}, {value: LITERAL}, {format: ...}, {coalesce: [...]}, "
                    "{when: ..., then: ...}, {liquid: ...} or a mapping of those"
                ),
            ),
        ],
    )


for _leaf in (CoalesceLeaf, WhenLeaf, RowsLeaf):  # they hold leaves: built once JsonNode is defined
    _leaf.model_rebuild()


# --- request: form, idempotency, the request itself -----------------------------------------


class FormField(_Typed):
    """`{from: field}` in a form: the record value as text (a json leaf's options apply, then the text)."""

    from_: NonEmpty = Field(alias="from")

    @model_serializer(mode="wrap")
    def _omit_unset_options(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("type", *_TYPED_KEYS):  # jobs written before them keep their fingerprint
            if key not in self.model_fields_set:
                data.pop(key, None)
        return data


def _form_value_kind(value: Any) -> str | None:
    if isinstance(value, str | int) and not isinstance(value, bool):
        return "~text"
    kind = "~from" if isinstance(value, FormField) else _json_node_kind(value)
    return kind if kind in ("~from", *(f"~{key}" for key in _LEAF_KINDS if key != "rows")) else None


FormValue = Annotated[
    Annotated[TemplateText, Tag("~text")]
    | Annotated[FormField, Tag("~from")]
    | Annotated[FormatLeaf, Tag("~format")]
    | Annotated[CoalesceLeaf, Tag("~coalesce")]
    | Annotated[WhenLeaf, Tag("~when")]
    | Annotated[LiquidLeaf, Tag("~liquid")],
    Discriminator(
        _form_value_kind,
        custom_error_type="form_value",
        custom_error_message="expected a template string, {from: FIELD} or another leaf (not {value: ...})",
    ),
]


class IdempotencyKeyConfig(_Model):
    header: HeaderName


class JsonMeta(_Model):
    """`{meta: item_id}` in a batch item: the row's stable id (its idempotency key), docs/batching.md."""

    meta: Literal["item_id"]


def _item_node_kind(value: Any) -> str | None:
    """`_json_node_kind`, and `{meta: ...}`: a batch item's leaves may also name the row's item id."""
    if isinstance(value, JsonMeta) or (isinstance(value, dict) and set(value) == {"meta"}):
        return "~meta"
    return _json_node_kind(value)


if TYPE_CHECKING:
    ItemNode = JsonField | JsonValue | JsonMeta | JsonLookup | KindLeaf | dict[str, "ItemNode"]
else:
    ItemNode = TypeAliasType(
        "ItemNode",
        Annotated[
            Annotated[JsonField, Tag("~from")]
            | Annotated[JsonValue, Tag("~value")]
            | Annotated[JsonMeta, Tag("~meta")]
            | Annotated[JsonLookup, Tag("~lookup")]
            | Annotated[FormatLeaf, Tag("~format")]
            | Annotated[CoalesceLeaf, Tag("~coalesce")]
            | Annotated[WhenLeaf, Tag("~when")]
            | Annotated[LiquidLeaf, Tag("~liquid")]
            | Annotated[RowsLeaf, Tag("~rows")]
            | Annotated[dict[str, "ItemNode"], Tag("~object")],
            Discriminator(
                _item_node_kind,
                custom_error_type="json_node",
                custom_error_message=(
                    "expected {from: FIELD}, {value: LITERAL}, {meta: item_id} or a mapping of those"
                ),
            ),
        ],
    )


def item_leaves(
    node: ItemNode, path: YamlPath
) -> Iterator[tuple[YamlPath, JsonField | JsonValue | JsonMeta | JsonLookup | KindLeaf]]:
    """Every leaf of a batch item (or envelope) tree, with its YAML path."""
    if isinstance(node, dict):
        for key, child in node.items():
            yield from item_leaves(child, (*path, key))
    else:
        yield path, node


class BatchConfig(_Model):
    """`request.batch`: many rows in one request (docs/batching.md)."""

    max_items: Annotated[int, Field(ge=1, le=10_000)]
    max_bytes: Annotated[int, Field(ge=2, le=MAX_BATCH_BYTES)] = DEFAULT_BATCH_BYTES
    encoding: Literal["json", "ndjson"] = "json"
    items_at: Annotated[str, AfterValidator(_json_pointer), AfterValidator(_non_empty)] | None = None
    envelope: dict[str, ItemNode] | None = None
    item: ItemNode | None = None
    item_lines: (
        Annotated[tuple[ItemNode, ...], BeforeValidator(_list_as_tuple), Field(min_length=1)] | None
    ) = None

    @model_validator(mode="after")
    def _coherent(self) -> BatchConfig:
        if self.encoding == "json":
            if self.item is None or self.item_lines is not None:
                raise ValueError("request.batch with encoding: json needs item (item_lines is for ndjson)")
            if self.envelope is not None and self.items_at is None:
                raise ValueError("request.batch.envelope needs items_at: where the items go inside it")
        else:
            if (self.item is None) == (self.item_lines is None):
                raise ValueError("request.batch with encoding: ndjson needs exactly one of item, item_lines")
            if self.envelope is not None or self.items_at is not None:
                raise ValueError("request.batch.envelope and items_at are for encoding: json")
        for path, leaf in item_leaves(self.envelope or {}, ("envelope",)):
            if not isinstance(leaf, JsonValue):
                raise ValueError(
                    f"request.batch.{format_path(path)} must be a {{value: ...}}: the envelope is the "
                    "same for every row of a batch (record fields go in request.batch.item)"
                )
        return self

    def item_nodes(self) -> tuple[tuple[YamlPath, ItemNode], ...]:
        """The item's trees with their YAML paths: `item`, or each of `item_lines`."""
        if self.item is not None:
            return ((("request", "batch", "item"), self.item),)
        lines = self.item_lines or ()
        return tuple((("request", "batch", "item_lines", n), node) for n, node in enumerate(lines))


def _no_fields(text: str) -> str:
    """Text the whole run shares (a token request): `${NAME}` secrets, but no `{field}` of a record."""
    if compile_template(text).fields:
        raise ValueError("cannot use a {field}: the token is the same for every row")
    return text


def _secret_reference(text: str) -> str:
    if not compile_template(text).secrets:
        raise ValueError('must come from the environment, like "${CLIENT_SECRET}": never write a secret here')
    return text


def _token_url(text: str) -> str:
    _no_fields(text)
    first = (compile_template(text).parts or ("",))[0]
    if not (isinstance(first, SecretRef) or (isinstance(first, str) and first.lower().startswith(_SCHEMES))):
        raise ValueError("the token URL must begin with http:// or https:// (or a ${NAME} holding one)")
    unsafe = url_unsafe(text) if not compile_template(text).secrets else None
    if unsafe is not None:  # never echoed: it may hold a password
        raise ValueError(f"the token URL cannot be parsed safely ({unsafe}); it is not shown here")
    return text


_SCHEMES = ("http://", "https://")
SharedText = Annotated[
    str, BeforeValidator(_int_as_text), AfterValidator(_template), AfterValidator(_no_fields)
]


class OAuth2Config(_Model):
    """`request.auth.oauth2`: a client-credentials token, fetched before the first request and sent as
    `Authorization: Bearer` (relay/auth/oauth2.py). What it grants (URL, scope, params) is the job's meaning;
    who asks (client id and secret) and how it authenticates are not (`config_semantic_dict`)."""

    token_url: Annotated[str, AfterValidator(_template), AfterValidator(_token_url)]
    client_id: Annotated[SharedText, AfterValidator(_non_empty)]
    client_secret: Annotated[SharedText, AfterValidator(_secret_reference)] | None = None
    scope: SharedText | None = None
    params: dict[NonEmpty, SharedText] = Field(default_factory=dict)
    client_auth: Literal["body", "basic", "private_key_jwt"] = "body"
    # Refresh this long before `expires_in` runs out (at half the lifetime when that is shorter).
    refresh_before_seconds: PauseSeconds = 60.0
    # RFC 7523: the JWT bearer grant and private_key_jwt client authentication (job/assertion.py).
    grant: Literal["client_credentials", "jwt_bearer"] = "client_credentials"
    private_key: Annotated[SharedText, AfterValidator(_secret_reference)] | None = None
    private_key_file: NonEmpty | None = None
    subject: SharedText | None = None
    audience: SharedText | None = None
    default_expires_in_seconds: Annotated[float, Field(gt=0, le=MAX_SECONDS)] | None = None

    @model_validator(mode="after")
    def _reserved_params(self) -> OAuth2Config:
        reserved = {"grant_type", "client_id", "client_secret", "scope", "assertion"} & set(self.params)
        if reserved:
            raise ValueError(f"params cannot set {', '.join(sorted(reserved))}: auth.oauth2 sets it")
        signs = self.grant == "jwt_bearer" or self.client_auth == "private_key_jwt"
        if signs and (self.private_key is None) == (self.private_key_file is None):
            raise ValueError(
                "grant jwt_bearer and client_auth private_key_jwt sign with a key: "
                "give private_key (a ${NAME}) or private_key_file, one of them"
            )
        if not signs and (self.private_key, self.private_key_file) != (None, None):
            raise ValueError("a private key signs only for grant: jwt_bearer or client_auth: private_key_jwt")
        if self.client_auth in ("body", "basic") and self.client_secret is None and not signs:
            raise ValueError(f"client_auth: {self.client_auth} needs client_secret")
        if self.grant == "jwt_bearer" and self.subject is None:
            raise ValueError("grant: jwt_bearer needs subject (the user the token acts for)")
        return self

    @model_serializer(mode="wrap")
    def _omit_unused_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("grant", "subject", "audience"):  # a client-credentials job keeps its fingerprint
            if data.get(key) in (None, "client_credentials"):
                data.pop(key, None)
        return data


class AwsSigV4Config(_Model):
    """`request.auth.aws_sigv4`: each attempt signed with AWS Signature Version 4 (relay/auth/sigv4.py)."""

    service: NonEmpty
    region: NonEmpty


# Headers a signature or its timestamp cannot take (docs/auth.md#which-headers-a-signature-may-take):
# the message's framing and the connection's, which the transport owns (RFC 9112 §6-7: Content-Length,
# Transfer-Encoding; RFC 9110 §7.2 Host, §7.6.1 Connection and the hop-by-hop fields it lists, §10.1.1
# Expect, §11.7.2 Proxy-Authorization), and those BulkRelay sets on the request itself (Content-Type,
# Content-Encoding, User-Agent, Accept-Encoding): a signature there would replace or corrupt them.
_NOT_SIGNATURE_HEADERS = _FRAMING_HEADERS | {
    "host",
    "proxy-authorization",
    "content-type",
    "content-encoding",
    "user-agent",
    "accept-encoding",
}


SignatureHeader = Annotated[
    str,
    AfterValidator(_header_name),
    _header_not_in(
        _NOT_SIGNATURE_HEADERS,
        "is a header the transport or BulkRelay sets (framing, connection or content): a signature "
        "cannot go there; name a header of its own, like X-Signature",
    ),
]

HmacSecrets = Annotated[
    tuple[Annotated[SharedText, AfterValidator(_secret_reference)], ...], BeforeValidator(_list_as_tuple)
]


class HmacConfig(_Model):
    """`request.auth.hmac`: an HMAC of each attempt's final bytes in a header (relay/auth/hmac.py)."""

    scheme: Literal["standard_webhooks", "github", "custom"]
    secret: Annotated[SharedText, AfterValidator(_secret_reference)] | HmacSecrets
    header: SignatureHeader | None = None  # custom:
    algorithm: Literal["sha256", "sha512"] = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: Annotated[str, AfterValidator(_sendable_header_literal)] = ""
    signed: str = "{body}"
    timestamp_header: SignatureHeader | None = None

    @model_validator(mode="after")
    def _scheme_keys(self) -> HmacConfig:
        custom = {"header", "algorithm", "encoding", "prefix", "signed", "timestamp_header"}
        given = sorted(custom & self.model_fields_set)
        if self.scheme != "custom" and given:
            raise ValueError(f"{given[0]} belongs to scheme: custom; {self.scheme} fixes its own")
        if self.scheme == "custom" and self.header is None:
            raise ValueError("scheme: custom needs header (where the signature goes)")
        if self.header and self.timestamp_header and self.header.lower() == self.timestamp_header.lower():
            raise ValueError(
                f"timestamp_header and header both name {self.header}: the timestamp would replace the "
                "signature; give each a header of its own"
            )
        unknown = set(re.findall(r"{([^}]*)}", self.signed)) - {"timestamp", "body", "method", "path"}
        if unknown:
            raise ValueError(
                f"signed knows {{timestamp}} {{body}} {{method}} {{path}}, not {{{min(unknown)}}}"
            )
        if isinstance(self.secret, tuple) and not self.secret:
            raise ValueError("secret: a list of at least one ${NAME}")
        return self

    @property
    def secrets(self) -> tuple[str, ...]:
        return self.secret if isinstance(self.secret, tuple) else (self.secret,)


class GroupConfig(_Model):
    """`request.group`: consecutive rows with the same `by` value make one request (job/groups.py)."""

    by: NonEmpty
    max_group_rows: Annotated[int, Field(ge=1, le=10_000)] = 10_000


class AuthConfig(_Model):
    """`request.auth`: one kind (docs/auth.md)."""

    oauth2: OAuth2Config | None = None
    aws_sigv4: AwsSigV4Config | None = None
    hmac: HmacConfig | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> AuthConfig:
        given = [name for name in ("oauth2", "aws_sigv4", "hmac") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"request.auth takes one of oauth2, aws_sigv4, hmac (given: {', '.join(given) or 'none'})"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_kinds(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {name: value for name, value in data.items() if value is not None}

    def texts(self) -> list[str]:
        """Every text of it that may name a `${NAME}`."""
        if self.hmac is not None:
            return list(self.hmac.secrets)
        oauth2 = self.oauth2
        if oauth2 is None:
            return []
        texts = [oauth2.token_url, oauth2.client_id, oauth2.client_secret, oauth2.scope, oauth2.private_key]
        texts += [oauth2.subject, oauth2.audience, *oauth2.params.values()]
        return [text for text in texts if text is not None]


def _wait_seconds(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return parse_duration_ms(value, what="poll.max_wait") / 1000
    except UsageError as exc:
        raise ValueError(exc.message) from None


class BulkPollConfig(_Model):
    """`request.bulk_job.poll`: a job's state asked again from `first_seconds`, doubling to `max_seconds`."""

    first_seconds: PauseSeconds = 2.0
    max_seconds: Seconds = 60.0
    max_wait: Annotated[Seconds, BeforeValidator(_wait_seconds)] = 6 * 3600.0  # then stop, resumable


class BulkPagesConfig(_Model):
    """A JSON result set over several pages (`results[].pages`), as a `get` lookup's: the next page's URL
    at the pointer `next` in each page (none: the `Link` header's rel="next"), at most `max_pages`."""

    next: Annotated[str, AfterValidator(_json_pointer)] | None = None
    max_pages: Annotated[int, Field(ge=1, le=100_000)] = 1000


class BulkStepConfig(_Model):
    """One request of a generic bulk job's life (`request.bulk_job.steps`): `{job}` in `path` is its id."""

    method: Annotated[Method, BeforeValidator(_upper)] = "GET"
    path: NonEmpty | None = None  # after base_url; every step has one but a result set found at url_at
    json_: dict[str, Any] | None = Field(default=None, alias="json")  # the body (the upload's is the CSV)
    id: Annotated[str, AfterValidator(_json_pointer)] | None = None  # create: the job's id in the answer
    state: Annotated[str, AfterValidator(_json_pointer)] | None = None  # status: the job's state
    error: Annotated[str, AfterValidator(_json_pointer)] | None = None  # status: a failed job's message
    outcome: Literal["success", "failed", "unprocessed"] | None = None  # results: what its rows became
    error_column: NonEmpty | None = None  # results (failed): the column holding a row's error
    capture: Annotated[tuple[NonEmpty, ...], BeforeValidator(_list_as_tuple)] = ()  # results (success)
    # upload and results: CSV (the default), or JSON: the rows as objects {column: value}, put at
    # `rows_at` in `json` (none: the body is their list); results as a list at `items`, each naming its
    # row at `key` (default: /<the key column>), a failed one's message at `error`; `capture`: pointers
    format: Literal["csv", "json"] = "csv"
    rows_at: Annotated[str, AfterValidator(_json_pointer)] | None = None
    items: Annotated[str, AfterValidator(_json_pointer)] | None = None
    key: Annotated[str, AfterValidator(_json_pointer)] | None = None
    pages: BulkPagesConfig | None = None  # results (json): the set is paged
    # results (json): each item's own HTTP status (Mailchimp's /status_code), in place of `outcome`: a
    # 2xx is a success (`capture`), any other fails its row with the message at `error`
    status: Annotated[str, AfterValidator(_json_pointer)] | None = None
    # results (json): the set is a gzip'd tar of JSON files (`items` in each), read as a stream, never to
    # disk, at most `max_members` members and `max_unpacked_bytes` bytes of tar unpacked
    archive: Literal["tar.gz"] | None = None
    max_members: Annotated[int, Field(ge=1, le=100_000)] | None = None  # None: 10,000
    max_unpacked_bytes: Annotated[int, Field(ge=1024, le=BULK_ANSWER_BYTES * 16)] | None = None  # 1 GiB
    # results: the set's URL at this pointer in the job's status answer (Mailchimp's /response_body_url),
    # in place of `path`
    url_at: Annotated[str, AfterValidator(_json_pointer)] | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_additions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in _RESULTS_ONLY:  # unset, they leave out: jobs written before them keep their fingerprint
            if data.get(key) is None:  # (and a delta job its rows' digests)
                data.pop(key, None)
        return data


_States = Annotated[tuple[NonEmpty, ...], BeforeValidator(_list_as_tuple)]


class BulkGenericConfig(_Model):
    """`kind: generic`: the steps as request templates, and which of the target's states mean what."""

    create: BulkStepConfig | None = None  # none: the upload makes the job (its id at upload.id)
    upload: BulkStepConfig
    close: BulkStepConfig | None = None  # none: the upload closes the job
    abort: BulkStepConfig | None = None
    status: BulkStepConfig
    results: Annotated[tuple[BulkStepConfig, ...], BeforeValidator(_list_as_tuple), Field(min_length=1)]
    open_states: _States = ()  # a job still taking data (aborted and made again on resume)
    done_states: Annotated[_States, Field(min_length=1)]
    failed_states: _States = ()
    aborted_states: _States = ()
    unlisted: Literal["unprocessed", "success"] = "unprocessed"  # a row named in no result set
    # Without create, the data leaves before the job has an id: a crash before its answer is journaled
    # loses the job, and its rows are submitted again. The job file says that is safe (at-least-once).
    resubmit: Literal["safe"] | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_additions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.unlisted == "unprocessed":  # as before it: jobs written before it keep their fingerprint
            data.pop("unlisted", None)
        if self.resubmit is None:
            data.pop("resubmit", None)
        return data

    @model_validator(mode="after")
    def _pointers(self) -> BulkGenericConfig:
        if self.status.state is None or (self.create or self.upload).id is None:
            raise ValueError(
                "request.bulk_job.steps: create (or, without it, upload) needs id and status needs state"
                " (JSON pointers)"
            )
        _submit_fits(self)
        if any((step.outcome is None) == (step.status is None) for step in self.results):
            raise ValueError(
                "request.bulk_job.steps.results: each needs outcome (success, failed, unprocessed),"
                " or status (a pointer to each item's own status), not both"
            )
        _json_steps_fit(self)
        _result_sets_fit(self.results)
        others = (self.create, self.upload, self.close, self.abort, self.status)
        if any(step is not None and step.path is None for step in others):
            raise ValueError("request.bulk_job.steps: each step needs its path")
        return self


def _submit_fits(steps: BulkGenericConfig) -> None:
    """An upload that makes the job (no create) says its effect is safe to repeat, and names no {job}."""
    where = "request.bulk_job.steps"
    if steps.create is not None:
        if steps.upload.id is not None or steps.resubmit is not None:
            raise ValueError(
                f"{where}: upload.id and resubmit go with an upload that makes the job (no create)"
            )
        return
    if "{job}" in (steps.upload.path or ""):
        raise ValueError(f"{where}.upload: without create, the upload makes the job: its path has no {{job}}")
    if steps.resubmit != "safe":
        raise ValueError(
            f"{where}: without create, the upload makes the job and its data leaves before the job has an"
            " id; after a crash in that moment the job cannot be found again and its rows are submitted"
            " again. Say resubmit: safe if the target may apply them twice (at-least-once,"
            " docs/bulk-jobs.md#a-submit-that-carries-the-rows-no-create)"
        )


def _json_steps_fit(steps: BulkGenericConfig) -> None:
    """`format: json` on the upload and the results, with the keys that go with it (and only there)."""
    upload = steps.upload
    if upload.format == "csv" and (upload.rows_at is not None or upload.json_ is not None):
        raise ValueError("request.bulk_job.steps.upload: json and rows_at go with format: json")
    if upload.rows_at is not None and not upload.rows_at.strip("/"):
        raise ValueError("request.bulk_job.steps.upload.rows_at names a key of json (like /records)")
    for step in steps.results:
        if step.format == "json":
            if step.items is None:
                raise ValueError("request.bulk_job.steps.results: format: json needs items (a JSON pointer)")
            if step.error_column is not None:
                raise ValueError("request.bulk_job.steps.results: format: json reads a row's error at error")
            if not all(pointer.startswith("/") for pointer in step.capture):
                raise ValueError("request.bulk_job.steps.results: format: json captures JSON pointers (/id)")
        elif step.items is not None or step.key is not None:
            raise ValueError("request.bulk_job.steps.results: items and key go with format: json")
    others = (steps.create, steps.close, steps.abort, steps.status)
    if any(step is not None and step.format != "csv" for step in others):
        raise ValueError("request.bulk_job.steps: format goes on upload and results")
    for other in (*others, steps.upload):
        if other is not None and any(getattr(other, name) is not None for name in _RESULTS_ONLY):
            raise ValueError(f"request.bulk_job.steps: {', '.join(_RESULTS_ONLY)} go on results")


_RESULTS_ONLY = (  # settings of a result set alone
    "pages",
    "status",
    "archive",
    "max_members",
    "max_unpacked_bytes",
    "url_at",
)


def _result_sets_fit(results: tuple[BulkStepConfig, ...]) -> None:
    """Paged, archived and per-item-status result sets: JSON, with what goes with each."""
    for step in results:
        where = "request.bulk_job.steps.results"
        if (step.path is None) == (step.url_at is None):
            raise ValueError(f"{where}: each has a path, or url_at (a pointer into the status answer)")
        if step.format != "json" and (step.pages, step.status, step.archive) != (None, None, None):
            raise ValueError(f"{where}: pages, status and archive go with format: json")
        if step.pages is not None and step.archive is not None:
            raise ValueError(f"{where}: an archive is one file (pages go with a JSON answer)")
        if step.archive is None and (step.max_members, step.max_unpacked_bytes) != (None, None):
            raise ValueError(f"{where}: max_members and max_unpacked_bytes go with archive: tar.gz")
        if step.status is not None and step.error is None:
            raise ValueError(f"{where}: status needs error (a pointer to a failed item's message)")


def column_path(name: str) -> tuple[str, ...]:
    """Where a bulk column's value sits in a JSON row: a name beginning with `/` is a JSON pointer
    (`/attributes/email`, ~1 and ~0 unescaped), any other name one key at the top level."""
    return pointer_tokens(name) if name.startswith("/") else (name,)


def pointer_tokens(pointer: str) -> tuple[str, ...]:
    """The reference tokens of the JSON pointer `pointer` (RFC 6901: `/a/b`, ~1 and ~0 unescaped)."""
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/"))


def _nested_columns_fit(job: BulkJobConfig) -> None:
    """Columns named by JSON pointers nest a generic job's JSON rows: each a valid pointer to an object
    key, none the same place as another column or inside it (`/a` and `/a/b`), and only there (a CSV
    column is a flat name)."""
    nested = [name for name in job.columns if name.startswith("/")]
    if not nested:
        return
    where = "request.bulk_job.columns"
    if job.steps is None or job.steps.upload.format != "json":
        raise ValueError(
            f"{where}: {nested[0]} is a JSON pointer, which nests a JSON row: it goes with kind: generic and"
            " steps.upload.format: json (a CSV column is a flat name)"
        )
    for name in nested:
        if not _JSON_POINTER.fullmatch(name) or "" in column_path(name):
            raise ValueError(
                f"{where}: {name!r} is no JSON pointer to an object key (like /attributes/email: no empty"
                " key, ~ only as ~0 or ~1)"
            )
    placed = sorted((column_path(name), name) for name in job.columns)
    for (path, name), (after, other) in pairwise(placed):
        if after[: len(path)] == path:
            how = "name the same key" if after == path else f"{other} would sit inside {name}'s value"
            raise ValueError(f"{where}: {name} and {other} collide in a JSON row: {how}")


class BulkJobConfig(_Model):
    """`request.bulk_job`: rows sent as asynchronous bulk jobs (docs/bulk-jobs.md)."""

    kind: Literal["salesforce_bulk2", "named_import", "generic"]
    base_url: Annotated[str, AfterValidator(_url)]
    object: NonEmpty = "-"  # salesforce_bulk2: the sObject; named_import: the objectTypeId (0-1)
    operation: Literal["insert", "update", "upsert", "delete"] = "insert"
    external_id_field: NonEmpty | None = None
    line_ending: Literal["LF", "CRLF"] = "LF"
    columns: dict[NonEmpty, JsonField | JsonValue] = Field(min_length=1)
    # A job's record holds its rows' keys on one journal line (under 16 MiB): rows a job are bounded.
    max_rows: Annotated[int, Field(ge=1, le=150_000)] = 10_000
    max_bytes: Annotated[int, Field(ge=64, le=150_000_000)] = 100_000_000
    poll: BulkPollConfig = Field(default_factory=BulkPollConfig)
    steps: BulkGenericConfig | None = None  # kind: generic (and only it)

    @model_validator(mode="after")
    def _coherent(self) -> BulkJobConfig:
        if (self.kind == "generic") != (self.steps is not None):
            raise ValueError("request.bulk_job.steps goes with kind: generic (and only it)")
        if self.kind != "generic" and self.object == "-":
            raise ValueError(f"request.bulk_job.object is required with kind: {self.kind}")
        if self.kind == "named_import" and self.operation == "delete":
            raise ValueError("request.bulk_job: a named_import creates, updates or upserts (no delete)")
        if (self.operation == "upsert") != (self.external_id_field is not None):
            raise ValueError("request.bulk_job.external_id_field goes with operation: upsert (and only it)")
        if self.external_id_field is not None and self.external_id_field not in self.columns:
            raise ValueError(
                f"request.bulk_job.columns must hold the external id field {self.external_id_field}"
            )
        if compile_template(self.base_url).fields:
            raise ValueError("request.bulk_job.base_url cannot use a {field}: one URL serves every job")
        _nested_columns_fit(self)
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_steps(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.steps is None:
            data.pop("steps", None)  # a salesforce_bulk2 job's fingerprint stays what it was
        return data


class RequestConfig(_Model):
    method: Annotated[Method, BeforeValidator(_upper)]
    url: Annotated[str, AfterValidator(_url)]
    query: dict[str, TemplateText] = Field(default_factory=dict)
    headers: dict[HeaderName, HeaderValue] = Field(default_factory=dict)
    json_: Annotated[JsonNode, AfterValidator(_not_empty_json)] | None = Field(default=None, alias="json")
    form: dict[str, FormValue] | None = None
    body: Annotated[str, AfterValidator(_template)] | None = None
    content_type: Annotated[str, AfterValidator(_sendable_header_literal)] | None = None
    idempotency_key: IdempotencyKeyConfig | None = None
    batch: BatchConfig | None = None
    auth: AuthConfig | None = None
    # gzip: every body compressed (Content-Encoding: gzip), counted so against max_bytes. How the bytes
    # travel, not what they say: out of the fingerprint, like execution.client.
    compression: Literal["none", "gzip"] = "none"
    nulls: Nulls | None = None  # every leaf's `nulls` unless it sets its own (None: as before, like send)
    group: GroupConfig | None = None
    bulk_job: BulkJobConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _bulk_job_url(cls, data: Any) -> Any:
        """A bulk job names its endpoints under bulk_job: its base URL stands for request.url."""
        if isinstance(data, dict) and isinstance(job := data.get("bulk_job"), dict) and "url" not in data:
            return {"method": "POST", "url": job.get("base_url", ""), **data}
        return data

    @model_validator(mode="after")
    def _coherent(self) -> RequestConfig:
        bodies = (("json", self.json_), ("form", self.form), ("body", self.body))
        given = [name for name, value in bodies if value is not None]
        if len(given) > 1:
            raise ValueError(f"request has {' and '.join(given)}; use exactly one of json, form, body")
        if (self.body is None) != (self.content_type is None):
            raise ValueError("request.body and request.content_type go together")
        names = [name.lower() for name in self.headers]
        if len(set(names)) != len(names):
            raise ValueError("request.headers names a header twice (names are case-insensitive)")
        if self.body is not None and "content-type" in names:
            raise ValueError("with a body, set request.content_type instead of a Content-Type header")
        if self.idempotency_key is not None and self.idempotency_key.header.lower() in names:
            raise ValueError("request.headers also sets the idempotency_key header")
        if self.batch is not None:
            _batch_request_is_constant(self, given)
        if self.bulk_job is not None and (given or self.batch is not None):
            raise ValueError("request.bulk_job sends its rows as CSV columns: no json, form, body or batch")
        if isinstance(self.json_, JsonField) and self.json_.when_missing == "omit":
            raise ValueError("request.json is one {from: ...} value: when_missing: omit would leave no body")
        _rows_where_grouped(self)
        if self.auth is not None and "authorization" in names:
            raise ValueError("request.headers sets Authorization, which request.auth sends: keep one")
        if self.auth is not None:
            _auth_headers_free(self, names)
        if self.compression != "none" and "content-encoding" in names:
            raise ValueError(
                "request.headers sets Content-Encoding, which request.compression sends: keep one"
            )
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_parts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.batch is None:
            data.pop("batch", None)
        if self.bulk_job is None:
            data.pop("bulk_job", None)
        if self.auth is None:
            data.pop("auth", None)  # the fingerprint of a job without auth stays what it was
        data.pop("compression", None)  # operational: the fingerprint (item ids, keys) never holds it
        if self.nulls is None:
            data.pop("nulls", None)
        if self.group is None:
            data.pop("group", None)
        return data


def _auth_headers_free(req: RequestConfig, names: list[str]) -> None:
    """The headers request.auth sends are its own: neither request.headers nor the idempotency key
    names one (the signer would drop or replace it, or send it twice)."""
    assert req.auth is not None
    kind, own = _auth_headers(req.auth)
    taken = sorted(set(own) & set(names))
    if taken:
        raise ValueError(f"request.headers sets {taken[0]}, which request.auth.{kind} sends: keep one")
    key = req.idempotency_key.header if req.idempotency_key is not None else ""
    if key.lower() in own:
        raise ValueError(
            f"idempotency_key.header is {key}, which request.auth.{kind} sends: "
            "give the key a header of its own"
        )
    if "authorization" in own and kind == "hmac" and _url_has_credentials(req.url):
        raise ValueError(
            "request.auth.hmac sends Authorization, which the URL's user and password send too (Basic): "
            "keep one"
        )


def _auth_headers(auth: AuthConfig) -> tuple[str, frozenset[str]]:
    """The kind of request.auth, and the headers (lower case) it puts on each attempt."""
    if auth.hmac is not None:
        hmac = auth.hmac
        own = _HMAC_HEADERS.get(hmac.scheme) or tuple(h for h in (hmac.header, hmac.timestamp_header) if h)
        return "hmac", frozenset(name.lower() for name in own)
    if auth.aws_sigv4 is not None:
        return "aws_sigv4", _SIGV4_HEADERS
    return "oauth2", frozenset({"authorization"})


def _url_has_credentials(url: str) -> bool:
    """Whether the URL as written names a user (sent as Basic auth): `scheme://user:pass@host`."""
    _, separator, rest = url.partition("://")
    return bool(separator) and "@" in re.split(r"[/?#]", rest, maxsplit=1)[0]


_HMAC_HEADERS = {
    "standard_webhooks": ("webhook-id", "webhook-timestamp", "webhook-signature"),
    "github": ("x-hub-signature-256",),
}
_SIGV4_HEADERS = frozenset({"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"})


def _rows_where_grouped(req: RequestConfig) -> None:
    """`{rows: ...}` leaves: one, in request.json, of a grouped job, and none inside another."""
    found = list(_rows_leaves(req.json_)) if req.json_ is not None else []
    if req.group is None:
        if found:
            raise ValueError("a {rows: ...} leaf needs request.group: the rows of a group it lists")
        return
    if req.batch is not None or req.json_ is None:
        raise ValueError("request.group goes with request.json (not with batch, form or body)")
    if len(found) > 1 or any(inner for inner in found):
        raise ValueError("request.json holds at most one {rows: ...} leaf, and none inside it")


def _rows_leaves(node: Any) -> Iterator[bool]:
    """For each {rows: ...} leaf in the tree: whether another one sits inside it."""
    if isinstance(node, RowsLeaf):
        yield any(True for _ in _rows_leaves(node.rows))
    elif isinstance(node, dict):
        for child in node.values():
            yield from _rows_leaves(child)
    elif isinstance(node, WhenLeaf | CoalesceLeaf):
        children = (node.then, node.else_) if isinstance(node, WhenLeaf) else node.coalesce
        for child in children:
            yield from _rows_leaves(child)


def _batch_request_is_constant(req: RequestConfig, bodies: list[str]) -> None:
    """In batch mode one request carries many rows: its URL, query and headers cannot name a field."""
    if bodies:
        raise ValueError(
            f"request.{bodies[0]} and request.batch do not go together: in batch mode each row's part of "
            "the body is request.batch.item"
        )
    if req.method == "GET":
        raise ValueError("request.batch needs a method with a body (POST, PUT, PATCH or DELETE), not GET")
    places = [("request.url", req.url)]
    places += [(f"request.query.{name}", text) for name, text in req.query.items()]
    places += [(f"request.headers.{name}", text) for name, text in req.headers.items()]
    for place, text in places:
        fields = sorted(compile_template(text).fields)
        if fields:
            raise ValueError(
                f"{place} uses {{{fields[0]}}}: in batch mode (request.batch) the URL, query and headers are "
                "the same for every row of a request; put record fields in request.batch.item"
            )


# --- response, execution, retry, halt -------------------------------------------------------


Pointer = Annotated[str, AfterValidator(_json_pointer)]


class ItemsConfig(_Model):
    """`response.items`: how each row's outcome is read from a batch's answer (docs/batching.md)."""

    mode: Literal["whole", "positional", "by_index", "by_id"]
    results: Pointer | None = None  # positional: one entry per item, in order; by_id: the successes
    errors: Pointer | None = None  # by_index, by_id: the failures
    id: Pointer | None = None  # by_id: where a result names its item
    error_id: Pointer | None = None  # by_id: where an error names its item(s); default: id
    index: Pointer | None = None  # by_index: where an error names its item's position
    status: Pointer | None = None  # a per-item status, classified like a response's status
    success_statuses: Statuses | None = None  # an item status that is a success; None: any 2xx
    message: Pointer | None = None  # goes into the row's error
    unlisted: Literal["success", "failure"] = "success"  # by_index, by_id: an item named nowhere

    @model_validator(mode="after")
    def _fits_mode(self) -> ItemsConfig:
        needs = {
            "whole": (),
            "positional": ("results",),
            "by_index": ("errors", "index"),
            "by_id": ("id",),
        }[self.mode]
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"response.items mode {self.mode} needs {' and '.join(missing)}")
        allowed = {
            "whole": set(),
            "positional": {"results", "status", "success_statuses", "message"},
            "by_index": {"errors", "index", "status", "success_statuses", "message", "unlisted"},
            "by_id": {
                "results",
                "errors",
                "id",
                "error_id",
                "status",
                "success_statuses",
                "message",
                "unlisted",
            },
        }[self.mode]
        if self.success_statuses is not None and self.status is None:
            raise ValueError("response.items.success_statuses judges item statuses: it needs status")
        extra = sorted((self.model_fields_set - {"mode"}) - allowed)
        if extra:
            raise ValueError(f"response.items mode {self.mode} does not read {', '.join(extra)}")
        if self.mode == "by_id" and self.results is None and self.errors is None:
            raise ValueError("response.items mode by_id needs results, errors or both")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_success_statuses(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.success_statuses is None:
            data.pop("success_statuses", None)  # jobs written before it keep their fingerprint (item ids)
        return data


class ResponseConfig(_Model):
    success_statuses: Statuses | None = None  # None: any 2xx (applied by relay/retry's RetryPolicy)
    capture: dict[NonEmpty, Annotated[str, AfterValidator(_json_pointer)]] = Field(default_factory=dict)
    failure_body_bytes: Annotated[int, Field(ge=0, le=MAX_BODY_BYTES)] = 2048
    items: ItemsConfig | None = None  # batch mode only; None there: mode whole
    on_batch_rejected: Literal["split", "fail_all"] | None = None  # batch mode only; None: split

    @model_serializer(mode="wrap")
    def _omit_batch_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in ("items", "on_batch_rejected"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class TimeoutConfig(_Model):
    connect_seconds: Seconds = 10.0
    read_seconds: Seconds = 30.0
    write_seconds: Seconds = 30.0
    pool_seconds: Seconds = 5.0


REDIS_URL = re.compile(r"^(redis|rediss|unix)://\S+$")
WHOLE_SECRET = re.compile(r"^\$\{([A-Z_][A-Z0-9_]*)\}$")  # `shared: "${REDIS_URL}"`: read when the job runs
# An unencoded credential: the shared rule (job/redact.py), so every URL is read the same way.
REDIS_URL_AT_PAST_HOST = UNENCODED_CREDENTIALS


def redis_url_problem(value: str) -> str | None:
    """Why `value` is no Redis URL BulkRelay can use and name safely, or None when it is one."""
    if not REDIS_URL.match(value):
        return "is not a Redis URL such as redis://host:6379/0 (rediss:// for TLS, unix:// for a socket)"
    if unencoded_credentials(value):
        return REDIS_URL_AT_PAST_HOST
    return None


def _redis_url(value: str) -> str:
    if WHOLE_SECRET.match(value):
        return value
    problem = redis_url_problem(value)  # the same checks as a ${NAME} secret's value gets
    if problem == REDIS_URL_AT_PAST_HOST:
        raise ValueError(problem)
    if problem is not None:
        raise ValueError(f"{problem}, nor a ${{NAME}} secret holding one")
    return value


class RateLimitConfig(_Model):
    requests_per_second: RequestsPerSecond
    shared: Annotated[str, AfterValidator(_redis_url)] | None = None  # one limit for every shard, in Redis
    shared_key: NonEmpty | None = (
        None  # jobs naming the same key share one limit; default: the target's origin
    )


def _proxy(value: str) -> str:
    if value in ("none", "environment"):
        return value
    if not re.match(r"^(https?|socks5h?)://[^/\s]+/?$", value):
        raise ValueError("must be 'none', 'environment' or a proxy URL such as http://proxy.internal:3128")
    refusal = proxy_refusal(value)
    if refusal is not None:
        raise ValueError(f"not a proxy URL the HTTP client can use: {refusal}")
    return value


def _workers_setting(value: Any) -> Any:
    """`execution.workers`: a count or `auto`, said in one message (a union's would be two)."""
    if value == "auto" or (type(value) is int and 1 <= value <= MAX_WORKERS):
        return value
    raise ValueError(f"workers {value!r}: expected auto or a whole number from 1 to {MAX_WORKERS}")


class TlsConfig(_Model):
    client_cert: NonEmpty  # PEM: the certificate chain, and the key too unless client_key names it
    client_key: NonEmpty | None = None


class ExecutionConfig(_Model):
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 8
    timeout: TimeoutConfig = Field(default_factory=TimeoutConfig)
    rate_limit: RateLimitConfig | None = None  # None: unlimited
    idle_timeout_seconds: Seconds = 300.0
    max_lifetime_seconds: Seconds = 604800.0
    http2: bool = False
    # While relaying, the process's threads share the CPU it runs on (relay/affinity.py): faster on a
    # machine of few cores. How the rows travel, not what they say: out of the fingerprint.
    pin_cpu: bool = True
    # One run in this many processes, each on a CPU of its own (ops/workers.py); `auto`: one per CPU this
    # process may use, at most 8. How the rows travel, not what they say: out of the fingerprint.
    workers: Annotated[int | Literal["auto"], BeforeValidator(_workers_setting)] = 1
    client: Literal["reqwest", "httpx"] = DEFAULT_CLIENT
    proxy: Annotated[str, AfterValidator(_proxy)] = DEFAULT_PROXY
    tls: TlsConfig | None = None
    # full: every row, every run; delta: only rows whose request changed since it was last delivered
    # (docs/delta.md). Left out of the fingerprint when full, so older runs keep theirs.
    sync: Literal["full", "delta", "mirror"] = "full"

    @model_serializer(mode="wrap")
    def _omit_default_sync(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.sync == "full":
            data.pop("sync", None)
        return data


# How the requests travel, not what they say: changing these never blocks a resume.
_OPERATIONAL_EXECUTION_KEYS = ("client", "proxy", "tls", "pin_cpu", "workers")
# Where the shared limit is kept, not what it is (the rate is semantic): moving Redis never blocks a resume.
_OPERATIONAL_RATE_LIMIT_KEYS = ("shared", "shared_key")
# Who asks for the token and how, not what it grants: rotating a client never blocks a resume.
_OPERATIONAL_OAUTH2_KEYS: tuple[str, ...] = (
    "client_id",
    "client_secret",
    "client_auth",
    "refresh_before_seconds",
)
_OPERATIONAL_OAUTH2_KEYS += ("private_key", "private_key_file", "default_expires_in_seconds")

DEFAULT_GONE_STATUSES = (404, 410)
_PERCENT = re.compile(r"(100|[0-9]{1,2})(\.[0-9]+)?%")


def _max_deletes(value: Any) -> Any:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and _PERCENT.fullmatch(value.strip()):
        return value.strip()
    raise ValueError(f"max_deletes {value!r}: expected a count (like 100) or a percentage (like 5%)")


class MirrorConfig(_Model):
    """`sync: mirror`: the request sent for a key delivered before and gone from tonight's input."""

    method: Annotated[Method, BeforeValidator(_upper)] = "DELETE"
    url: Annotated[str, AfterValidator(_url)]  # may use only the input.key field
    # At most this many deletions a run (a count, or a percentage of the keys delivered so far);
    # more halts the run before anything is sent: a bad export must not delete half the customers.
    max_deletes: Annotated[int | str, BeforeValidator(_max_deletes)]
    # How a key gone tonight is compared with tonight's keys (docs/delta.md): exact (as written),
    # nfc (one Unicode form: a target that normalizes), casefold (and one case: a case-insensitive
    # target). Unset: exact, but a night where a deletion and an upsert are one key under casefold/NFC
    # is refused (MIRROR_KEY_COLLISION): `PUT abc` then `DELETE ABC` loses the record on such a target.
    key_match: Literal["exact", "nfc", "casefold"] | None = None
    # Answers to a deletion meaning "already gone": a success (the key leaves the state). [] to fail.
    gone_statuses: Statuses = DEFAULT_GONE_STATUSES

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Left out when unset, so the fingerprints of earlier mirror jobs stay what they were."""
        data: dict[str, Any] = handler(self)
        if self.key_match is None:
            data.pop("key_match", None)
        if self.gone_statuses == DEFAULT_GONE_STATUSES:
            data.pop("gone_statuses", None)
        return data

    def delete_limit(self, delivered_keys: int) -> int:
        if isinstance(self.max_deletes, int):
            return self.max_deletes
        return int(delivered_keys * float(self.max_deletes[:-1]) / 100)


class RetryConfig(_Model):
    max_attempts: Annotated[int, Field(ge=1, le=100)] = DEFAULT_MAX_ATTEMPTS  # includes the first request
    statuses: Annotated[Statuses, AfterValidator(_no_success)] = DEFAULT_RETRY_STATUSES
    initial_backoff_seconds: PauseSeconds = DEFAULT_INITIAL_BACKOFF_SECONDS
    max_backoff_seconds: PauseSeconds = DEFAULT_MAX_BACKOFF_SECONDS
    jitter_ratio: Annotated[float, Field(ge=0, le=1)] = DEFAULT_JITTER_RATIO
    respect_retry_after: bool = DEFAULT_RESPECT_RETRY_AFTER
    # The longest pause a Retry-After or a quota reset may impose; a target asking for a day gets this.
    # Timing only, like the Retry-After it caps: left out of the fingerprint (`config_semantic_dict`).
    max_retry_after_seconds: Seconds = DEFAULT_MAX_RETRY_AFTER_SECONDS

    @model_validator(mode="after")
    def _backoff_order(self) -> RetryConfig:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("retry.max_backoff_seconds is below retry.initial_backoff_seconds")
        return self


class FailureRateHalt(_Model):
    """`halt.failure_rate`: stop once more than `above` of this call's committed rows failed, judged
    from its `after_rows`-th row on, in row order (bulkrelay.relay.engine)."""

    above: Annotated[float, Field(ge=0, lt=1)]
    after_rows: Annotated[int, Field(ge=1)] = 100


class HaltConfig(_Model):
    on_statuses: Statuses = DEFAULT_HALT_STATUSES
    consecutive_failures: Annotated[int, Field(ge=1)] = 100
    failure_rate: FailureRateHalt | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_failure_rate(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Absent, it is left out, so the fingerprint of a job without it is what it always was.
        data: dict[str, Any] = handler(self)
        if self.failure_rate is None:
            data.pop("failure_rate", None)
        return data


def _var_names(names: tuple[str, ...]) -> tuple[str, ...]:
    for name in names:
        if not SECRET_NAME.fullmatch(name):
            raise ValueError(f"vars: {name!r} is not a variable name (capitals, digits and _, like API_BASE)")
    if len(set(names)) != len(names):
        raise ValueError("vars names a variable twice")
    return names


_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?")
_SINK_SCHEMES = ("sqlite:", "postgresql:", "postgres:")


class ResultsConfig(_Model):
    """`results: {to, table}`: where each row's latest outcome is upserted (docs/chains.md)."""

    to: NonEmpty  # sqlite:///results.db, postgresql://... ("${DATABASE_URL}"), results.csv, results.jsonl
    table: str = "bulkrelay_results"

    @model_validator(mode="after")
    def _known_sink(self) -> ResultsConfig:
        to = self.to.lower()
        if not to.startswith((*_SINK_SCHEMES, "${")) and not to.endswith((".csv", ".jsonl")):
            raise ValueError(
                "results.to is sqlite:///FILE, postgresql://..., or a file ending .csv or .jsonl"
            )
        if not _TABLE_NAME.fullmatch(self.table):
            raise ValueError(
                f"results.table {self.table!r} is not a table name (letters, digits, _; schema.table)"
            )
        if to.rstrip("/") in ("sqlite:", "sqlite://"):  # sqlite:/// with no file: known now, not at run time
            raise ValueError("results.to sqlite:/// names no database file (sqlite:///results.db)")
        if self.table.lower().split(".")[-1].startswith(("sqlite_", "pg_")):
            raise ValueError(
                f"results.table {self.table!r} is a name the database keeps for its own catalog tables"
            )
        return self


class LookupConfig(_Model):
    """One of `lookups:`: a key -> value map built once per run (docs/chains.md#lookups)."""

    results_of: NonEmpty | None = None  # another job's successful rows, by its name:
    value: Annotated[str, AfterValidator(_json_pointer)] | None = None  # with results_of: /captured/id
    query: NonEmpty | None = None  # first column the key, second the value
    database: NonEmpty | None = None  # with query: postgresql://... or sqlite:///path, "${DATABASE_URL}"
    get: Annotated[str, AfterValidator(_url)] | None = None  # a paginated GET (docs/chains.md#lookups)
    items: Annotated[str, AfterValidator(_json_pointer)] = (
        ""  # with get: the list in each page ("": the page)
    )
    key: Annotated[str, AfterValidator(_json_pointer)] | None = None  # with get: in each item
    next: Annotated[str, AfterValidator(_json_pointer)] | None = None  # with get; None: the Link header
    max_pages: Annotated[int, Field(ge=1, le=100_000)] = 100

    @model_validator(mode="after")
    def _one_source(self) -> LookupConfig:
        if [self.results_of, self.query, self.get].count(None) != 2:
            raise ValueError("a lookup reads one of results_of (another job's results), query, get")
        if self.get is not None:
            if self.key is None or self.value is None or self.database is not None:
                raise ValueError("a get lookup names key and value (pointers into each item), no database")
            return self
        if self.results_of is not None and (self.value is None or self.database is not None):
            raise ValueError("a results_of lookup names its value (a pointer: /captured/id), no database")
        if self.query is not None and (self.database is None or self.value is not None):
            raise ValueError("a query lookup needs database (its first column the key, its second the value)")
        return self


class NotifyConfig(_Model):
    """`notify:` one message when a run ends as named (docs/configuration.md#notify); operational: never
    in the fingerprint. The webhook is usually a secret (`${SLACK_WEBHOOK_URL}`), read when it is sent."""

    on: Annotated[
        tuple[Literal["success", "failure", "halt"], ...],
        BeforeValidator(lambda v: (v,) if isinstance(v, str) else _list_as_tuple(v)),
    ]
    webhook: str
    format: Literal["slack", "json"] = "json"

    @field_validator("on")
    @classmethod
    def _names_an_ending(cls, on: tuple[str, ...]) -> tuple[str, ...]:
        if not on:
            raise ValueError("notify.on names when to send: success, failure or halt (an empty list: never)")
        return on

    @model_validator(mode="after")
    def _no_row_field(self) -> NotifyConfig:
        if compile_template(self.webhook).fields:
            raise ValueError("notify.webhook is sent once a run: ${NAME} secrets only, no {field} of a row")
        return self


class JobConfig(_Model):
    version: Literal[1]
    name: str | None = None
    # `${NAME}`s that are settings, not secrets (`${API_BASE}`): read from the environment like a secret,
    # but shown by `render` and never redacted. In the fingerprint (names only) when there are any.
    vars: Annotated[tuple[str, ...], BeforeValidator(_list_as_tuple), AfterValidator(_var_names)] = ()
    input: InputConfig = Field(default_factory=InputConfig)
    request: RequestConfig
    response: ResponseConfig = Field(default_factory=ResponseConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    halt: HaltConfig = Field(default_factory=HaltConfig)
    mirror: MirrorConfig | None = None
    results: ResultsConfig | None = None  # operational: never in the fingerprint
    lookups: dict[NonEmpty, LookupConfig] = Field(default_factory=dict)
    notify: Annotated[tuple[NotifyConfig, ...], BeforeValidator(_list_as_tuple)] = ()

    @model_validator(mode="after")
    def _sync_settings(self) -> JobConfig:
        sync = self.execution.sync
        if sync != "full" and self.input.key is None:
            raise ValueError(f"execution.sync: {sync} needs input.key to name each record")
        if sync != "full" and self.request.group is not None:
            raise ValueError(f"execution.sync: {sync} sends the rows that changed, request.group whole ones")
        if (sync == "mirror") != (self.mirror is not None):
            raise ValueError("execution.sync: mirror and the mirror section (url, max_deletes) go together")
        if self.mirror is not None and not compile_template(self.mirror.url).fields <= {self.input.key}:
            raise ValueError(f"mirror.url may use only the key field {{{self.input.key}}}: the row is gone")
        if self.request.batch is None:
            given = [k for k in ("items", "on_batch_rejected") if getattr(self.response, k) is not None]
            if given:
                raise ValueError(f"response.{given[0]} reads a batch's answer: it needs request.batch")
        if self.request.bulk_job is not None:
            _bulk_job_fits(self)
        _workers_fit(self)
        unused = sorted(set(self.vars) - environment_names(self))
        if unused:
            raise ValueError(f"vars names {', '.join(unused)}, which no ${{NAME}} of the job uses")
        if self.request.auth is not None:
            _vars_not_secret(self.request.auth, self.vars)
        _lookups_defined(self)
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_mirror(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.mirror is None:
            data.pop("mirror", None)
        if not self.vars:
            data.pop("vars", None)  # a job without vars keeps the fingerprint it had
        if self.results is None:
            data.pop("results", None)
        if not self.lookups:
            data.pop("lookups", None)
        if not self.notify:
            data.pop("notify", None)
        return data


def _vars_not_secret(auth: AuthConfig, names: tuple[str, ...]) -> None:
    """`vars` are shown: none may name a client secret, a key or an HMAC secret."""
    oauth2 = auth.oauth2
    kept = [("client_secret", "client secret", oauth2.client_secret if oauth2 else None)]
    kept.append(("private_key", "private key", oauth2.private_key if oauth2 else None))
    kept += [("secret", "HMAC secret", text) for text in (auth.hmac.secrets if auth.hmac else ())]
    for key, what, text in kept:
        if text is not None and set(names) & compile_template(text).secrets:
            raise ValueError(f"vars names the {key}'s variable: a {what} is never shown")


def _bulk_job_fits(config: JobConfig) -> None:
    """What a bulk job needs of the rest of the job file, and what it does not do (yet)."""
    if config.input.key is None:
        raise ValueError("request.bulk_job needs input.key: each row's result is matched by its key")
    if config.execution.sync == "mirror":  # its deletions are requests of their own (mirror.url)
        raise ValueError("request.bulk_job works with execution.sync: full or delta (mirror: not yet)")
    if config.request.compression != "none":
        raise ValueError("request.bulk_job uploads its CSV as it is (request.compression: not yet)")


def _workers_fit(config: JobConfig) -> None:
    workers = config.execution.workers
    if (kind := many_rows_a_request(config)) is not None and workers not in {"auto", 1}:
        raise ValueError(
            f"execution.workers: {workers} splits a run's rows one request each; request.{kind} sends "
            "many rows a request, in one process (workers: 1, or auto)"
        )


def many_rows_a_request(config: JobConfig) -> str | None:
    """`batch`, `group` or `bulk_job` when the job sends many rows a request: in one process, for several
    worker processes send rows one request each (`workers: auto` runs such a job in one); else None."""
    req = config.request
    kind = "batch" if req.batch is not None else "group" if req.group is not None else None
    return "bulk_job" if req.bulk_job is not None else kind


def environment_names(config: JobConfig) -> set[str]:
    """Every `${NAME}` the job reads from the environment (secrets and vars)."""
    req = config.request
    texts = [req.url, *req.query.values(), *req.headers.values(), req.body or ""]
    texts += [value for value in (req.form or {}).values() if isinstance(value, str)]
    if config.mirror is not None:
        texts.append(config.mirror.url)
    if req.auth is not None:
        texts += req.auth.texts()
    return {name for text in texts for name in compile_template(text).secrets}


# --- loading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A loaded job file: its configuration, its resolved path and the directory paths are relative to."""

    config: JobConfig
    path: Path
    base_dir: Path
    deprecations: tuple[Problem, ...] = ()  # the public alpha's spellings it used, with their new ones
    lines: LineMap = field(default_factory=LineMap)  # the line of every YAML path, for later problems
    # The `lookups:` maps, built (or read frozen) by the caller before preflight: name -> key -> value.
    lookups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def input_path(self) -> Path | None:
        file = self.config.input.file
        return None if file is None else self.base_dir / file

    def problem_at(self, path: YamlPath, message: str, **place: Any) -> Problem:
        """A problem pointing at `path` in this job file (file, line, YAML path)."""
        line = self.lines.line(path)
        return Problem(message, file=str(self.path), line=line, path=format_path(path), **place)


def required_fields(config: JobConfig) -> dict[str, YamlPath]:
    """Every record field the job cannot do without, with the first YAML path that names it.

    A `json` leaf with a `default` or a `when_missing` is left out: its field may be absent. A JSON
    pointer (`from: /address/city`) needs its first field (`address`)."""
    req = config.request
    places: list[tuple[YamlPath, str]] = [(("request", "url"), req.url)]
    places += [(("request", "query", name), text) for name, text in req.query.items()]
    places += [(("request", "headers", name), text) for name, text in req.headers.items()]
    places += [(("request", "form", name), v) for name, v in (req.form or {}).items() if isinstance(v, str)]
    if req.body is not None:
        places.append((("request", "body"), req.body))
    found: dict[str, YamlPath] = {}
    for path, text in places:
        for name in sorted(compile_template(text).fields):
            found.setdefault(name, path)
    for name, leaf in (req.form or {}).items():
        if isinstance(leaf, FormField):
            found.setdefault(leaf.from_, ("request", "form", name, "from"))
    if req.json_ is not None:
        for path, json_leaf in _json_fields(req.json_, ("request", "json")):
            found.setdefault(json_leaf.field, (*path, "from"))
    for name, path in _item_fields(req.batch):
        found.setdefault(name, path)
    if config.input.key is not None:
        found.setdefault(config.input.key, ("input", "key"))
    if req.group is not None:
        found.setdefault(req.group.by, ("request", "group", "by"))
    return found


def _item_fields(batch: BatchConfig | None) -> Iterator[tuple[str, YamlPath]]:
    """The fields a batch item cannot do without (a lookup's key among them), with their YAML paths."""
    for item_path, node in batch.item_nodes() if batch is not None else ():
        for path, leaf in item_leaves(node, item_path):
            if isinstance(leaf, JsonField) and not leaf.has_default:
                yield leaf.field, (*path, "from")
            elif isinstance(leaf, JsonLookup) and not leaf.key.optional:
                yield leaf.key.field, (*path, "key", "from")


def _lookups_defined(config: JobConfig) -> None:
    """Each lookup leaf names a lookup of `lookups:`; one in a batch item misses with fail or null: a
    batch's rows go together, so none can be left unsent as `skip` would (docs/chains.md)."""
    req = config.request
    leaves = list(_lookup_leaves(req.json_, ("request", "json")))
    for item_path, node in req.batch.item_nodes() if req.batch is not None else ():
        for path, leaf in _lookup_leaves(cast("JsonNode", node), item_path):
            if leaf.on_miss == "skip":
                raise ValueError(
                    f"{format_path(path)}: on_miss: skip cannot leave a row out of a batch (its rows are "
                    "sent together); use on_miss: fail (preflight names each miss) or null"
                )
            leaves.append((path, leaf))
    for path, leaf in leaves:
        if leaf.lookup not in config.lookups:
            where = format_path(path[:2]) if path[:2] == ("request", "json") else format_path(path)
            raise ValueError(f"{where} reads lookup {leaf.lookup}, which lookups: does not define")


def _lookup_leaves(node: JsonNode | None, path: YamlPath) -> Iterator[tuple[YamlPath, JsonLookup]]:
    if isinstance(node, JsonLookup):
        yield path, node
    for key, child in _children(node):
        yield from _lookup_leaves(child, (*path, key))


def _children(node: JsonNode | None) -> Iterator[tuple[str | int, JsonNode]]:
    """The nodes inside `node`: an object's values, a when's branches, a coalesce's choices, a rows' row."""
    if isinstance(node, dict):
        yield from node.items()
    elif isinstance(node, WhenLeaf):
        yield "then", node.then
        if node.else_ is not None:
            yield "else", node.else_
    elif isinstance(node, CoalesceLeaf):
        yield from enumerate(node.coalesce)
    elif isinstance(node, RowsLeaf):
        yield "rows", node.rows


def _json_fields(node: JsonNode, path: YamlPath) -> Iterator[tuple[YamlPath, JsonField]]:
    if isinstance(node, JsonLookup):
        node = node.key
        path = (*path, "key")
    if isinstance(node, JsonField):
        if not node.optional:
            yield path, node
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from _json_fields(child, (*path, key))


def load_job(path: Path) -> Job:
    """Read and validate a job file. Raises `NotFound`, or `ConfigInvalid` naming every problem's line."""
    resolved = path.resolve()
    try:
        text = resolved.read_text(encoding="utf-8-sig")
    except IsADirectoryError:  # no job file there either (exit 5), but say what is
        raise NotFound(f"job file is a directory: {path}", context={"path": str(path)}) from None
    except (FileNotFoundError, NotADirectoryError):
        raise NotFound(f"job file not found: {path}", context={"path": str(path)}) from None
    except OSError as exc:  # permission denied, an I/O error: there, but not readable by us
        raise JobFileUnreadable(
            f"cannot read job file {path}: {exc.strerror or exc}",
            context={"path": str(path), "errno": exc.errno, "os_error": exc.strerror},
            suggestion="check the file's permissions, or run as the user who owns it",
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigInvalid([Problem(f"not UTF-8 text ({exc.reason})", file=str(path))]) from None
    config, lines, deprecations = _parse_job(text, file=str(path))
    return Job(config, resolved, resolved.parent, tuple(deprecations), lines)


def parse_job(text: str, *, file: str) -> JobConfig:
    """Validate job file text; `file` names it in problems."""
    return _parse_job(text, file=file)[0]


def parse_job_with_deprecations(text: str, *, file: str) -> tuple[JobConfig, list[Problem]]:
    """Validate job file text, reading the public alpha's spellings; also one note per such spelling."""
    config, _, deprecations = _parse_job(text, file=file)
    return config, deprecations


def _parse_job(text: str, *, file: str) -> tuple[JobConfig, LineMap, list[Problem]]:
    raw, lines = load_yaml(text, file)
    if not isinstance(raw, dict):
        raise ConfigInvalid(
            [Problem("a job file is a mapping (version, input, request, ...)", file=file, line=1)]
        )
    raw, deprecations = upgrade_alpha_spellings(raw, lines, file)
    try:
        return JobConfig.model_validate(raw), lines, deprecations
    except ValidationError as exc:
        raise ConfigInvalid(_problems(exc, raw, lines, file)) from None


def config_semantic_dict(config: JobConfig) -> dict[str, Any]:
    """Everything that changes what the job does, as JSON-able data: all but `name`, `input.file`,
    `retry.max_retry_after_seconds` (how long a pause may last changes no request), the transport's
    operational settings (client, proxy, TLS identity, CPU pinning, where a shared limit is kept) and
    who asks for an OAuth2 token (client id and secret, how it authenticates, when it refreshes)."""
    data: dict[str, Any] = config.model_dump(mode="json", by_alias=True)
    del data["name"]
    data.pop("results", None)  # where results are kept changes no request
    data.pop("notify", None)  # whom a night's end is told: operational, never the job's identity
    del data["input"]["file"]
    del data["retry"]["max_retry_after_seconds"]
    for key in _OPERATIONAL_EXECUTION_KEYS:
        del data["execution"][key]
    if data["execution"]["rate_limit"] is not None:
        for key in _OPERATIONAL_RATE_LIMIT_KEYS:
            del data["execution"]["rate_limit"][key]
    oauth2 = data["request"].get("auth", {}).get("oauth2")
    for key in _OPERATIONAL_OAUTH2_KEYS if oauth2 is not None else ():
        oauth2.pop(key, None)
    return data


def _problems(exc: ValidationError, raw: dict[str, Any], lines: LineMap, file: str) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for error in exc.errors(include_url=False):
        path = _yaml_path(raw, error["loc"])
        if error["type"] == "missing":
            path = (*path, str(error["loc"][-1]))
        message = _message(error, path)
        if not path:  # a check of the whole job: its message names the field first
            path = _named_path(raw, message)
        where = format_path(path)
        if (where, message) not in seen:
            seen.add((where, message))
            problems.append(Problem(message, file=file, line=lines.line(path), path=where or None))
    return sorted(problems, key=lambda problem: problem.line or 0)


# "execution.workers: 2 splits ...", "request.bulk_job needs input.key": the dotted key a message begins with
_LEADING_KEY = re.compile(r"[a-z_]+(?:\.[a-z_]+)+")


def _named_path(raw: dict[str, Any], message: str) -> YamlPath:
    """Where a check of the whole job points: the key its message begins with, or the nearest section of
    it the file has (the key may be a default); the file's first line when the message names none."""
    leading = _LEADING_KEY.match(message)
    return _yaml_path(raw, tuple(leading.group().split("."))) if leading else ()


def _yaml_path(raw: Any, loc: tuple[int | str, ...]) -> YamlPath:
    """Follow a pydantic `loc` through the YAML data, skipping union tags and other non-keys."""
    path: list[str | int] = []
    node = raw
    for part in loc:
        is_key = isinstance(node, dict) and isinstance(part, str) and part in node
        is_index = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if is_key or is_index:
            node = node[part]
            path.append(part)
    return tuple(path)


def _message(error: ErrorDetails, path: YamlPath) -> str:
    kind = error["type"]
    if kind == "missing":
        return f"missing required key {path[-1]!r}"
    if kind == "extra_forbidden":
        return _unknown_key_message(str(path[-1]) if path else "?", error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if kind not in ("value_error", "json_node", "form_value") and not isinstance(value, dict | list):
        message += f" (got {value!r})"
    return message


def _unknown_key_message(key: str, loc: tuple[int | str, ...]) -> str:
    """Suggest only keys valid at this level: a key valid elsewhere (`timeout` under `retry`) would
    otherwise be offered as its own correction. Where the key does belong is said instead."""
    model = _model_at(loc[:-1])
    here = _keys_of(model) if model is not None else {k for keys in map(_keys_of, _LEVELS) for k in keys}
    close = difflib.get_close_matches(key, sorted(here - {key}), n=1, cutoff=0.75)
    message = f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    places = [label for level, label in _LEVELS.items() if level is not model and key in _keys_of(level)]
    if places:
        message += f"; {key!r} belongs in {' or '.join(dict.fromkeys(places))}"
    return message


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model a pydantic `loc` leads to from `JobConfig`, following fields, dict values, list items
    and union tags (`~from`); None where it leads to no single model."""
    node: Any = JobConfig
    for part in loc:
        node = _step(node, part)
    models = [alt for alt, _ in _alternatives(node) if isinstance(alt, type) and issubclass(alt, BaseModel)]
    return models[0] if len(models) == 1 else None


def _step(node: Any, part: int | str) -> Any:
    for alt, tag in _alternatives(node):
        if isinstance(part, str) and part.startswith("~"):
            if tag == part:
                return alt
        elif isinstance(alt, type) and issubclass(alt, BaseModel):
            for name, info in alt.model_fields.items():
                if part in (name, info.alias):
                    return info.annotation
        elif get_origin(alt) in (dict, tuple, list):
            return get_args(alt)[-1]
    return None


def _alternatives(node: Any, tag: str | None = None) -> Iterator[tuple[Any, str | None]]:
    """The types a type annotation may be (through aliases, `Annotated` and unions), each with its tag."""
    if isinstance(node, TypeAliasType):
        yield from _alternatives(node.__value__, tag)
    elif get_origin(node) is Annotated:
        node, *metadata = get_args(node)
        found = next((m.tag for m in metadata if isinstance(m, Tag)), tag)
        yield from _alternatives(node, found)
    elif get_origin(node) in (Union, UnionType):
        for alt in get_args(node):
            yield from _alternatives(alt, tag)
    elif node is not None and node is not type(None):
        yield node, tag


def _keys_of(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


# Every level of the job file, with the words that name it in a message.
_LEVELS: dict[type[BaseModel], str] = {
    JobConfig: "the top level", InputConfig: "input", RequestConfig: "request",
    JsonField: "a request.json {from: ...} leaf", JsonValue: "a request.json {value: ...} leaf",
    FormField: "a request.form {from: ...} value", IdempotencyKeyConfig: "request.idempotency_key",
    BatchConfig: "request.batch", JsonMeta: "a request.batch.item {meta: ...} leaf",
    ItemsConfig: "response.items", FormatLeaf: "a {format: ...} leaf", CoalesceLeaf: "a {coalesce: ...} leaf",
    WhenLeaf: "a {when: ...} leaf", Condition: "a when: test", LiquidLeaf: "a {liquid: ...} leaf",
    RowsLeaf: "a {rows: ...} leaf", GroupConfig: "request.group",
    AuthConfig: "request.auth", OAuth2Config: "request.auth.oauth2",
    AwsSigV4Config: "request.auth.aws_sigv4", HmacConfig: "request.auth.hmac",
    ResponseConfig: "response", ExecutionConfig: "execution", TimeoutConfig: "execution.timeout",
    RateLimitConfig: "execution.rate_limit", RetryConfig: "retry", HaltConfig: "halt",
}  # fmt: skip
