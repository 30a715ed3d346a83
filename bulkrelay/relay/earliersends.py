"""Rows an earlier call of this run may have sent without their result being journaled.

A call killed (kill -9, a power loss) between a row's send and its commit leaves the row pending, and
a target that keeps idempotency keys may still be processing that send when the next call (`resume`,
the identical re-run) sends the row again: it answers 409, "in progress" (the IETF Idempotency-Key
draft, Stripe). To the row's first send in this call, that 409 is not the row's result but the earlier
send, still under way: it is waited out as any 409 to a key sent before (relay/retry.py `in_progress`).

Which rows can it be? A call sends its rows in row order, so the earlier call's rows sent and not
journaled are the rows left pending below the journal's highest row (in flight, held back in a failure
streak, waiting to retry) and, above it, at most its rows in flight (`concurrency` requests), the rows
its journal writer held answered but not yet committed, a failure streak held back, and with workers
the rows one worker ran ahead of the slowest (relay/runahead.py, the same bound). Only those get
the benefit of the doubt: elsewhere a 409 to a first send is the target's refusal, final at once (a
key never sent cannot be in progress). A new run, and a `retry-failed` run's first call, have no earlier
call: nothing is in doubt.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EarlierSends"]


@dataclass(slots=True)
class EarlierSends:
    """The rows to doubt: those up to `highest` (the journal's highest row), and the first `window` rows
    this sender sends above it. Counted per sender: each worker process counts its own, in its own row
    order, which covers the earlier call's rows whichever worker sent them."""

    highest: int
    window: int

    def in_doubt(self, row: int, rows: int = 1) -> bool:
        """Whether the request of `rows` rows starting at `row`, about to be sent for the first time in
        this call, may repeat an earlier call's send. Asked once a request, in the order they are sent."""
        if row <= self.highest:
            return True
        if self.window <= 0:
            return False
        self.window -= rows
        return True
