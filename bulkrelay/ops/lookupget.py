"""A lookup read from a paginated GET (`lookups: NAME: {get, items, key, value, next, max_pages}`).

Pages are fetched one after the other through the job's own client (its transport, timeouts, TLS
identity and proxy), with the job's headers that name no record field (an `Authorization: Bearer
${TOKEN}`: to the first page's scheme, host and port only, never to a next page elsewhere), its retry
policy (statuses, attempts, backoff) and its rate limit. The next page is the `next` pointer's URL in
the answer, else the `Link` header's `rel="next"`. A page asked for twice (a loop), more than
`max_pages` pages, an answer that is not JSON or holds no list where `items` points are refused naming
the lookup and the page (exit 2); a page that still fails after the retries is INPUT_UNAVAILABLE (exit
12). Nothing is kept of a failed build."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import anyio
import orjson

from bulkrelay.errors import InputInvalid, InputUnavailable
from bulkrelay.job.config import Job, LookupConfig, ResponseConfig
from bulkrelay.job.records import PreparedRequest
from bulkrelay.job.template import compile_template, resolve_secrets
from bulkrelay.relay.engine import job_transport_settings
from bulkrelay.relay.response import next_page, same_origin
from bulkrelay.relay.retry import RetryPolicy
from bulkrelay.relay.transport import open_transport
from bulkrelay.relay.transport.base import Response, Transport, TransportError

_ABSENT = object()


def get_pairs(job: Job, name: str, given: LookupConfig, env: Any) -> list[tuple[Any, Any]]:
    """(key, value) of every item of every page."""
    assert given.get is not None and given.key is not None and given.value is not None  # a get lookup
    secrets = resolve_secrets(_secret_names(job, given.get), env)
    first = compile_template(given.get).bind(secrets, url=True).render({})
    headers = tuple(_constant_headers(job, secrets))
    return anyio.run(_fetch_all, job, name, given, first, headers)


def _secret_names(job: Job, url: str) -> list[str]:
    texts = [url, *job.config.request.headers.values()]
    return [name for text in texts for name in compile_template(text).secrets]


def _constant_headers(job: Job, secrets: dict[str, str]) -> Iterator[tuple[str, str]]:
    """The job's headers that name no record field (its credentials among them), secrets filled in."""
    for header, text in job.config.request.headers.items():
        template = compile_template(text)
        if not template.fields:
            yield header, template.bind(secrets).render({})


async def _fetch_all(
    job: Job, name: str, given: LookupConfig, url: str, headers: tuple[tuple[str, str], ...]
) -> list[tuple[Any, Any]]:
    transport = open_transport(job_transport_settings(job))
    pairs: list[tuple[Any, Any]] = []
    seen: set[str] = set()
    shown = given.get or url  # as the job file writes it: secrets stay ${NAME}
    try:
        next_url: str | None = url
        while next_url is not None:
            if next_url in seen:
                raise _invalid(job, name, f"page {len(seen) + 1} is {next_url} again: the pages loop")
            if len(seen) == given.max_pages:
                raise _invalid(job, name, f"more than max_pages ({given.max_pages}) pages")
            seen.add(next_url)
            page_shown = shown if len(seen) == 1 else next_url
            # The job's headers (its credentials) go to the first page's origin only, never to a next
            # page an answer points at elsewhere.
            own = headers if same_origin(url, next_url) else ()
            request = PreparedRequest("GET", next_url, (("Accept", "application/json"), *own), None)
            response = await _page(job, name, transport, request, page_shown)
            document = _json(job, name, response, len(seen))
            pairs.extend(_items(job, name, given, document, len(seen)))
            next_url = next_page(given.next, document, response.headers, next_url)
            await _pace(job)
    finally:
        await transport.aclose()
    return pairs


async def _page(job: Job, name: str, transport: Transport, request: PreparedRequest, shown: str) -> Response:
    """One page, retried as the job retries its rows."""
    retry = job.config.retry
    pages = RetryPolicy.from_config(retry, ResponseConfig(), job.config.halt)  # a page: any 2xx
    failure = ""
    for attempt in range(1, retry.max_attempts + 1):
        try:
            response = await transport.send(request)
        except TransportError as exc:
            failure = exc.message
        else:
            if pages.is_success(response.status):
                return response
            failure = f"HTTP {response.status}"
            if response.status not in retry.statuses:
                break
        if attempt < retry.max_attempts:
            backoff = min(retry.max_backoff_seconds, retry.initial_backoff_seconds * 2 ** (attempt - 1))
            await anyio.sleep(backoff * (1 + retry.jitter_ratio * random.random()))
    raise InputUnavailable(
        f"lookup {name}: GET {shown} failed: {failure}",
        context={"lookup": name, "url": shown, "reason": failure, "file": str(job.path)},
    )


def _json(job: Job, name: str, response: Response, page: int) -> Any:
    try:
        return orjson.loads(response.body)
    except orjson.JSONDecodeError:
        kind = response.headers.get("content-type", "no content type")
        raise _invalid(job, name, f"page {page} is not JSON ({kind})") from None


def _items(job: Job, name: str, given: LookupConfig, document: Any, page: int) -> Iterator[tuple[Any, Any]]:
    items = _pointed(document, given.items)
    if not isinstance(items, list):
        raise _invalid(job, name, f"page {page} has no list at items {given.items or '(the page)'}")
    assert given.key is not None and given.value is not None
    for index, item in enumerate(items):
        key, value = _pointed(item, given.key), _pointed(item, given.value)
        if key is _ABSENT or key is None:
            raise _invalid(job, name, f"page {page}, item {index}: no key at {given.key}")
        yield key, None if value is _ABSENT else value


async def _pace(job: Job) -> None:
    rate = job.config.execution.rate_limit
    if rate is not None:
        await anyio.sleep(1 / rate.requests_per_second)


def _pointed(node: Any, pointer: str) -> Any:
    if not pointer:
        return node
    for token in (part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")):
        if isinstance(node, dict):
            node = node.get(token, _ABSENT)
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _ABSENT
    return node


def _invalid(job: Job, name: str, message: str) -> InputInvalid:
    path = ("lookups", name, "get")
    return InputInvalid([job.problem_at(path, f"lookup {name}: {message}")])
