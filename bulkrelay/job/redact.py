"""Hiding secret values: `***` wherever a secret appears in a text, in whatever spelling.

The journal keeps some of what the target sends back (captured values, the start of a failure
body) and the text of transport errors; a target may echo a secret in any of them, spelled many
ways. A `Redactor`, built once per run from the job's secret values, matches each secret:

- character by character, in any mix of: the character itself; a JSON escape (`\\"`, `\\\\`,
  `\\/`, `\\n`, `\\u00e9` in either case, surrogate pairs for characters beyond U+FFFF); the
  percent-encoding of its UTF-8 bytes (either case; `+` for a space); an HTML character
  reference for `& < > " '`;
- in base64 (standard and URL-safe alphabets, with or without padding), alone or inside a
  longer base64 text at any of the three byte alignments (the characters made of the secret's
  bits only; the one or two at each edge that mix in a neighbour's bits are left);
- and the same for each *derived* string the transport builds from secrets and puts on the
  wire: the `user:password` of credentials in the URL, which reqwest sends as HTTP Basic auth.

A request.auth mechanism also puts secrets of its own on each attempt (a signature, SigV4's
`Authorization` header): `hiding(values)` gives a redactor that hides those too, made only when an
answer to that attempt is about to be written (a failure body, captured values, an error text), so a
job pays nothing per row for it.

Occurrences that overlap are hidden together, as one `***`. `redact_prefix` keeps the start of a
text so that a secret crossing the cut is hidden whole, and a text that was itself cut short
(a body the transport truncated) keeps no tail that could be the start of a secret.
A redactor without secrets returns every text as it is, at the cost of one attribute test.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Collection, Iterable
from typing import Any
from urllib.parse import SplitResult, quote, quote_plus, unquote, urlsplit

import orjson

from bulkrelay.job.wire import url_spellings

REDACTED = "***"
LEARNT_KEPT = 8  # secrets learnt during a run that stay hidden (see `Redactor.learn`)

# Unaligned base64 fragments shorter than this would hide ordinary words in every body.
_BASE64_FRAGMENT_MIN = 6
# Characters spelled only as they are, by a `\\` escape or a `%` escape (no HTML reference, no `+`).
_PLAIN = re.compile(r"[A-Za-z0-9+/=._:,-]+")
_SPLIT_UP_TO = 256  # characters; see `_spellings`
_JSON_SHORT = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
_HTML_NAMED = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;"}

Alternative = tuple[str, int]  # a regex and the length of the longest text it matches


class Redactor:
    """Replaces every secret value (and string derived from one), in any encoding, with `***`."""

    def __init__(self, secret_values: Iterable[str], *, derived: Iterable[str] = ()) -> None:
        secrets = {value for value in secret_values if value}
        # A secret put into the URL is sent (and named by transport errors) in the wire's normal form.
        secrets |= {form for value in secrets for form in url_spellings(value) if form}
        self._values = secrets | {value for value in derived if value}
        self._learnt: list[str] = []
        # `hiding`'s: an attempt's own secrets, their literal and base64 forms, their lazy pattern.
        self._also_values: tuple[str, ...] = ()
        self._also_forms: tuple[str, ...] = ()
        self._also_plain = True
        self._also: re.Pattern[str] | None = None
        self._compile()
        rendered = {form for value in secrets for form in (value, quote(value, safe=""), quote_plus(value))}
        self._rendered = _alternation(map(re.escape, sorted(rendered, key=len, reverse=True)))

    def _compile(self) -> None:
        values = self._values.union(self._learnt)
        self._pattern, self.longest = _compiled(values)

    def hiding(self, values: Collection[str]) -> Redactor:
        """A redactor hiding `values` too (in every spelling), for what is written of the answer to one
        attempt that carried them: its signature, made for it alone. `self` when there are none.

        Their pattern is compiled only for a text that may hold one (see `_may_spell`): compiling costs
        ~20 ms, and most answers echo nothing. Not for `learn`: the values are the attempt's."""
        kept = tuple(value for value in values if value)
        if not kept:
            return self
        extended = copy.copy(self)
        extended._also_values = kept
        forms = (form for value in kept for form in (value, *_base64_forms(value.encode())))
        extended._also_forms = tuple(forms)
        extended._also_plain = all(_PLAIN.fullmatch(value) for value in kept)
        # A plain value's longest spelling is a six-character JSON escape (\u00e9) for each of its
        # characters (see `_char_alternatives`).
        extended.longest = max(self.longest, *(6 * len(value) for value in kept))
        if self._pattern is None or not extended._also_plain:
            extended._also_compiled()
        return extended

    def _also_compiled(self) -> re.Pattern[str] | None:
        """The pattern of `hiding`'s values, compiled the first time it is needed."""
        if self._also is None and self._also_values:
            self._also, longest = _compiled(self._also_values)
            self.longest = max(self.longest, longest)
            if self._pattern is None:  # nothing else to hide: the values' pattern is the one
                self._pattern, self._also, self._also_values = self._also, None, ()
        return self._also

    def _may_spell(self, text: str) -> bool:
        """Whether `text` may hold a spelling of one of `hiding`'s values. A plain value (characters no
        HTML reference or `+` spells) is spelled otherwise than as it is only with a `\\` or `%` escape, so
        a text without either holds one only literally, or in one of its base64 forms."""
        if not self._also_plain or "\\" in text or "%" in text:
            return True
        return any(form in text for form in self._also_forms)

    def learn(self, value: str) -> None:
        """Hide `value` too from now on: a secret obtained during the run (an OAuth2 access token).

        Only the last LEARNT_KEPT are kept: an older one can come back only in the answer to a request
        sent with it, and those have ended long since. `redact_rendered` never learns: the requests it
        reads are rendered before a token is added to them (idempotency keys stay what they were)."""
        if not value or value in self._learnt or value in self._values:
            return
        self._learnt = [*self._learnt[-(LEARNT_KEPT - 1) :], value]
        self._compile()

    @property
    def active(self) -> bool:
        """Whether there is anything to hide (a job without secrets pays nothing)."""
        return self._pattern is not None

    def redact(self, text: str) -> str:
        """`text` with every secret, in any spelling, replaced by `***`."""
        if self._pattern is None:
            return text
        spans = self._spans(text, len(text))
        return _replaced(text, spans, len(text)) if spans else text

    @property
    def hides_rendered(self) -> bool:
        """Whether `redact_rendered` can change anything (False: the job has no secrets to render)."""
        return self._rendered is not None

    def redact_rendered(self, text: str) -> str:
        """Redact text BulkRelay rendered itself (a request: for `render` and the idempotency key).

        A request holds secrets only as the renderer spells them: as they are, or percent-encoded by
        the query and form encoders. Matching just those is exact, and several times faster on the
        per-row path; it also keeps idempotency keys what they were before `redact` learnt more.
        """
        if self._rendered is None:
            return text
        return self._rendered.sub(REDACTED, text)

    def redact_prefix(self, text: str, limit: int, *, cut: bool = False) -> str:
        """The first `limit` characters of `text`, redacted; a secret crossing the cut is hidden whole.

        `cut`: the text was cut short (its end is not the end of what it came from), so its last
        characters may be the start of a secret: those that could be are withheld and marked `***`.
        """
        end = min(limit, len(text))
        if self._pattern is None:
            return text[:end]
        withheld = False
        if cut:
            # An occurrence starting here or later might have been longer than what is left.
            complete_before = max(len(text) - self.longest + 1, 0)
            withheld = complete_before < end
            end = min(end, complete_before)
        spans = self._spans(text, end)
        kept = _replaced(text, spans, end)
        if withheld and not (spans and spans[-1][1] >= end):
            kept += REDACTED
        return kept

    def redact_value(self, value: Any) -> Any:
        """A JSON value with every secret hidden: in strings, object keys, and numbers spelling one."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact(str(k)): self.redact_value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_value(item) for item in value]
        if value is None:
            return None
        text = orjson.dumps(value).decode()
        return value if self.redact(text) == text else REDACTED

    def _spans(self, text: str, end: int) -> list[list[int]]:
        """The merged [start, stop) extents of every occurrence starting before `end`, overlaps included."""
        assert self._pattern is not None
        found = _occurrences(self._pattern, text, end)
        if self._also_values and self._may_spell(text) and (also := self._also_compiled()) is not None:
            found = sorted([*found, *_occurrences(also, text, end)])
        spans: list[list[int]] = []
        for start, stop in found:
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], stop)
            else:
                spans.append([start, stop])
        return spans


def _occurrences(pattern: re.Pattern[str], text: str, end: int) -> list[tuple[int, int]]:
    """The extent of every match starting before `end`, in order, overlapping ones included."""
    search = pattern.search
    found = []
    match = search(text)
    while match is not None and match.start() < end:
        found.append(match.span())
        match = search(text, match.start() + 1)  # not its end: another secret may begin inside this one
    return found


def _compiled(values: Iterable[str]) -> tuple[re.Pattern[str] | None, int]:
    """One pattern matching every spelling of `values`, and the length of the longest text it matches."""
    # Longest first, so that at one position the fullest spelling wins.
    spellings = sorted((alt for value in values for alt in _spellings(value)), key=_length, reverse=True)
    return _alternation(regex for regex, _ in spellings), max((length for _, length in spellings), default=0)


def _length(alternative: Alternative) -> int:
    return alternative[1]


def _alternation(regexes: Iterable[str]) -> re.Pattern[str] | None:
    joined = "|".join(regexes)
    return re.compile(joined) if joined else None


def _replaced(text: str, spans: list[list[int]], end: int) -> str:
    out: list[str] = []
    position = 0
    for start, stop in spans:
        out += (text[position:start], REDACTED)
        position = stop
    if position < end:
        out.append(text[position:end])
    return "".join(out)


def basic_credentials(url_head: str, secret_values: Collection[str]) -> list[str]:
    """The `user:password` the transport sends as Basic auth for credentials in this URL, when secret.

    `url_head` is the URL up to its first record field. reqwest takes `scheme://user:pass@host`,
    percent-decodes user and password and sends `Authorization: Basic base64(user:pass)`.
    """
    _, separator, rest = url_head.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, at, _ = authority.rpartition("@")
    if not (separator and at):
        return []
    user, _, password = userinfo.partition(":")
    credentials = f"{unquote(user)}:{unquote(password)}"
    return [credentials] if any(value and value in credentials for value in secret_values) else []


def _spellings(value: str) -> list[Alternative]:
    """Every regex alternative that matches `value`: character-wise spellings, then base64 forms.

    The character-wise pattern is split on its first character's spellings, so that each top-level
    alternative starts with literal text: the regex engine then skips most positions of a body at once
    (about 3 times faster on a failure body than one alternative starting with a group). Each split
    copies the rest of the pattern, so a long secret (a key file) stays one alternative, which keeps
    the pattern small and quick to compile.
    """
    first, *rest = [_token_options(token) for token in re.findall(r"\\+|.", value, flags=re.DOTALL)]
    if len(value) > _SPLIT_UP_TO:
        first = [(_group(first), first[0][1])]
    tail = "".join(_group(options) for options in rest)
    tail_length = sum(options[0][1] for options in rest)
    character_wise = [(regex + tail, length + tail_length) for regex, length in first]
    return [*character_wise, *((re.escape(form), len(form)) for form in _base64_forms(value.encode()))]


def _group(options: list[Alternative]) -> str:
    return "(?:" + "|".join(regex for regex, _ in options) + ")"


def _token_options(token: str) -> list[Alternative]:
    """One character (or a run of backslashes) in each of its spellings, longest first."""
    if token.startswith("\\"):
        count = len(token)
        options = [(rf"(?:\\\\){{{count}}}", 2 * count), (rf"\\{{{count}}}", count)]
        options += [(rf"(?:\\u005[cC]){{{count}}}", 6 * count), (rf"(?:%5[cC]){{{count}}}", 3 * count)]
    else:
        options = _char_alternatives(token)
    return sorted(options, key=_length, reverse=True)


def _char_alternatives(char: str) -> list[Alternative]:
    options = [(re.escape(char), 1)]
    if char in _JSON_SHORT:
        options.append((re.escape(_JSON_SHORT[char]), 2))
    code = ord(char)
    units = [code] if code <= 0xFFFF else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + (code & 0x3FF)]
    options.append(("".join(r"\\u" + _hex(unit, 4) for unit in units), 6 * len(units)))
    encoded = char.encode()
    options.append(("".join("%" + _hex(byte, 2) for byte in encoded), 3 * len(encoded)))
    if char == " ":
        options.append((r"\+", 1))
    if char in _HTML_NAMED:
        named, decimal, digits = _HTML_NAMED[char], f"&#{code};", len(f"{code:x}")
        options += [(re.escape(named), len(named)), (re.escape(decimal), len(decimal))]
        options.append(("&#[xX]" + _hex(code, digits) + ";", digits + 4))
    return options


def _hex(number: int, width: int) -> str:
    """`number` as hex digits, each letter in either case."""
    return "".join(c if c.isdigit() else f"[{c}{c.upper()}]" for c in f"{number:0{width}x}")


def _base64_forms(data: bytes) -> set[str]:
    """`data` in base64 alone, and the part of it that is the same wherever it sits in a longer text."""
    whole = base64.b64encode(data).decode()
    forms = {whole, whole.rstrip("=")}
    for offset in (0, 1, 2):
        shifted = base64.b64encode(bytes(offset) + data).decode()
        first, stop = -(-8 * offset // 6), 8 * (offset + len(data)) // 6
        if stop - first >= _BASE64_FRAGMENT_MIN:
            forms.add(shifted[first:stop])
    return forms | {form.translate(_URLSAFE) for form in forms}


_URLSAFE = str.maketrans("+/", "-_")


# Query options of a Redis URL that carry a credential (redis-py passes every query option to the
# connection: `?password=`, `?username=`, and a TLS key's passphrase).
_URL_CREDENTIAL_OPTIONS = frozenset({"password", "username", "user", "ssl_password", "auth", "token"})


def redact_url_credentials(url: str) -> str:
    """`url` with every credential it can carry shown as `***`: the user information before `@`
    (`redis://:pw@host`, `redis://user:pw@host`), and the values of credential options in its query
    (`?password=pw`, `&username=u`), whatever their case or percent-encoding. The rest is kept, so the
    message still says which server it was."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, hash_, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rsplit('@', 1)[1]}"
    elif "@" in path:  # unix://user:pw@/path/to.sock: the path holds the user information
        path = f"{REDACTED}@{path.rsplit('@', 1)[1]}"
    if question:
        query = "&".join(_redacted_option(option) for option in query.split("&"))
    return f"{scheme}{sep}{authority}{slash}{path}{question}{query}{hash_}{fragment}"


def _redacted_option(option: str) -> str:
    name, equals, _ = option.partition("=")
    if equals and unquote(name).strip().lower() in _URL_CREDENTIAL_OPTIONS:
        return f"{name}={REDACTED}"
    return option


# An '@' past the host (in the path, query or fragment) or a second '@' before it: a user or password
# holding '/', '?', '#' or '@' that is not percent-encoded. Clients split such a URL differently (libpq
# takes the first '@', Python's parser the last; a '/' ends the host early), so a part of the password
# would be read, and named in messages, as the host, the port or the database.
_AT_PAST_HOST = re.compile(r"^[^:]*://(?:[^/?#]*[/?#].*@|[^/?#@]*@[^/?#]*@)", re.DOTALL)
UNENCODED_CREDENTIALS = (
    "has an '@' past the host: a user or password holding '/', '?', '#' or '@' is written"
    " percent-encoded (%2F, %3F, %23, %40)"
)


def unencoded_credentials(url: str) -> bool:
    """Whether `url` holds an '@' past its host or two before it (see `_AT_PAST_HOST`)."""
    return _AT_PAST_HOST.match(url) is not None


def url_split_safely(url: str) -> SplitResult:
    """`url` split into its parts, the same way by every client; `ValueError` when it cannot be (an
    unencoded credential, brackets left open, a port that is no number), whose message names no part of
    the URL, which may carry credentials."""
    if unencoded_credentials(url):
        raise ValueError(UNENCODED_CREDENTIALS)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsed here so that a bad one is refused here)
    except ValueError:
        raise ValueError(
            "has a host or port that does not parse (an IPv6 address is written in brackets, [::1]:5432;"
            " a port is a number from 0 to 65535)"
        ) from None
    return parts


def host_port_shown(host: str, port: int) -> str:
    """`host:port` as a URL writes it: an IPv6 address in brackets, so that its colons are not the port's."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


UNSHOWN_URL = "(a URL that cannot be parsed safely: not shown)"


def url_unsafe(url: str) -> str | None:
    """Why `url` cannot be shown safely (None: it can): a part of it might be a credential that a parser
    would show as host or path (see `unencoded_credentials`), or it
    does not parse (a bad port or bracket, a space or control character)."""
    if any(ord(char) <= 0x20 or char in "\\\x7f" for char in url):
        return "it holds a space, a backslash or a control character"
    try:
        parts = urlsplit(url)
        _ = parts.port  # ValueError: a port that is no number, an unclosed IPv6 bracket
    except ValueError:
        return "it does not parse as a URL"
    if not parts.scheme or not parts.hostname:
        return "it names no scheme and host"
    if unencoded_credentials(url):
        return "an @ follows its host, or two precede it (a password with an unencoded / ? # or @?)"
    return None


def url_for_display(url: str, redactor: Redactor | None = None) -> str:
    """`url` as messages show it: credentials in it `***` (user information, credential options), the
    run's secrets hidden; a URL that cannot be parsed safely is not echoed at all."""
    if url_unsafe(url) is not None:
        return UNSHOWN_URL
    shown = redact_url_credentials(url)
    return shown if redactor is None else redactor.redact(shown)


def url_credentials(url: str) -> list[str]:
    """The password in `url`'s user information, alone and as `user:password` (encoded and decoded): a
    secret even when written in the job file, hidden wherever a message might echo it."""
    if url_unsafe(url) is not None:
        return []
    userinfo = urlsplit(url).netloc.rpartition("@")[0]
    user, colon, password = userinfo.partition(":")
    if not (colon and password):
        return []
    return [password, unquote(password), userinfo, f"{unquote(user)}:{unquote(password)}"]
