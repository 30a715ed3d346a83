"""The job file, version 1: frozen pydantic models, and `load_job()`, the one way to read it.

Every model forbids unknown keys and validates strictly (no "8" for 8, no true for 1). A
validation error becomes `ConfigInvalid` whose problems name the YAML path and its line.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

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

from bulkrelay.errors import ConfigInvalid, JobFileUnreadable, NotFound, Problem
from bulkrelay.job.alphacompat import upgrade_alpha_spellings
from bulkrelay.job.durations import MAX_SECONDS
from bulkrelay.job.template import FieldRef, SecretRef, compile_template
from bulkrelay.job.wire import header_value_refusal, wire_url
from bulkrelay.job.yamlload import INT64_RANGE, LineMap, format_path, load_yaml
from bulkrelay.job.yamlload import Path as YamlPath

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
FieldType = Literal["integer", "number", "boolean", "json", "string"]

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
DEFAULT_HALT_STATUSES = (401, 403)
MAX_BODY_BYTES = 1 << 20  # the most of a response body the transport reads; a failure body is cut from it
DEFAULT_CLIENT: Literal["reqwest", "httpx"] = "reqwest"
DEFAULT_PROXY = "none"  # no proxy, whatever the environment says


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


TemplateText = Annotated[str, BeforeValidator(_int_as_text), AfterValidator(_template)]
HeaderValue = Annotated[
    str, BeforeValidator(_int_as_text), AfterValidator(_template), AfterValidator(_sendable_header_text)
]
HeaderName = Annotated[str, AfterValidator(_header_name)]
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
        return data


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
        if self.type == "integer" and self.default not in INT64_RANGE:
            raise ValueError(f"default {self.default!r} is out of the signed 64-bit integer range")
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
    content_type: Annotated[str, AfterValidator(_sendable_header_literal)] | None = None
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
    success_statuses: Statuses | None = None  # None: any 2xx (applied by relay/retry's RetryPolicy)
    capture: dict[NonEmpty, Annotated[str, AfterValidator(_json_pointer)]] = Field(default_factory=dict)
    failure_body_bytes: Annotated[int, Field(ge=0, le=MAX_BODY_BYTES)] = 2048


class TimeoutConfig(_Model):
    connect_seconds: Seconds = 10.0
    read_seconds: Seconds = 30.0
    write_seconds: Seconds = 30.0
    pool_seconds: Seconds = 5.0


def _redis_url(value: str) -> str:
    if re.match(r"^(redis|rediss|unix)://\S+$", value):
        return value
    raise ValueError(
        "must be a Redis URL such as redis://host:6379/0 (rediss:// for TLS, unix:// for a socket)"
    )


class RateLimitConfig(_Model):
    requests_per_second: RequestsPerSecond
    shared: Annotated[str, AfterValidator(_redis_url)] | None = None  # one limit for every shard, in Redis
    shared_key: NonEmpty | None = (
        None  # jobs naming the same key share one limit; default: the target's origin
    )


def _proxy(value: str) -> str:
    if value in ("none", "environment") or re.match(r"^(https?|socks5h?)://[^/\s]+/?$", value):
        return value
    raise ValueError("must be 'none', 'environment' or a proxy URL such as http://proxy.internal:3128")


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
_OPERATIONAL_EXECUTION_KEYS = ("client", "proxy", "tls")
# Where the shared limit is kept, not what it is (the rate is semantic): moving Redis never blocks a resume.
_OPERATIONAL_RATE_LIMIT_KEYS = ("shared", "shared_key")

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

    def delete_limit(self, delivered_keys: int) -> int:
        if isinstance(self.max_deletes, int):
            return self.max_deletes
        return int(delivered_keys * float(self.max_deletes[:-1]) / 100)


class RetryConfig(_Model):
    max_attempts: Annotated[int, Field(ge=1, le=100)] = DEFAULT_MAX_ATTEMPTS  # includes the first request
    statuses: Statuses = DEFAULT_RETRY_STATUSES
    initial_backoff_seconds: PauseSeconds = DEFAULT_INITIAL_BACKOFF_SECONDS
    max_backoff_seconds: PauseSeconds = DEFAULT_MAX_BACKOFF_SECONDS
    jitter_ratio: Annotated[float, Field(ge=0, le=1)] = DEFAULT_JITTER_RATIO
    respect_retry_after: bool = DEFAULT_RESPECT_RETRY_AFTER
    # The longest pause a Retry-After or a quota reset may impose; a target asking for a day gets this.
    # Timing only, like the Retry-After it caps: left out of the fingerprint (`config_semantic_dict`).
    max_retry_after_seconds: Seconds = 300.0

    @model_validator(mode="after")
    def _backoff_order(self) -> RetryConfig:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("retry.max_backoff_seconds is below retry.initial_backoff_seconds")
        return self


class HaltConfig(_Model):
    on_statuses: Statuses = DEFAULT_HALT_STATUSES
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
    mirror: MirrorConfig | None = None

    @model_validator(mode="after")
    def _sync_settings(self) -> JobConfig:
        sync = self.execution.sync
        if sync != "full" and self.input.key is None:
            raise ValueError(f"execution.sync: {sync} needs input.key to name each record")
        if (sync == "mirror") != (self.mirror is not None):
            raise ValueError("execution.sync: mirror and the mirror section (url, max_deletes) go together")
        if self.mirror is not None and not compile_template(self.mirror.url).fields <= {self.input.key}:
            raise ValueError(f"mirror.url may use only the key field {{{self.input.key}}}: the row is gone")
        return self

    @model_serializer(mode="wrap")
    def _omit_absent_mirror(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.mirror is None:
            data.pop("mirror", None)
        return data


# --- loading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A loaded job file: its configuration, its resolved path and the directory paths are relative to."""

    config: JobConfig
    path: Path
    base_dir: Path
    deprecations: tuple[Problem, ...] = ()  # the public alpha's spellings it used, with their new ones
    lines: LineMap = field(default_factory=LineMap)  # the line of every YAML path, for later problems

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

    A `json` leaf with a `default` is left out: its field may be absent."""
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
            found.setdefault(json_leaf.from_, (*path, "from"))
    if config.input.key is not None:
        found.setdefault(config.input.key, ("input", "key"))
    return found


def _json_fields(node: JsonNode, path: YamlPath) -> Iterator[tuple[YamlPath, JsonField]]:
    if isinstance(node, JsonField):
        if not node.has_default:
            yield path, node
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from _json_fields(child, (*path, key))


def load_job(path: Path) -> Job:
    """Read and validate a job file. Raises `NotFound`, or `ConfigInvalid` naming every problem's line."""
    resolved = path.resolve()
    try:
        text = resolved.read_text(encoding="utf-8-sig")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
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
    `retry.max_retry_after_seconds` (how long a pause may last changes no request) and the transport's
    operational settings (client, proxy, TLS identity, where a shared limit is kept)."""
    data: dict[str, Any] = config.model_dump(mode="json", by_alias=True)
    del data["name"]
    del data["input"]["file"]
    del data["retry"]["max_retry_after_seconds"]
    for key in _OPERATIONAL_EXECUTION_KEYS:
        del data["execution"][key]
    if data["execution"]["rate_limit"] is not None:
        for key in _OPERATIONAL_RATE_LIMIT_KEYS:
            del data["execution"]["rate_limit"][key]
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
    ResponseConfig: "response", ExecutionConfig: "execution", TimeoutConfig: "execution.timeout",
    RateLimitConfig: "execution.rate_limit", RetryConfig: "retry", HaltConfig: "halt",
}  # fmt: skip
