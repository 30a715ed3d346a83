"""Durations as users type them: `500ms`, `30s`, `5m`, `2h`, `30d`, or a bare number of seconds;
and the whole numbers they type (`whole_number`).

A bare number is seconds everywhere, as in the job file's `*_seconds` keys. No duration is longer
than `MAX_SECONDS` (36500 days, about a century): far beyond any run, yet a deadline that far off
still fits a clock, a timer and a 64-bit count of milliseconds, where a longer one would overflow.
"""

from __future__ import annotations

import re

from bulkrelay.errors import UsageError

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}  # d: retention ages
MAX_SECONDS = 36_500 * 86_400
MAX_MS = MAX_SECONDS * 1000
LONGEST_DURATION = f"{MAX_SECONDS // 86_400}d (about a century)"  # how messages name the limit
# Longer than any limit a whole number is checked against, and far short of the 4300 digits int() takes.
_MOST_DIGITS = 30
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration_ms(text: str, *, what: str = "duration") -> int:
    match = _PATTERN.match(text)
    if match is None:
        raise UsageError(
            f"{what} {text!r} is not a duration",
            suggestion="use 500ms, 30s, 5m, 2h, 30d or a bare number of seconds",
        )
    number, unit = match.groups()
    ms = float(number) * _UNITS_MS[unit or "s"]
    if ms > MAX_MS:
        raise UsageError(
            f"{what} {text!r} is longer than {LONGEST_DURATION}, the longest duration",
            suggestion="use 0 to turn a budget off, or a shorter duration",
        )
    return max(1, round(ms)) if ms > 0 else 0  # a tiny duration is not 0, which turns a budget off


def whole_number(text: str) -> int | None:
    """The whole number `text` spells in ASCII digits, else None. `str.isdigit` alone also takes `²`,
    which int() refuses; a number of more than _MOST_DIGITS digits (beyond every limit its callers
    check, and int() refuses one of 4300) is read as 10**_MOST_DIGITS, so it fails their limit."""
    if not (text.isascii() and text.isdigit()):
        return None
    return int(text) if len(text.lstrip("0")) <= _MOST_DIGITS else 10**_MOST_DIGITS
