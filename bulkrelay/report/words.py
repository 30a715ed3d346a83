"""Values as a person writes them, for the report pages: `2m 05s`, `yes`, `10 s`, `1,204`, times to
the second in UTC and in the machine's own zone. Never a Python repr, never a microsecond."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bulkrelay.store.rundir import epoch


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


def day(at: float | None) -> str:
    """A night's date on a chart's axis: `12-05` (UTC)."""
    return "?" if at is None else time.strftime("%m-%d", time.gmtime(at))


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
    if isinstance(item, int | float) and name.endswith(_SECONDS_SUFFIX):
        return seconds(item)
    return str(item)


_UNITS = ((86_400, "day"), (3_600, "hour"), (60, "minute"))


def seconds(amount: float) -> str:
    """A setting in seconds as it would be written: `10 s`, `5 minutes`, `7 days`."""
    for size, unit in _UNITS:
        if amount >= size and amount % size == 0:
            whole = int(amount // size)
            return f"{whole} {unit}{'s' if whole > 1 else ''}"
    return f"{amount:g} s"


def label(name: str) -> str:
    """A setting's key as words: `max_lifetime_seconds` -> `max lifetime`, `http2` stays."""
    return name.removesuffix(_SECONDS_SUFFIX).replace("_", " ")


_STOPS = {
    "interrupted": "stopped by Ctrl+C (SIGINT)",
    "terminated": "stopped by SIGTERM or SIGHUP",
    "timeout": "stopped at its time limit",
    "halt_auth": "halted: the target answered a status in halt.on_statuses",
    "halt_unavailable": "halted: too many failures in a row (halt.consecutive_failures)",
    "halt_limit_unavailable": "halted: the shared rate limit could not be reached",
    "token_refused": "halted: the token endpoint refused the client",
    "token_unavailable": "halted: no token could be had",
    "halt_failure_rate": "halted: too many rows failed (halt.failure_rate)",
    "cancelled": "cancelled",
    "stalled": "stopped: no progress for too long",
    "input_changed": "stopped: the input changed while it was read",
    "limit": "stopped after its --limit of rows (a canary)",
}


def verdict(state: str, stop_reason: str | None, live: bool, failed: int) -> str:
    """The night's result in words, the report's first line."""
    if state == "running":
        return "Running now" if live else "Interrupted: its process is gone (resume continues it)"
    if state == "completed":
        return "Completed: every row succeeded"
    if state == "completed_with_failures":
        return f"Completed with failures: {count(failed)} rows failed"
    if state == "cancelled":
        return "Cancelled"
    why = _STOPS.get(stop_reason or "", f"stopped ({stop_reason})" if stop_reason else "stopped")
    return why[0].upper() + why[1:] + " before every row was sent"
