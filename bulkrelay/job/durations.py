"""Durations as users type them: `500ms`, `30s`, `5m`, `2h`, `30d`, or a bare number of seconds.

A bare number is seconds everywhere, as in the job file's `*_seconds` keys.
"""

from __future__ import annotations

import re

from bulkrelay.errors import UsageError

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}  # d: retention ages
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration_ms(text: str, *, what: str = "duration") -> int:
    match = _PATTERN.match(text)
    if match is None:
        raise UsageError(
            f"{what} {text!r} is not a duration",
            suggestion="use 500ms, 30s, 5m, 2h, 30d or a bare number of seconds",
        )
    number, unit = match.groups()
    return round(float(number) * _UNITS_MS[unit or "s"])
