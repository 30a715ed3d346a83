"""A rendered request as a curl command line, for a support ticket: `render --curl`.

Built from what `render` shows, so every secret is already `***`; each word is shell-quoted, so the
line pastes into a POSIX shell as it is (fill in the secrets first). `--globoff` keeps curl from
reading `[]` and `{}` in a URL as its own patterns.

The body must reach the target as the relay's bytes and nothing else. `--data-binary BODY` would not:
curl reads a body that starts with `@` as the name of a local file to upload (`@/proc/self/environ`).
`--data-raw` sends its word as it is, whatever its first character. A word cannot carry a NUL, and a
line break or another control character would split or garble the one line a person pastes, so a body
holding one is written as a `printf` format instead, every such character an octal escape, piped to
`--data-binary @-` (curl's standard input, read byte for byte).
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Iterable


def curl_command(method: str, url: str, headers: Iterable[tuple[str, str]], body: str | None) -> str:
    words = ["curl", "--globoff", "-X", method, url]
    for name, value in headers:
        words += ["-H", f"{name}: {value}"]
    if body is None:
        return _line(words)
    if not any(_needs_escape(char) for char in body):
        return _line([*words, "--data-raw", body])
    return _line(["printf", _printf_format(body)]) + " | " + _line([*words, "--data-binary", "@-"])


def _line(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def _needs_escape(char: str) -> bool:
    """A control character (C0, DEL, C1) or an invisible format character (bidi controls among them)."""
    return unicodedata.category(char) in ("Cc", "Cf")


def _printf_format(body: str) -> str:
    """`body` as a POSIX printf format that prints exactly its UTF-8 bytes: `%` and `\\` doubled,
    each control or format character as three-digit octal escapes of its bytes."""
    parts: list[str] = []
    for char in body:
        if char in "%\\":
            parts.append(char * 2)
        elif _needs_escape(char):
            parts.extend(f"\\{byte:03o}" for byte in char.encode())
        else:
            parts.append(char)
    return "".join(parts)
