"""What BulkRelay keeps of a response: captured values on success, a truncated body on failure.

Both are redacted (see `bulkrelay.job.redact`) before the journal sees them: a target may echo a secret,
the job's or one its request.auth put on the attempt answered (`hiding`: a signature).
A failure body is redacted before it is cut, and in the body's own bytes: `failure_body_bytes` bytes
of the body are kept, and a secret that begins in them is hidden whole even where it crosses the cut.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import orjson

from bulkrelay.job.redact import Redactor

_MISSING = object()
_LINK_NEXT = re.compile(r'<([^>]*)>\s*;[^,]*\brel="?next"?', re.IGNORECASE)


def link_next(headers: Mapping[str, str]) -> str | None:
    """The `Link` header's rel="next" URL (as written: relative or absolute), if it has one."""
    match = _LINK_NEXT.search(headers.get("link", ""))
    return match.group(1) if match else None


def next_page(pointer: str | None, document: Any, headers: Mapping[str, str], url: str) -> str | None:
    """The URL of the page after `url` (absolute; given relative to `url` or not): the string at the
    JSON pointer `pointer` in the page's `document`, else its `Link` header's rel="next"; None on the
    last page. What a paged `get` lookup and a bulk job's paged results follow."""
    found = resolve_pointer(document, pointer) if pointer is not None else link_next(headers)
    return urljoin(url, found) if isinstance(found, str) and found else None


def same_origin(url: str, other: str) -> bool:
    """Whether `other` is on `url`'s scheme, host and port: only there may the job's credentials follow a
    link an answer gave (a next page, an archive), as browsers and curl keep them to one origin."""
    ours, theirs = urlsplit(url), urlsplit(other)
    return (ours.scheme, ours.netloc.lower()) == (theirs.scheme, theirs.netloc.lower())


def resolve_pointer(document: Any, pointer: str) -> Any:
    """RFC 6901 JSON pointer lookup; returns `_MISSING` when the path does not exist."""
    if pointer == "":
        return document
    current = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            if token not in current:
                return _MISSING
            current = current[token]
        elif isinstance(current, list):
            if not token.isdigit() or int(token) >= len(current):
                return _MISSING
            current = current[int(token)]
        else:
            return _MISSING
    return current


class ResponseReader:
    """Extracts what the journal keeps of a response (success itself is the retry policy's call)."""

    def __init__(self, capture: Mapping[str, str], failure_body_bytes: int, redactor: Redactor) -> None:
        self._capture = dict(capture)
        self._failure_body_bytes = failure_body_bytes
        self._redactor = redactor

    def hiding(self, values: Collection[str]) -> ResponseReader:
        """A reader for the answer to one attempt that carried `values` (its signature), hiding them too."""
        redactor = self._redactor.hiding(values)
        if redactor is self._redactor:
            return self
        reader = copy.copy(self)
        reader._redactor = redactor
        return reader

    def captured(self, body: bytes) -> dict[str, Any] | None:
        """Values at the configured JSON pointers; absent ones are null. None when nothing is configured."""
        if not self._capture:
            return None
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return dict.fromkeys(self._capture)
        out: dict[str, Any] = {}
        for name, pointer in self._capture.items():
            value = resolve_pointer(document, pointer)
            out[name] = None if value is _MISSING else self._redactor.redact_value(value)
        return out

    def failure_body(self, body: bytes, *, truncated: bool = False) -> str | None:
        """The start of a failure body as text, with any secret the target echoed hidden.

        `truncated`: the transport stopped reading the body, so its end may cut a secret short.
        """
        limit = self._failure_body_bytes
        if not body or limit <= 0:
            return None
        if not self._redactor.active:
            return body[:limit].decode("utf-8", errors="replace")
        # Enough beyond the cut to see whole any secret that begins before it (4 bytes a character).
        window = body[: limit + 4 * self._redactor.longest + 4]
        text = window.decode("utf-8", errors="replace")
        kept = len(body[:limit].decode("utf-8", errors="replace"))  # the cut, in characters
        cut_short = truncated or len(window) < len(body)
        return self._redactor.redact_prefix(text, kept, cut=cut_short)
