"""What BulkRelay keeps of a response: captured values on success, a truncated body on failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from bulkrelay.template import Redactor

_MISSING = object()


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
            out[name] = None if value is _MISSING else value
        return out

    def failure_body(self, body: bytes) -> str | None:
        """The start of a failure body as text, with any secret the target echoed hidden."""
        if not body or self._failure_body_bytes <= 0:
            return None
        text = body[: self._failure_body_bytes].decode("utf-8", errors="replace")
        return self._redactor.redact(text)
