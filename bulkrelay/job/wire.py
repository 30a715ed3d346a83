"""What the wire accepts: the URL exactly as it is sent, and which header values can be sent at all.

Decided here and nowhere else, by asking pyreqwest's own parsers (the ones the default client's `send`
goes through), so preflight refuses exactly what the transport would, and `render` shows the URL exactly
as it goes on the wire. The URL is in the WHATWG normal form, which httpx sends unchanged too.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pyreqwest.http import HeaderMap, Url


def wire_url(url: str) -> str:
    """`url` exactly as the transport sends it; raises `ValueError` (naming no part of it) when refused.

    reqwest parses URLs the WHATWG way: it resolves dot segments (`.`, `..`, `%2e`), lower-cases the
    scheme and host, drops a default port, percent-encodes what may not appear raw and silently drops
    tabs and line breaks. A fragment is never sent, so it is not part of what goes on the wire.
    """
    # One parse and one serialisation: this runs for every row. The first "#" always begins the fragment,
    # and a special scheme without a host does not parse.
    sent = str(Url(url.partition("#")[0]))
    if not sent.startswith(("http://", "https://")):
        raise ValueError("the scheme is not http or https")
    return sent


def proxy_refusal(url: str) -> str | None:
    """Why a client could not be built with `url` as its proxy, or None when both can.

    reqwest refuses a port out of range, an empty host or one its parser rejects when the client is
    built; httpx some of these then, the rest at every request. The reason names no part of the URL,
    which may carry credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a bracket left open, a port that is no number or out of range
        return "its host or port does not parse (a port is a number from 1 to 65535)"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "its port is 0"
    try:
        Url(url)
    except ValueError:
        return "its host is not a valid name or address"
    return None


def url_spellings(value: str) -> set[str]:
    """The other forms `value` takes on the wire when it is put into a URL (a secret such as
    `${API_BASE}` or a host alone): the URL's normal form without the path the parser adds, and a
    host's (lower case, IDNA). Empty when the wire keeps `value` as it is, or it is no URL part."""
    forms = set()
    for candidate, prefix in ((value, ""), (f"http://{value}/", "http://")):
        try:
            sent = wire_url(candidate)
        except ValueError:
            continue
        sent = sent.removeprefix(prefix)
        forms.add(sent if value.endswith("/") else sent.removesuffix("/"))
    return forms - {value}


def header_value_refusal(value: str) -> str | None:
    """Why the transport would refuse `value` as a header value, or None when it is accepted.

    The reason names the offending character's code point, never the value (it may be a secret)."""
    if value.isascii() and value.isprintable():
        return None  # visible ASCII and spaces: every HTTP library accepts these; the common case, kept fast
    try:
        HeaderMap([("x", value)])
    except ValueError:
        bad = next((ch for ch in value if (ord(ch) < 32 and ch != "\t") or ord(ch) == 127), None)
        if bad is None:
            return "holds a character a header cannot carry"
        kind = "a line break" if bad in "\r\n" else "the control character"
        return f"holds {kind} U+{ord(bad):04X}"
    return None
