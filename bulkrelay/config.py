"""The job file, version 1: frozen pydantic models, and `load_job()`, the one way to read it.

Every model forbids unknown keys and validates strictly (no "8" for 8, no true for 1). A
validation error becomes `ConfigInvalid` whose problems name the YAML path and its line.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

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
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails
from typing_extensions import TypeAliasType

from bulkrelay.alphacompat import upgrade_alpha_spellings
from bulkrelay.errors import ConfigInvalid, NotFound, Problem
from bulkrelay.template import SecretRef, compile_template
from bulkrelay.yamlload import LineMap, format_path, load_yaml
from bulkrelay.yamlload import Path as YamlPath

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
FieldType = Literal["integer", "number", "boolean", "json", "string"]

_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_JSON_POINTER = re.compile(r"(/([^~/]|~[01])*)*")
_SECRET_REFERENCE = re.compile(r"\$\{[A-Z_][A-Z0-9_]*\}")
DEFAULT_RETRY_STATUSES = (408, 425, 429, 500, 502, 503, 504)


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
    return text


def _header_name(name: str) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid HTTP header name")
    return name


def _single_line(text: str) -> str:
    if "\r" in text or "\n" in text:
        raise ValueError("a header value must be a single line")
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


TemplateText = Annotated[str, BeforeValidator(_int_as_text), AfterValidator(_template)]
HeaderValue = Annotated[
    str, BeforeValidator(_int_as_text), AfterValidator(_single_line), AfterValidator(_template)
]
HeaderName = Annotated[str, AfterValidator(_header_name)]
NonEmpty = Annotated[str, AfterValidator(_non_empty)]
StatusCode = Annotated[int, Field(ge=100, le=599)]
Statuses = Annotated[tuple[StatusCode, ...], BeforeValidator(_list_as_tuple), AfterValidator(_unique)]
Seconds = Annotated[float, Field(gt=0)]


# --- input ----------------------------------------------------------------------------------


class InputConfig(_Model):
    file: NonEmpty | None = None
    format: Annotated[Literal["csv", "jsonl"] | None, BeforeValidator(_input_format)] = None
    key: NonEmpty | None = None
    delimiter: str = ","
    encoding: Annotated[Literal["utf-8"], BeforeValidator(_encoding)] = "utf-8"

    @model_validator(mode="after")
    def _delimiter_is_for_csv(self) -> InputConfig:
        if len(self.delimiter) != 1 or self.delimiter in '\r\n"':
            raise ValueError("input.delimiter must be one character other than a quote or a newline")
        if self.format == "jsonl" and "delimiter" in self.model_fields_set:
            raise ValueError("input.delimiter applies to CSV input only")
        return self


# --- request: the json body tree ------------------------------------------------------------

_TYPE_CHECKS: dict[str, type | tuple[type, ...]] = {"integer": int, "number": (int, float), "boolean": bool}


class JsonField(_Model):
    """`{from: field, type?: ..., default?: ...}`: a value taken from the record."""

    from_: NonEmpty = Field(alias="from")
    type: FieldType | None = None  # None: as read (CSV text stays text, JSON Lines values keep their type)
    default: Any = None  # used when the field is absent or null, or empty under a non-string type

    @property
    def has_default(self) -> bool:
        return "default" in self.model_fields_set

    @model_validator(mode="after")
    def _default_fits_type(self) -> JsonField:
        if not self.has_default or self.default is None or self.type in (None, "json"):
            return self
        expected = str if self.type == "string" else _TYPE_CHECKS[self.type]
        if (isinstance(self.default, bool) and self.type != "boolean") or not isinstance(
            self.default, expected
        ):
            raise ValueError(f"default {self.default!r} is not a valid {self.type}")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_default(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.has_default:
            data.pop("default", None)
        return data


class JsonValue(_Model):
    """`{value: literal}`: the same value in every request."""

    value: Any

    @model_validator(mode="after")
    def _no_secret_references(self) -> JsonValue:
        if _mentions_secret(self.value):
            raise ValueError(
                "json values are literal; ${NAME} secrets work in url, query, headers, form and body"
            )
        return self


def _mentions_secret(value: Any) -> bool:
    if isinstance(value, str):
        return _SECRET_REFERENCE.search(value) is not None
    if isinstance(value, dict):
        return any(_mentions_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(_mentions_secret(v) for v in value)
    return False


def _json_node_kind(value: Any) -> str | None:
    """A mapping is a leaf when it has a string `from`, or is exactly `{value: ...}`; else an object."""
    if isinstance(value, JsonField | JsonValue):
        return "~from" if isinstance(value, JsonField) else "~value"
    if isinstance(value, dict):
        if isinstance(value.get("from"), str):
            return "~from"
        return "~value" if set(value) == {"value"} else "~object"
    return None


# mypy reads the plain recursive alias; pydantic validates the tagged union, which gives one clear
# error per bad node instead of one per union member.
if TYPE_CHECKING:
    JsonNode = JsonField | JsonValue | dict[str, "JsonNode"]
else:
    JsonNode = TypeAliasType(
        "JsonNode",
        Annotated[
            Annotated[JsonField, Tag("~from")]
            | Annotated[JsonValue, Tag("~value")]
            | Annotated[dict[str, "JsonNode"], Tag("~object")],
            Discriminator(
                _json_node_kind,
                custom_error_type="json_node",
                custom_error_message="expected {from: FIELD}, {value: LITERAL} or a mapping of those",
            ),
        ],
    )


# --- request: form, idempotency, the request itself -----------------------------------------


class FormField(_Model):
    """`{from: field}` in a form: the record value as text."""

    from_: NonEmpty = Field(alias="from")


def _form_value_kind(value: Any) -> str | None:
    if isinstance(value, str | int) and not isinstance(value, bool):
        return "~text"
    return "~from" if isinstance(value, dict | FormField) else None


FormValue = Annotated[
    Annotated[TemplateText, Tag("~text")] | Annotated[FormField, Tag("~from")],
    Discriminator(
        _form_value_kind,
        custom_error_type="form_value",
        custom_error_message="expected a template string or {from: FIELD}",
    ),
]


class IdempotencyKeyConfig(_Model):
    header: HeaderName


class RequestConfig(_Model):
    method: Annotated[Method, BeforeValidator(_upper)]
    url: Annotated[str, AfterValidator(_url)]
    query: dict[str, TemplateText] = Field(default_factory=dict)
    headers: dict[HeaderName, HeaderValue] = Field(default_factory=dict)
    json_: JsonNode | None = Field(default=None, alias="json")
    form: dict[str, FormValue] | None = None
    body: Annotated[str, AfterValidator(_template)] | None = None
    content_type: Annotated[str, AfterValidator(_single_line)] | None = None
    idempotency_key: IdempotencyKeyConfig | None = None

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
        return self


# --- response, execution, retry, halt -------------------------------------------------------


class ResponseConfig(_Model):
    success_statuses: Statuses | None = None  # None: any 2xx
    capture: dict[NonEmpty, Annotated[str, AfterValidator(_json_pointer)]] = Field(default_factory=dict)
    failure_body_bytes: Annotated[int, Field(ge=0, le=1_048_576)] = 2048

    def is_success(self, status: int) -> bool:
        if self.success_statuses is None:
            return 200 <= status <= 299
        return status in self.success_statuses


class TimeoutConfig(_Model):
    connect_seconds: Seconds = 10.0
    read_seconds: Seconds = 30.0
    write_seconds: Seconds = 30.0
    pool_seconds: Seconds = 5.0


class RateLimitConfig(_Model):
    requests_per_second: Seconds


class ExecutionConfig(_Model):
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 8
    timeout: TimeoutConfig = Field(default_factory=TimeoutConfig)
    rate_limit: RateLimitConfig | None = None  # None: unlimited
    idle_timeout_seconds: Seconds = 300.0
    max_lifetime_seconds: Seconds = 604800.0
    http2: bool = False


class RetryConfig(_Model):
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 1  # includes the first request
    statuses: Statuses = DEFAULT_RETRY_STATUSES
    initial_backoff_seconds: Annotated[float, Field(ge=0)] = 1.0
    max_backoff_seconds: Annotated[float, Field(ge=0)] = 30.0
    jitter_ratio: Annotated[float, Field(ge=0, le=1)] = 0.2
    respect_retry_after: bool = True
    # The longest pause a Retry-After or a quota reset may impose; a target asking for a day gets this.
    # Timing only, like the Retry-After it caps: left out of the fingerprint (`config_semantic_dict`).
    max_retry_after_seconds: Annotated[float, Field(gt=0)] = 300.0

    @model_validator(mode="after")
    def _backoff_order(self) -> RetryConfig:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("retry.max_backoff_seconds is below retry.initial_backoff_seconds")
        return self


class HaltConfig(_Model):
    on_statuses: Statuses = (401, 403)
    consecutive_failures: Annotated[int, Field(ge=1)] = 100


class JobConfig(_Model):
    version: Literal[1]
    name: str | None = None
    input: InputConfig = Field(default_factory=InputConfig)
    request: RequestConfig
    response: ResponseConfig = Field(default_factory=ResponseConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    halt: HaltConfig = Field(default_factory=HaltConfig)


# --- loading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A loaded job file: its configuration, its resolved path and the directory paths are relative to."""

    config: JobConfig
    path: Path
    base_dir: Path
    deprecations: tuple[Problem, ...] = ()  # the public alpha's spellings it used, with their new ones

    @property
    def input_path(self) -> Path | None:
        file = self.config.input.file
        return None if file is None else self.base_dir / file


def load_job(path: Path) -> Job:
    """Read and validate a job file. Raises `NotFound`, or `ConfigInvalid` naming every problem's line."""
    resolved = path.resolve()
    try:
        text = resolved.read_text(encoding="utf-8-sig")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise NotFound(f"job file not found: {path}", context={"path": str(path)}) from None
    except UnicodeDecodeError as exc:
        raise ConfigInvalid([Problem(f"not UTF-8 text ({exc.reason})", file=str(path))]) from None
    config, deprecations = parse_job_with_deprecations(text, file=str(path))
    return Job(config, resolved, resolved.parent, tuple(deprecations))


def parse_job(text: str, *, file: str) -> JobConfig:
    """Validate job file text; `file` names it in problems."""
    return parse_job_with_deprecations(text, file=file)[0]


def parse_job_with_deprecations(text: str, *, file: str) -> tuple[JobConfig, list[Problem]]:
    """Validate job file text, reading the public alpha's spellings; also one note per such spelling."""
    raw, lines = load_yaml(text, file)
    if not isinstance(raw, dict):
        raise ConfigInvalid(
            [Problem("a job file is a mapping (version, input, request, ...)", file=file, line=1)]
        )
    raw, deprecations = upgrade_alpha_spellings(raw, lines, file)
    try:
        return JobConfig.model_validate(raw), deprecations
    except ValidationError as exc:
        raise ConfigInvalid(_problems(exc, raw, lines, file)) from None


def config_semantic_dict(config: JobConfig) -> dict[str, Any]:
    """Everything that changes what the job does, as JSON-able data: all but `name`, `input.file`
    and `retry.max_retry_after_seconds` (how long a pause may last changes no request)."""
    data: dict[str, Any] = config.model_dump(mode="json", by_alias=True)
    del data["name"]
    del data["input"]["file"]
    del data["retry"]["max_retry_after_seconds"]
    return data


def _problems(exc: ValidationError, raw: dict[str, Any], lines: LineMap, file: str) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for error in exc.errors(include_url=False):
        path = _yaml_path(raw, error["loc"])
        if error["type"] == "missing":
            path = (*path, str(error["loc"][-1]))
        message = _message(error, path)
        where = format_path(path)
        if (where, message) not in seen:
            seen.add((where, message))
            problems.append(Problem(message, file=file, line=lines.line(path), path=where or None))
    return sorted(problems, key=lambda problem: problem.line or 0)


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
        key = str(path[-1]) if path else "?"
        close = difflib.get_close_matches(key, _KNOWN_KEYS, n=1, cutoff=0.75)
        return f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if kind not in ("value_error", "json_node", "form_value") and not isinstance(value, dict | list):
        message += f" (got {value!r})"
    return message


def _known_keys() -> list[str]:
    models: list[type[BaseModel]] = [
        JobConfig, InputConfig, RequestConfig, JsonField, JsonValue, FormField, IdempotencyKeyConfig,
        ResponseConfig, ExecutionConfig, TimeoutConfig, RateLimitConfig, RetryConfig, HaltConfig,
    ]  # fmt: skip
    return sorted({info.alias or name for model in models for name, info in model.model_fields.items()})


_KNOWN_KEYS = _known_keys()
