"""`{field}` placeholders and `${NAME}` secrets in the job file's template strings.

Syntax, in the URL, query values, header values, form values and the raw body:

- `{field}` is the value of a record field. In the URL it is percent-encoded (a `/` in an id
  cannot reach another path), and a value that would make a whole path segment `.` or `..` is
  refused: URL parsers resolve those (even as `%2e`), so no encoding keeps them in their segment.
  Elsewhere it is inserted as is (query and form values are encoded later, as a whole).
- `{{` and `}}` are a literal `{` and `}`.
- `${NAME}` (NAME matching `[A-Z_][A-Z0-9_]*`) is an environment variable: a secret. It is
  inserted verbatim, never encoded, so `${API_BASE}/v1/customers` works. `${` always begins a
  secret; `${{` is a literal `$` followed by a literal `{`.

A template is parsed once (`compile_template`), its secrets bound once (`Template.bind`), and
each record is then rendered with a short loop of string joins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import quote

import orjson

from bulkrelay.errors import SecretMissing
from bulkrelay.job import redact as _redact

SECRET_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")

_TOKEN = re.compile(
    r"(?P<open>\{\{)|(?P<close>\}\})"
    r"|\$\{(?P<secret>[^{}]*)\}"
    r"|\{(?P<field>[^{}]*)\}"
    r"|(?P<stray>\$\{(?!\{)|\{|\})"
)


class TemplateSyntaxError(ValueError):
    """A template string that cannot be parsed; `column` is 1-based within the string."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"{message} (column {column})")
        self.column = column


class RenderError(Exception):
    """A record cannot fill a template: the field is missing, or its value does not fit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class FieldRef:
    name: str


@dataclass(frozen=True, slots=True)
class SecretRef:
    name: str


Part = str | FieldRef | SecretRef


@dataclass(frozen=True)
class Template:
    """A parsed template: literal text, field references and secret references, in order."""

    source: str
    parts: tuple[Part, ...]

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(p.name for p in self.parts if isinstance(p, FieldRef))

    @property
    def secrets(self) -> frozenset[str]:
        return frozenset(p.name for p in self.parts if isinstance(p, SecretRef))

    def bind(self, secrets: Mapping[str, str], *, url: bool = False) -> BoundTemplate:
        """Substitute the secrets now; `url=True` percent-encodes field values and refuses empty ones."""
        text: list[str] = [""]
        names: list[str] = []
        for part in self.parts:
            if isinstance(part, FieldRef):
                names.append(part.name)
                text.append("")
            else:
                text[-1] += part if isinstance(part, str) else secrets[part.name]
        return BoundTemplate(text[0], tuple(zip(names, text[1:], strict=True)), url=url)


class BoundTemplate:
    """A template whose secrets are already in place: a head and (field, following text) slots."""

    __slots__ = (
        "_encode",
        "_head",
        "_single",
        "_slots",
        "authority_fields",
        "completes_escape",
        "constant",
        "fields",
    )

    def __init__(self, head: str, slots: tuple[tuple[str, str], ...], *, url: bool) -> None:
        self._head = head
        self._slots = slots
        self._encode: Callable[[str], str] | None = _quote_path if url else None
        self.fields = frozenset(name for name, _ in slots)
        self.constant: str | None = head if not slots else None
        self._single = slots[0] if len(slots) == 1 else None  # the common shape, given a short way
        # In a URL: the fields placed before the path begins (scheme, host, port), blamed for a bad host.
        self.authority_fields = _authority_fields(head, slots) if url else frozenset()
        # A literal "%" or "%X" just before a field: the field's text could finish a percent escape.
        before = (head, *(tail for _, tail in slots[:-1])) if slots else ()
        self.completes_escape = any(_ESCAPE_BEGUN.search(text) for text in before)

    @property
    def head(self) -> str:
        """The text before the first field, secrets in place (a URL's origin, when no field is in it)."""
        return self._head

    def single_slot(self) -> tuple[str, str, str] | None:
        """(head, field, tail) when the template holds exactly one field, else None."""
        return None if self._single is None else (self._head, *self._single)

    def render(self, fields: Mapping[str, Any]) -> str:
        if self._single is not None:
            # One field whose value needs nothing done (in a URL: plain letters and digits, nothing to
            # encode, no dot segment): skip the general loop. Anything else takes the loop below.
            name, tail = self._single
            value = fields.get(name)
            if type(value) is str and (self._encode is None or (value.isalnum() and value.isascii())):
                return self._head + value + tail
        return self._render_slots(fields)

    def _render_slots(self, fields: Mapping[str, Any]) -> str:
        out = self._head
        encode = self._encode
        dotted: list[tuple[str, int, int]] = []
        for name, tail in self._slots:
            try:
                value = fields[name]
            except KeyError:
                raise RenderError(name, "missing from the record") from None
            text = value if type(value) is str else value_text(name, value)
            if encode is not None:
                if not text:
                    raise RenderError(name, "is empty; the URL would lose a path segment")
                text = encode(text)
                if not text.strip("."):  # only dots: it may make a dot segment, alone or with its neighbours
                    dotted.append((name, len(out), len(out) + len(text)))
            out += text + tail
        for name, start, end in dotted:
            if (segment := _dot_segment(out, start, end)) is not None:
                raise RenderError(
                    name,
                    f"makes the URL path segment {segment!r}, which the transport resolves away "
                    "(the request would reach another resource)",
                )
        return out


def _authority_fields(head: str, slots: tuple[tuple[str, str], ...]) -> frozenset[str]:
    text = head
    found: set[str] = set()
    for name, tail in slots:
        if _path_begun(text):
            break
        found.add(name)
        text += "x" + tail
    return frozenset(found)


def _path_begun(url: str) -> bool:
    scheme_end = url.find("://")
    return scheme_end >= 0 and any(mark in url[scheme_end + 3 :] for mark in "/?#")


def _dot_segment(url: str, start: int, end: int) -> str | None:
    """The dot segment (`.` or `..`, which parsers also read in `%2e`) that `url[start:end]` is part of,
    when it sits in the URL's path; else None."""
    before = url[url.find("://") + 3 : start]
    if "/" not in before or "?" in before or "#" in before:
        return None  # in the host, or in the query or fragment, where dots mean nothing
    stops = [i for i in (url.find(mark, end) for mark in "/?#") if i >= 0]
    segment = url[url.rfind("/", 0, start) + 1 : min(stops, default=len(url))]
    return segment if segment.lower().replace("%2e", ".") in (".", "..") else None


def value_text(field: str, value: Any) -> str:
    """The text form of a record value: JSON spelling for booleans, numbers and structures."""
    if isinstance(value, str):
        return value
    if value is None:
        raise RenderError(field, "is null")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return orjson.dumps(value).decode()


_ESCAPE_BEGUN = re.compile(r"%[0-9A-Fa-f]?\Z")
_URL_SAFE = re.compile(r"[A-Za-z0-9_.~-]+")  # what quote(safe="") leaves alone


def _quote_path(text: str) -> str:
    # Most keys are plain ids: skip urllib's general machinery when nothing needs escaping.
    return text if _URL_SAFE.fullmatch(text) else quote(text, safe="")


@lru_cache(maxsize=256)
def compile_template(source: str) -> Template:
    """Parse `source`. Raises `TemplateSyntaxError` naming the column of the first mistake."""
    parts: list[Part] = []
    literal = ""
    pos = 0
    for match in _TOKEN.finditer(source):
        literal += source[pos : match.start()]
        pos = match.end()
        column = match.start() + 1
        if match["open"] is not None:
            literal += "{"
        elif match["close"] is not None:
            literal += "}"
        elif match["stray"] is not None:
            raise TemplateSyntaxError(_stray_message(match["stray"]), column)
        else:
            if literal:
                parts.append(literal)
                literal = ""
            parts.append(_reference(match, column))
    literal += source[pos:]
    if literal:
        parts.append(literal)
    return Template(source, tuple(parts))


def _reference(match: re.Match[str], column: int) -> FieldRef | SecretRef:
    secret = match["secret"]
    if secret is not None:
        if not SECRET_NAME.fullmatch(secret):
            raise TemplateSyntaxError(
                f"invalid secret name {secret!r}: use capitals, digits and _ (like ${{API_TOKEN}})", column
            )
        return SecretRef(secret)
    name = match["field"]
    if not name.strip():
        raise TemplateSyntaxError("empty field name '{}'; write '{{' and '}}' for literal braces", column)
    return FieldRef(name)


def _stray_message(stray: str) -> str:
    if stray == "}":
        return "single '}' without a matching '{'; write '}}' for a literal brace"
    if stray == "${":
        return "unclosed '${'; a secret is written ${NAME}"
    return "unclosed '{'; write '{{' for a literal brace"


def resolve_secrets(names: Iterable[str], env: Mapping[str, str]) -> dict[str, str]:
    """Look every secret up once. Raises `SecretMissing` naming all unset (or empty) variables."""
    wanted = sorted(set(names))
    missing = [name for name in wanted if not env.get(name)]
    if missing:
        listed = ", ".join(missing)
        raise SecretMissing(
            f"environment variable{'s' if len(missing) > 1 else ''} not set or empty: {listed}",
            context={"missing": missing},
            suggestion=f"export {missing[0]}=... before running the job",
        )
    return {name: env[name] for name in wanted}


# The Redactor lived here; it has its own module now (bulkrelay.job.redact). The names stay for old imports.
Redactor = _redact.Redactor
REDACTED = _redact.REDACTED
