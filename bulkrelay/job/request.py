"""Record → `PreparedRequest`, and the idempotency key of a row (`RowRequests`: the two together).

`RequestRenderer.from_config` does all the per-job work once: it parses every template, looks the
secrets up, compiles the `json` tree into one function building the body (with a tree of small getter
functions as its reference, which names the field when a row does not fit), and decides whether the
URL needs a per-row parse at all. `render` is then the per-row hot path: a few dictionary lookups,
string joins and one `orjson.dumps`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from bulkrelay.errors import ConfigInvalid, Problem, SecretInvalid
from bulkrelay.job.config import (
    FormField,
    Job,
    JsonField,
    JsonLookup,
    JsonNode,
    JsonValue,
    KindLeaf,
    Nulls,
    RequestConfig,
)
from bulkrelay.job.inputs.jsonl import integer_beyond_64_bits
from bulkrelay.job.inputs.lookups import LookupMap, lookup_getter
from bulkrelay.job.oauth2 import TokenRequest, bind_token_request
from bulkrelay.job.records import PreparedRequest, Record
from bulkrelay.job.redact import Redactor, basic_credentials, url_credentials
from bulkrelay.job.signing import hmac_keys, require_botocore
from bulkrelay.job.template import (
    BoundTemplate,
    FieldRef,
    RenderError,
    compile_template,
    resolve_secrets,
    value_text,
)
from bulkrelay.job.values import OMIT, LeafParts, form_getter, is_plain, leaf_getter, may_omit, with_nulls
from bulkrelay.job.wire import header_value_refusal, wire_url
from bulkrelay.job.yamlload import (
    INT64_RANGE,  # signed 64-bit, as documented (orjson would write up to 2**64-1)
)

__all__ = [
    "RenderError",
    "RequestRenderer",
    "RowRequests",
    "idempotency_key",
    "json_renderer",
    "value_getter",
]

Fields = Mapping[str, Any]
Headers = tuple[tuple[str, str], ...]
Getter = Callable[[Fields], Any]

_ABSENT = object()
_OMIT = OMIT  # a `when_missing: omit` (or `nulls: omit`) value: its key is left out of the object
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_CONTENT_TYPES = {"json": "application/json", "form": "application/x-www-form-urlencoded"}
_KEY_SCHEME = "bulkrelay-idempotency-v1"


class RequestRenderer:
    """Renders records into requests for one job; built once by `from_config`."""

    render: Callable[[Record], PreparedRequest]  # the request for one record (see `_render_function`)

    def __init__(
        self,
        *,
        method: str,
        url: BoundTemplate,
        query: tuple[tuple[str, BoundTemplate], ...],
        headers: tuple[tuple[str, BoundTemplate], ...],
        body: Callable[[Fields], bytes] | None,
        fields_used: frozenset[str],
        idempotency_header: str | None,
        redactor: Redactor,
        sorted_json: bool = False,
        json: tuple[JsonNode, int] | None = None,
        token_request: TokenRequest | None = None,
        hmac_keys: tuple[bytes, ...] = (),
        lookups: Mapping[str, LookupMap] | None = None,
    ) -> None:
        self._lookups = lookups  # the `lookups:` maps the json tree's lookup leaves read
        self.method = method
        self.token_request = token_request  # request.auth.oauth2: the relay fetches the token with it
        self.hmac_keys = hmac_keys  # request.auth.hmac: what relay/auth/hmac.py signs with
        self._json = json  # the json tree and its orjson option, compiled into `render`
        self._url = url
        self._query = query
        # Most URLs need no per-row parse to learn their wire form (see `_sent_as_rendered`).
        self._url_sent_as_rendered = _sent_as_rendered(url, query)
        self._headers = headers
        # When no header names a field, the headers are the same for every row: build them once.
        constant = tuple((n, t.constant) for n, t in headers if t.constant is not None)
        self._constant_headers = constant if len(constant) == len(headers) else None
        self._body = body
        self.fields_used = fields_used
        self.idempotency_header = idempotency_header
        self.redactor = redactor
        self.sorted_json = (
            sorted_json  # a JSON body is written with sorted keys (delta sync digests it as is)
        )
        self.render = self._render_function()

    @property
    def lookups(self) -> Mapping[str, LookupMap] | None:
        """The `lookups:` maps its lookup leaves read (a batch item's leaves read them too)."""
        return self._lookups

    @property
    def url(self) -> BoundTemplate:
        """The URL template, its secrets in place (the run log shows the origin it resolves to)."""
        return self._url

    @classmethod
    def from_config(
        cls,
        req: RequestConfig,
        env: Mapping[str, str],
        *,
        sorted_json: bool = False,
        shown: Collection[str] = (),
        base_dir: Path | None = None,
        lookups: Mapping[str, LookupMap] | None = None,
    ) -> RequestRenderer:
        """Compile the request config. Raises `SecretMissing` naming every unset `${NAME}`.
        `shown`: the job's `vars`, read like secrets but never hidden. `base_dir`: where a key file
        named relative to the job file is.

        `sorted_json` writes a JSON body with its keys sorted at every level (a delta job: the
        canonical form is then what goes on the wire, and what `render` shows)."""
        texts = [req.url, *req.query.values(), *req.headers.values()]
        if req.body is not None:
            texts.append(req.body)
        form_texts = [v for v in (req.form or {}).values() if isinstance(v, str)]
        templates = [compile_template(text) for text in texts + form_texts]
        auth_texts = req.auth.texts() if req.auth is not None else []
        auth_names = {name for text in auth_texts for name in compile_template(text).secrets}
        secrets = resolve_secrets([*(name for t in templates for name in t.secrets), *auth_names], env)
        _refuse_unsendable_secrets(req, secrets)
        oauth2, hmac = (req.auth.oauth2, req.auth.hmac) if req.auth is not None else (None, None)
        token_request = None if oauth2 is None else bind_token_request(oauth2, secrets, base_dir)
        if req.auth is not None and req.auth.aws_sigv4 is not None:
            require_botocore()

        def bind(text: str, *, url: bool = False) -> BoundTemplate:
            return compile_template(text).bind(secrets, url=url)

        headers = [(name, bind(value)) for name, value in req.headers.items()]
        if not any(name.lower() == "content-type" for name, _ in headers):
            content_type = req.content_type or _content_type_for(req)
            if content_type is not None:
                headers.append(("Content-Type", BoundTemplate(content_type, (), url=False)))
        fields = {f for t in templates for f in t.fields} | _body_fields(req)
        url = bind(req.url, url=True)
        _refuse_unsendable_url(req.url, url)
        return cls(
            method=req.method,
            url=url,
            query=tuple((name, bind(value)) for name, value in req.query.items()),
            headers=tuple(headers),
            body=_body_renderer(req, bind, sorted_json, lookups),
            fields_used=frozenset(fields),
            idempotency_header=req.idempotency_key.header if req.idempotency_key else None,
            redactor=_redactor(req.url, secrets, token_request, shown),
            token_request=token_request,
            hmac_keys=() if hmac is None else hmac_keys(hmac, secrets),
            sorted_json=sorted_json and req.json_ is not None,
            json=None if req.json_ is None else (with_nulls(req.json_, req.nulls), _json_option(sorted_json)),
            lookups=lookups,
        )

    def _render_function(self) -> Callable[[Record], PreparedRequest]:
        """`render`: the request for one record; raises `RenderError` naming the field that does not
        fit. Built once per job: it runs for every row, twice per run (preflight, then send). The
        reference is a closure over the job's parts; `_compiled_render` writes most jobs a faster
        function that hands every row it cannot render to the reference, so errors stay the same."""
        method, body_of = self.method, self._body
        url_for, headers_for = self._url_function(), self._headers_function()
        new_request = tuple.__new__  # PreparedRequest(...) would go through a Python-level __new__

        def render(record: Record) -> PreparedRequest:
            fields = record.fields
            url, headers = url_for(fields), headers_for(fields)
            body = None if body_of is None else body_of(fields)
            return new_request(PreparedRequest, (method, url, headers, body))

        return self._compiled_render(render, url_for, headers_for) or render

    def _url_function(self) -> Callable[[Fields], str]:
        url_of, query = self._url.render, self._query
        wire = None if self._url_sent_as_rendered else self._wire_url

        def url_for(fields: Fields) -> str:
            url = url_of(fields)
            if query:
                pairs = [(name, template.render(fields)) for name, template in query]
                url = url.partition("#")[0]  # field values are encoded: a "#" here begins the fragment
                url += ("&" if "?" in url else "?") + urlencode(pairs)
            return url if wire is None else wire(url)

        return url_for

    def _headers_function(self) -> Callable[[Fields], tuple[tuple[str, str], ...]]:
        constant, field_headers = self._constant_headers, self._headers
        if constant is not None:
            return lambda fields: constant
        return lambda fields: tuple((name, _header_value(name, t, fields)) for name, t in field_headers)

    def _compiled_render(
        self,
        reference: Callable[[Record], PreparedRequest],
        url_for: Callable[[Fields], str],
        headers_for: Callable[[Fields], tuple[tuple[str, str], ...]],
    ) -> Callable[[Record], PreparedRequest] | None:
        """One generated function for the whole happy path, in one frame: a URL without fields is a
        constant, a one-field URL whose value is plain letters and digits is joined in place (else
        `url_for`), constant headers are a constant, a JSON body is a dict display handed to
        `orjson.dumps` (see `_json_display`). Any failure re-renders the record with `reference`,
        which raises the exact error."""
        code = _Generated()
        bound = code.bound
        as_is = self._url_sent_as_rendered and not self._query  # no per-row parse, no query to add
        single = self._url.single_slot() if as_is else None
        if as_is and self._url.constant is not None:  # no field in the URL: the same for every row
            url = f"        url = {bound(self._url.constant)}\n"
        elif single is not None:
            head, name, tail = (bound(part) for part in single)
            url = (
                f"        url = f.get({name})\n"
                f"        if url.__class__ is not str or not (url.isalnum() and url.isascii()):\n"
                f"            url = {bound(url_for)}(f)\n"
                f"        else:\n            url = {head} + url + {tail}\n"
            )
        else:
            url = f"        url = {bound(url_for)}(f)\n"
        if self._constant_headers is not None:
            headers = bound(self._constant_headers)
        else:
            headers = f"{bound(headers_for)}(f)"
        if self._json is not None:
            node, option = self._json
            try:
                display = _json_display(node, code, self._lookups)
            except RecursionError:
                return None
            body = f"{bound(orjson.dumps)}({display}, option={bound(option)})"
        else:
            body = "None" if self._body is None else f"{bound(self._body)}(f)"
        fallback = bound((KeyError, RenderError, orjson.JSONEncodeError))
        request = f"({bound(self.method)}, url, {headers}, body)"
        compiled: Callable[[Record], PreparedRequest] | None = code.define(
            "render",
            f"def render(record):\n    f = record.fields\n    try:\n{url}        body = {body}\n"
            f"    except {fallback}:\n        return {bound(reference)}(record)\n"
            f"    return {bound(tuple.__new__)}({bound(PreparedRequest)}, {request})\n",
        )
        return compiled

    def _wire_url(self, url: str) -> str:
        """The URL as the transport sends it, so that `render` shows the bytes on the wire."""
        try:
            return wire_url(url)
        except ValueError as exc:
            blamed = self._url.authority_fields or self._url.fields
            if not blamed:
                raise
            raise RenderError(min(blamed), f"makes a URL the transport refuses ({exc})") from None

    def redact(self, request: PreparedRequest) -> dict[str, Any]:
        """The request as shown to people (`render`, logs): every secret value replaced by `***`."""
        redact = self.redactor.redact_rendered
        return {
            "method": request.method,
            "url": redact(request.url),
            "headers": [[name, redact(value)] for name, value in request.headers],
            "body": None if request.body is None else redact(request.body.decode("utf-8", "replace")),
        }

    def idempotency_key(
        self,
        config_fingerprint: str,
        row_identity: str,
        request: PreparedRequest,
        *,
        delivery: str | None = None,
    ) -> str:
        """The idempotency key of one row's request; see the module function `idempotency_key`."""
        return idempotency_key(
            config_fingerprint,
            row_identity,
            request,
            redactor=self.redactor,
            skip_header=self.idempotency_header,
            delivery=delivery,
        )

    def with_idempotency_key(self, request: PreparedRequest, key: str) -> PreparedRequest:
        """`request` with the configured idempotency header added (unchanged when none is configured)."""
        if self.idempotency_header is None:
            return request
        headers = (*request.headers, (self.idempotency_header, key))
        return PreparedRequest(request.method, request.url, headers, request.body)


def job_renderer(job: Job, env: Mapping[str, str]) -> RequestRenderer:
    """The job's renderer, as preflight and `render` build it. A problem found only then (a key file that
    cannot be read, a missing extra) points at its key's line in the job file, like every other."""
    config = job.config
    try:
        return RequestRenderer.from_config(
            config.request,
            env,
            sorted_json=config.execution.sync != "full",
            shown=config.vars,
            base_dir=job.base_dir,
            lookups=job.lookups,
        )
    except ConfigInvalid as exc:
        raise ConfigInvalid([_located(job, problem) for problem in exc.problems], total=exc.total) from None


def _located(job: Job, problem: Problem) -> Problem:
    if problem.file is not None or problem.path is None:
        return problem
    return job.problem_at(tuple(problem.path.split(".")), problem.message)


class RowRequests:
    """A row's request with its idempotency key: the one place both are made, for the sender, `render`
    and a batch's items. Built once per job (and per delivering run, for a delta job's keys)."""

    def __init__(
        self,
        renderer: RequestRenderer,
        config_fingerprint: str,
        key_field: str | None,
        *,
        delivery: str | None = None,
    ) -> None:
        self.renderer = renderer
        self._fingerprint = config_fingerprint
        self._key_field = key_field
        self._delivery = delivery  # a delta job's delivering run: part of each row's key
        self.header = renderer.idempotency_header
        self._redact = renderer.redactor.redact_rendered
        self._hides = renderer.redactor.hides_rendered  # a job without secrets: bodies are hashed as they are
        self._skip = (self.header or "").lower()
        # The last URL and headers a key was made for, with their redacted forms: most jobs (and every
        # batch's items) repeat them row after row, so they are redacted once.
        self._frame: tuple[str, Headers, str, list[list[str]]] | None = None
        # A job without an idempotency header sends the rendered request as it is: no key to make.
        self.keyed: Callable[[Record], tuple[PreparedRequest, str | None]] = (
            self._unkeyed if self.header is None else self._keyed
        )

    def key(self, record: Record, request: PreparedRequest) -> str:
        """The row's idempotency key, `request` being what it renders to (a batch item's own request):
        `idempotency_key`, with the URL and headers redacted once while they repeat."""
        frame = self._frame
        if frame is None or frame[0] != request.url or frame[1] != request.headers:
            url, headers = _redacted_frame(request, self._redact, self._skip)
            frame = self._frame = (request.url, request.headers, url, headers)
        body = request.body
        text = None if body is None else body.decode("utf-8", "replace")
        if text is not None and self._hides:
            text = self._redact(text)
        key_field = self._key_field  # row_identity(), inline: this runs once a row
        identity = f"row:{record.row_number}" if key_field is None else f"key:{record.fields.get(key_field)}"
        return _key_of(self._fingerprint, identity, request.method, frame[2], frame[3], text, self._delivery)

    def _unkeyed(self, record: Record) -> tuple[PreparedRequest, str | None]:
        return self.renderer.render(record), None

    def _keyed(self, record: Record) -> tuple[PreparedRequest, str | None]:
        """The row's request with its key in the configured header, and the key; raises `RenderError`."""
        request = self.renderer.render(record)
        key = self.key(record, request)
        return self.renderer.with_idempotency_key(request, key), key


def idempotency_key(
    config_fingerprint: str,
    row_identity: str,
    request: PreparedRequest,
    *,
    redactor: Redactor,
    skip_header: str | None = None,
    delivery: str | None = None,
) -> str:
    """A stable key for one row's request: 32 hex characters of a SHA-256.

    It hashes canonical bytes of the job's semantic fingerprint, the row's identity (the `key`
    field's value, else the row number) and the rendered request (method, URL, headers, body)
    with every secret value replaced by `***` and the idempotency header (`skip_header`) left
    out. So it is the same across retries, resumes and re-runs of unchanged data, it changes when
    the row's content (or the job's meaning) changes, and it does not change when a secret rotates.

    `delivery` (a delta or mirror job's: the run that delivers the row, docs/delta.md) scopes the
    key to one delivery: a revert A → B → A sends A again under a key the target has not answered
    yet, while every attempt, resume and identical re-run of that run keeps it. Without one (a full
    job), the key is what it always was.
    """
    redact = redactor.redact_rendered
    url, headers = _redacted_frame(request, redact, (skip_header or "").lower())
    body = None if request.body is None else redact(request.body.decode("utf-8", "replace"))
    return _key_of(config_fingerprint, row_identity, request.method, url, headers, body, delivery)


def _redacted_frame(
    request: PreparedRequest, redact: Callable[[str], str], skip: str
) -> tuple[str, list[list[str]]]:
    """The URL and headers as the key hashes them: secrets as `***`, the idempotency header left out."""
    headers = [[name, redact(value)] for name, value in request.headers if name.lower() != skip]
    return redact(request.url), headers


def _key_of(  # noqa: PLR0917 (the canonical parts, in their order)
    config_fingerprint: str,
    row_identity: str,
    method: str,
    url: str,
    headers: list[list[str]],
    body: str | None,
    delivery: str | None,
) -> str:
    """32 hex characters of the SHA-256 of the key's canonical parts (see `idempotency_key`)."""
    parts = [_KEY_SCHEME, config_fingerprint, row_identity, method, url, headers, body]
    if delivery is not None:
        parts.append(f"delivery:{delivery}")
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:32]


def _redactor(
    url: str, values: Mapping[str, str], token_request: TokenRequest | None, shown: Collection[str]
) -> Redactor:
    """Hides every secret (not the `vars`) and what the transport builds from them: URL credentials sent
    as Basic auth, and the client's Basic credentials of a token request."""
    hidden = [value for name, value in values.items() if name not in shown]
    derived = basic_credentials(_url_head(url, values), hidden)
    if token_request is not None:
        derived.append(token_request.basic_credentials)
        derived += [token_request.key.pem.strip()] if token_request.key is not None else []
        derived += url_credentials(token_request.token_url)
    return Redactor(hidden, derived=derived)


def _url_head(url: str, secrets: Mapping[str, str]) -> str:
    """The URL up to its first record field, secrets in place: where `user:password@` credentials sit."""
    head = ""
    for part in compile_template(url).parts:
        if isinstance(part, FieldRef):
            break
        head += part if isinstance(part, str) else secrets[part.name]
    return head


def _content_type_for(req: RequestConfig) -> str | None:
    if req.json_ is not None:
        return _CONTENT_TYPES["json"]
    return _CONTENT_TYPES["form"] if req.form is not None else None


def _header_value(name: str, template: BoundTemplate, fields: Fields) -> str:
    if template.constant is not None:
        return template.constant
    value = template.render(fields)
    if (refusal := header_value_refusal(value)) is not None:
        raise RenderError(min(template.fields), f"{refusal}, which header {name} cannot carry")
    return value


def _sent_as_rendered(url: BoundTemplate, query: tuple[tuple[str, BoundTemplate], ...]) -> bool:
    """Whether every URL this template renders is already in the form the transport sends, so the
    per-row parse (the costliest step of a render) can be skipped.

    True when the template's own text is in wire form (a sample row with every field "x" comes back
    from the parser unchanged, with no fragment) and no field sits in the scheme or authority. Then a
    row only adds field values, and those hold nothing the parser rewrites: a URL field is percent-
    encoded down to letters, digits, `_.~-` and `%XX`, a query value (`query:`) to those and `+`. The
    one thing the parser still does to such text, resolving a `.`/`..` segment, `BoundTemplate.render`
    refuses already; a literal `%` or `%X` just before a field could complete a `%2e` there, so such a
    template keeps the parse."""
    if url.authority_fields or url.completes_escape:
        return False
    sample = url.render(dict.fromkeys(url.fields, "x"))
    if query:
        pairs = [(name, template.render(dict.fromkeys(template.fields, "x"))) for name, template in query]
        sample += ("&" if "?" in sample else "?") + urlencode(pairs)
    try:
        return "#" not in sample and wire_url(sample) == sample
    except ValueError:
        return False


def _refuse_unsendable_url(source: str, url: BoundTemplate) -> None:
    """With the secrets in place and each field standing in as "1", the URL must be one the transport
    sends; else every row would fail alike. (Without secrets, loading the job file has checked this.)"""
    try:
        wire_url(url.render(dict.fromkeys(url.fields, "1")))
    except ValueError as exc:
        names = sorted(compile_template(source).secrets)
        raise SecretInvalid(
            f"request.url with {', '.join(names)} in place is not a URL the transport sends: {exc}",
            context={"invalid": names},
            suggestion=f"set {names[0] if names else 'the variable'} to an http:// or https:// URL",
        ) from None


def _refuse_unsendable_secrets(req: RequestConfig, secrets: Mapping[str, str]) -> None:
    """A secret in a header or the URL that the transport cannot send is `SecretInvalid`, found once here
    rather than as a failure of every row. The URL parser would silently drop a line break, so the same
    rule holds there (and the redactor could then no longer find the secret)."""
    placed = [(f"request.headers.{name}", text) for name, text in req.headers.items()]
    refused: dict[str, str] = {}
    for place, text in [*placed, ("request.url", req.url)]:
        for name in sorted(compile_template(text).secrets):
            if name not in refused and (refusal := header_value_refusal(secrets[name])) is not None:
                refused[name] = f"{refusal} (used in {place})"
    if refused:
        listed = "; ".join(f"{name} {why}" for name, why in refused.items())
        first = next(iter(refused))
        raise SecretInvalid(
            f"environment variable{'s' if len(refused) > 1 else ''} cannot be sent: {listed}",
            context={"invalid": list(refused)},
            suggestion=f"set {first} without line breaks or control characters "
            "(a value read from a file often ends with a newline)",
        )


# --- bodies ---------------------------------------------------------------------------------


def _body_fields(req: RequestConfig) -> set[str]:
    fields: set[str] = set()
    if req.json_ is not None:
        fields.update(leaf.field for leaf in _json_leaves(req.json_) if isinstance(leaf, JsonField))
    for value in (req.form or {}).values():
        if isinstance(value, FormField):
            fields.add(value.from_)
    return fields


def _json_leaves(node: JsonNode) -> Iterable[JsonNode]:
    if isinstance(node, dict):
        for child in node.values():
            yield from _json_leaves(child)
    else:
        yield node.key if isinstance(node, JsonLookup) else node


def _body_renderer(
    req: RequestConfig,
    bind: Callable[[str], BoundTemplate],
    sorted_json: bool = False,
    lookups: Mapping[str, LookupMap] | None = None,
) -> Callable[[Fields], bytes] | None:
    if req.json_ is not None:
        return _json_body(with_nulls(req.json_, req.nulls), _json_option(sorted_json), lookups)
    if req.form is not None:
        return _form_body(req.form, bind, req.nulls)
    if req.body is not None:
        template = bind(req.body)
        return lambda fields: template.render(fields).encode()
    return None


def json_renderer(
    node: JsonNode,
    *,
    sorted_json: bool = False,
    nulls: Nulls | None = None,
    lookups: Mapping[str, LookupMap] | None = None,
) -> Callable[[Fields], bytes]:
    """The bytes of a `json` tree for a record's fields, as `render` writes a body (a batch item's too)."""
    return _json_body(with_nulls(node, nulls), _json_option(sorted_json), lookups)


def value_getter(node: JsonNode) -> Callable[[Fields], Any]:
    """The value a request.json tree takes for a record's fields, as a body would hold it (a bulk job's
    CSV column); raises `RenderError` as rendering does."""
    return _json_getter(node)


def _json_option(sorted_json: bool) -> int:
    return orjson.OPT_SORT_KEYS if sorted_json else 0


class _Generated:
    """A function written for one job. Its source names only generated identifiers (`_0`, `_1`, ...),
    each bound in its namespace to a value: a key, a field name, a literal, a helper. So nothing
    from the job file is ever read as code."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {}

    def bound(self, value: Any) -> str:
        name = f"_{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def define(self, name: str, source: str) -> Any:
        """The function `name` defined by `source`; None when Python cannot compile it (nesting)."""
        try:
            code = compile(source, f"<bulkrelay {name}>", "exec")
        except (SyntaxError, RecursionError, MemoryError):
            return None
        exec(code, self.namespace)  # generated names only: see the class
        return self.namespace[name]


def _json_display(node: JsonNode, code: _Generated, lookups: Mapping[str, LookupMap] | None = None) -> str:
    """The `json` tree as one expression over the fields `f`: a dict display such as
    `{_0: f[_1], _2: _3(_4, f[_4]), _5: _6}`, the fastest way Python builds a dict (a tree of small
    getters costs a call per leaf and a comprehension per object). A missing field surfaces as
    `KeyError`, a bad value as `RenderError`; the value is the getters' (`_json_getter`) when it
    succeeds, and their exact error is found by asking them again."""
    if isinstance(node, JsonValue):
        return code.bound(node.value)
    if isinstance(node, JsonLookup):
        return f"{code.bound(_json_getter(node, lookups))}(f)"
    if not is_plain(node):
        return f"{code.bound(leaf_getter(node, _leaf_parts(lookups)))}(f)"  # job/values.py's leaves
    if isinstance(node, JsonField):
        if node.optional or node.pointer is not None:
            return f"{code.bound(_field_getter(node))}(f)"  # absence is no error, or a path to follow
        field = code.bound(node.from_)
        if node.type is None:
            return f"f[{field}]"
        coerce = code.bound(_COERCERS[node.type])
        if node.type == "integer":  # _to_integer's common case, without the call
            return (
                f"(int(v) if (v := f[{field}]).__class__ is str and len(v) < 19 and v.isdigit()"
                f" and v.isascii() else {coerce}({field}, v))"
            )
        return f"{coerce}({field}, f[{field}])"
    if any(may_omit(child) for child in node.values()):
        return f"{code.bound(_json_getter(node, lookups))}(f)"  # a key may be left out: no dict display
    items = (f"{code.bound(key)}: {_json_display(child, code, lookups)}" for key, child in node.items())
    return "{" + ", ".join(items) + "}"


def _json_body(
    node: JsonNode, option: int = 0, lookups: Mapping[str, LookupMap] | None = None
) -> Callable[[Fields], bytes]:
    """The body of a `json` request: `_json_display` handed to `orjson.dumps`, in one generated
    function; when the display fails, the reference getters build the value again and raise exactly
    the error they name. A tree too deep to compile is rendered by the getters alone."""
    reference = _json_getter(node, lookups)
    encode = _json_encoder(option)
    code = _Generated()
    try:
        display = _json_display(node, code, lookups)
    except RecursionError:
        display = None
    body = None
    if display is not None:
        body = code.define(
            "body",
            f"def body(f):\n    try:\n        value = {display}\n"
            f"    except {code.bound((KeyError, RenderError))}:\n        value = {code.bound(reference)}(f)\n"
            f"    return {code.bound(encode)}(value)\n",
        )
    if body is None:
        return lambda fields: encode(reference(fields))
    compiled: Callable[[Fields], bytes] = body
    return compiled


def _json_encoder(option: int) -> Callable[[Any], bytes]:
    def encode(value: Any) -> bytes:
        try:
            return orjson.dumps(value, option=option)
        except orjson.JSONEncodeError as exc:
            raise _not_json(exc) from None

    return encode


def _not_json(exc: orjson.JSONEncodeError) -> RenderError:
    return RenderError("json", f"cannot be written as JSON: {exc}")


def _form_body(
    form: Mapping[str, str | FormField | KindLeaf],
    bind: Callable[[str], BoundTemplate],
    nulls: Nulls | None = None,
) -> Callable[[Fields], bytes]:
    getters = tuple((name, _form_getter(value, bind, nulls, name)) for name, value in form.items())

    def render(fields: Fields) -> bytes:
        pairs = [(name, value) for name, get in getters if (value := get(fields)) is not _OMIT]
        return urlencode(pairs).encode("ascii")

    return render


def _form_getter(
    value: str | FormField | KindLeaf, bind: Callable[[str], BoundTemplate], nulls: Nulls | None, name: str
) -> Callable[[Fields], str]:
    if isinstance(value, str):
        return bind(value).render
    if isinstance(value, FormField) and value.model_fields_set == {"from_"} and nulls is None:
        return _text_getter(value.from_)
    return form_getter(value, nulls, _LEAF_PARTS, name)  # job/values.py's leaves, their value as text


def _text_getter(name: str) -> Callable[[Fields], str]:
    def get(fields: Fields) -> str:
        try:
            value = fields[name]
        except KeyError:
            raise RenderError(name, "missing from the record") from None
        return value if type(value) is str else value_text(name, value)

    return get


def _json_getter(node: JsonNode, lookups: Mapping[str, LookupMap] | None = None, path: str = "") -> Getter:
    if isinstance(node, JsonValue):
        literal = node.value
        return lambda fields: literal
    if isinstance(node, JsonLookup):
        return lookup_getter(node, lookups or {}, _field_getter(node.key))
    if not is_plain(node):
        return leaf_getter(node, _leaf_parts(lookups), path)  # the path names a Liquid leaf's errors
    if isinstance(node, JsonField):
        return _field_getter(node)
    items = tuple(
        (key, _json_getter(child, lookups, f"{path}.{key}" if path else key)) for key, child in node.items()
    )
    return lambda fields: {key: value for key, get in items if (value := get(fields)) is not _OMIT}


def _field_getter(leaf: JsonField) -> Getter:
    name = leaf.from_
    pointer = leaf.pointer
    if leaf.type is None and not leaf.optional and pointer is None:
        return _as_read_getter(name)
    coerce = _COERCERS[leaf.type] if leaf.type is not None else None
    has_default, default = leaf.has_default, leaf.default
    empty_is_absent = leaf.type not in (None, "string")
    missing = {"error": _ABSENT, "omit": _OMIT, "null": None}[leaf.when_missing]

    def get(fields: Fields) -> Any:
        value = fields.get(name, _ABSENT) if pointer is None else _pointed(fields, pointer)
        if value is _ABSENT and missing is not _ABSENT:
            return missing
        if value is _ABSENT or value is None or (empty_is_absent and value == ""):
            if has_default:
                return default
            return _absent_value(name, value, leaf.type)
        return value if coerce is None else coerce(name, value)

    return get


def _pointed(fields: Fields, pointer: tuple[str, ...]) -> Any:
    """The value a JSON pointer names in the record, or _ABSENT where the path leads nowhere."""
    node: Any = fields
    for token in pointer:
        if isinstance(node, Mapping):
            node = node.get(token, _ABSENT)
        elif isinstance(node, list) and token.isdigit() and (token == "0" or token[0] != "0"):
            node = node[int(token)] if int(token) < len(node) else _ABSENT
        else:
            return _ABSENT
        if node is _ABSENT:
            return _ABSENT
    return node


def _as_read_getter(name: str) -> Getter:
    def get(fields: Fields) -> Any:
        try:
            return fields[name]
        except KeyError:
            raise RenderError(name, "missing from the record") from None

    return get


def _absent_value(name: str, value: object, type_name: str | None) -> Any:
    if value is _ABSENT:
        raise RenderError(name, "missing from the record")
    if value is None and type_name in (None, "json"):
        return None
    state = "null" if value is None else "empty"
    raise RenderError(name, f"is {state}; type {type_name} needs a value (a `default` allows {state} values)")


# --- type coercion: CSV text (or a JSON string) into the configured type --------------------


def _to_integer(name: str, value: Any) -> int:
    if type(value) is str and len(value) < 19 and value.isdigit() and value.isascii():
        return int(value)  # the common case (CSV text), short of the range check and the regex
    if type(value) is int:
        if value in INT64_RANGE:
            return value
        raise RenderError(name, f"{value!r} is out of the signed 64-bit integer range")
    if type(value) is str and _INTEGER.fullmatch(text := value.strip()):
        sign, digits = ("-" if text[0] == "-" else ""), text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 19:  # past the range; and int() refuses over 4,300 digits, zeros in front too
            raise RenderError(name, f"{_shown(value)} is out of the signed 64-bit integer range")
        number = int(sign + digits)
        if number in INT64_RANGE:
            return number
        raise RenderError(name, f"{value!r} is out of the signed 64-bit integer range")
    raise RenderError(name, f"{value!r} is not an integer")


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 40 else repr(f"{value[:37]}...")


def _to_number(name: str, value: Any) -> int | float:
    if type(value) is int:
        return value
    if type(value) is float and math.isfinite(value):
        return value
    if type(value) is str and _NUMBER.fullmatch(text := value.strip()):
        if _INTEGER.fullmatch(text):
            return _to_integer(name, text)
        number = float(text)
        if math.isfinite(number):
            return number
    raise RenderError(name, f"{value!r} is not a finite number")


def _to_boolean(name: str, value: Any) -> bool:
    if type(value) is bool:
        return value
    if type(value) is int and value in (0, 1):
        return value == 1
    if type(value) is str:
        found = _BOOLEANS.get(value.strip().lower())
        if found is not None:
            return found
    raise RenderError(name, f"{value!r} is not a boolean (true/false, 1/0, yes/no)")


def _to_json(name: str, value: Any) -> Any:
    if type(value) is not str:
        return value
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        raise RenderError(name, f"{value!r} is not valid JSON") from None
    if (shown := integer_beyond_64_bits(value)) is not None:  # orjson made it a float: never sent rounded
        raise RenderError(name, f"holds the integer {shown}, outside the 64-bit range (send it as a string)")
    return parsed


def _to_string(name: str, value: Any) -> str:
    return value if type(value) is str else value_text(name, value)


_COERCERS: dict[str, Callable[[str, Any], Any]] = {
    "integer": _to_integer,
    "number": _to_number,
    "boolean": _to_boolean,
    "json": _to_json,
    "string": _to_string,
}
_LEAF_PARTS = LeafParts(
    read=_field_getter, coercers=_COERCERS, node=lambda node, path: _json_getter(node, None, path)
)


def _leaf_parts(lookups: Mapping[str, LookupMap] | None) -> LeafParts:
    """What job/values.py's leaves are lent: a tree inside one (a when's branch, a coalesce's choice) may
    read the job's lookups too."""
    if not lookups:
        return _LEAF_PARTS
    return _LEAF_PARTS._replace(node=lambda node, path: _json_getter(node, lookups, path))
