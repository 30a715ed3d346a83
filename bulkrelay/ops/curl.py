"""A rendered request as a curl command line, for a support ticket: `render --curl`.

Built from what `render` shows, so every secret is already `***`; each word is shell-quoted, so the
line pastes into a POSIX shell as it is (fill in the secrets first). `--globoff` keeps curl from
reading `[]` and `{}` in a URL as its own patterns; `--data-binary` sends the body byte for byte.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def curl_command(method: str, url: str, headers: Iterable[tuple[str, str]], body: str | None) -> str:
    words = ["curl", "--globoff", "-X", method, url]
    for name, value in headers:
        words += ["-H", f"{name}: {value}"]
    if body is not None:
        words += ["--data-binary", body]
    return " ".join(shlex.quote(word) for word in words)
