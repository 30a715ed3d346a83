"""Values as a person writes them, for the report pages: `2m 05s`, `yes`, `10 s`, `1,204`, times to
the second in UTC and in the machine's own zone. Never a Python repr, never a microsecond."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bulkrelay.report.reportdata import epoch


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def clock(epoch_seconds: float) -> str:
    """A time of day in UTC, to the second (the charts' axes)."""
    return time.strftime("%H:%M:%S", time.gmtime(epoch_seconds))


def when(moment: str | float | None) -> str:
    """A timestamp (ISO, as run.json and run.log keep it, or epoch seconds) to the second, in UTC and in
    the machine's zone: `2026-12-05 02:30:00 UTC (03:30:00 CET)`."""
    at = moment if isinstance(moment, float | int) else epoch(moment)
    if at is None:
        return "—" if moment is None else str(moment)
    utc = datetime.fromtimestamp(at, UTC)
    local = utc.astimezone()
    text = f"{utc:%Y-%m-%d %H:%M:%S} UTC"
    if local.utcoffset() != utc.utcoffset():
        same_day = local.date() == utc.date()
        text += f" ({local:%H:%M:%S %Z})" if same_day else f" ({local:%Y-%m-%d %H:%M:%S %Z})"
    return text


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def count(value: int | float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def rate(rows: int, seconds: float | None) -> str:
    if not seconds or seconds <= 0:
        return "—"
    return f"{rows / seconds:,.1f} rows/s"


def percent(part: int, whole: int) -> str:
    if whole <= 0:
        return "0%"
    share = 100 * part / whole
    return f"{share:.0f}%" if share >= 10 or share == 0 else f"{share:.1g}%" if share < 1 else f"{share:.1f}%"


_SECONDS_SUFFIX = "_seconds"


def value(item: Any, name: str = "") -> str:
    """A setting's value as a person writes it: yes/no, none, lists joined, seconds with their unit,
    a mapping as `connect 10 s, read 30 s`."""
    if isinstance(item, bool):
        return "yes" if item else "no"
    if item is None:
        return "none"
    if isinstance(item, Mapping):
        return ", ".join(f"{label(str(k))} {value(v, str(k))}" for k, v in item.items()) or "none"
    if isinstance(item, list | tuple):
        return ", ".join(value(v) for v in item) or "none"
    if isinstance(item, float) and item.is_integer():
        item = int(item)
    if name.endswith(_SECONDS_SUFFIX) or name in ("connect", "read", "write", "pool", "total"):
        return f"{item} s"
    return str(item)


def label(name: str) -> str:
    """A setting's key as words: `max_lifetime_seconds` -> `max lifetime`, `http2` stays."""
    return name.removesuffix(_SECONDS_SUFFIX).replace("_", " ")
