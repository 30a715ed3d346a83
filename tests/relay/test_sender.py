"""The row sender's small helpers (the sender itself is driven through the engine in test_engine.py)."""

from __future__ import annotations

import random

from bulkrelay.relay.sender import _milliseconds


def test_milliseconds_are_the_rounded_microseconds_round_would_give() -> None:
    rng = random.Random(15)
    for _ in range(20_000):
        seconds = rng.uniform(0, 100) * 10 ** rng.randint(-6, 0)
        assert _milliseconds(seconds) == round(seconds * 1000, 3)
    assert _milliseconds(0.0) == 0.0
    assert _milliseconds(1.2345674) == 1234.567
