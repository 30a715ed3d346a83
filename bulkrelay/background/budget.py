"""The call budget: how long a call that relays waits for its work before it hands it to a background
job (docs/jobs.md). `--budget MS`, else `AGENT_CALL_BUDGET_MS`, else 30 s when no terminal is there."""

from __future__ import annotations

from collections.abc import Mapping

from bulkrelay.errors import UsageError
from bulkrelay.job.durations import LONGEST_DURATION, MAX_MS, whole_number

BUDGET_ENV = "AGENT_CALL_BUDGET_MS"
DEFAULT_BUDGET_MS = 30_000


def resolve_budget(flag_ms: int | None, environ: Mapping[str, str], stdout_is_terminal: bool) -> int | None:
    """`--budget`, else AGENT_CALL_BUDGET_MS, else 30 s without a terminal; None: no budget at all.

    0 turns the budget off: the call runs synchronously (and says so with `meta.budget_ms` 0)."""
    if flag_ms is not None:
        return flag_ms
    raw = environ.get(BUDGET_ENV, "").strip()
    if raw:
        budget_ms = whole_number(raw)
        if budget_ms is None:
            raise UsageError(f"{BUDGET_ENV}={raw!r} is not a whole number of milliseconds")
        if budget_ms > MAX_MS:
            raise UsageError(f"{BUDGET_ENV}={raw!r} is longer than {LONGEST_DURATION}, the longest")
        return budget_ms
    return None if stdout_is_terminal else DEFAULT_BUDGET_MS
