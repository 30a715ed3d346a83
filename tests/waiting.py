"""Waiting on a condition: poll until it holds, and fail only after a bound that no loaded machine
reaches, only a hang. A passing test never waits out the bound, so a generous one costs nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import anyio

HANG_S = 300.0  # seconds: the bound of every wait on a condition
HANG_BUDGET = f"{int(HANG_S)}s"  # a call budget (`--budget`) that only a hang runs out of
HANG_BUDGET_MS = int(HANG_S * 1000)

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], what: str, bound: float = HANG_S, interval: float = 0.05) -> T:
    """The first answer of `probe` other than None or False, asked every `interval` seconds (short where
    a test must act close behind a change); AssertionError after `bound` seconds, naming `what`."""
    deadline = time.monotonic() + bound
    while (answer := probe()) is None or answer is False:
        assert time.monotonic() < deadline, f"waited {bound:.0f} s for {what}"
        time.sleep(interval)
    return answer


async def until(probe: Callable[[], object], what: str, bound: float = HANG_S) -> None:
    """`wait_for` inside an event loop, which goes on meanwhile (an in-process target answers)."""
    deadline = time.monotonic() + bound
    while not probe():
        assert time.monotonic() < deadline, f"waited {bound:.0f} s for {what}"
        await anyio.sleep(0.01)
