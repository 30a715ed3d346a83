"""The halt rules with `execution.workers`: the run's process judges them over every worker's rows in
row order (relay/failurerate.py `WorkersFailureRate`, relay/failurestreak.py `WorkersFailureStreak`),
from results that arrive worker by worker, one worker far ahead of another or behind it."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from bulkrelay.job.config import FailureRateHalt
from bulkrelay.relay.failurerate import WorkersFailureRate
from bulkrelay.relay.failurestreak import WorkersFailureStreak
from bulkrelay.relay.stopping import StopControl, StopReason
from bulkrelay.store.journal import JournalEntry

WORKERS = 2


def _entry(row: int, classification: str) -> JournalEntry:
    return JournalEntry(
        row_number=row,
        success=classification == "success",
        classification=classification,
        status_code={"success": 200, "http_client_error": 422, "http_server_error": 503}[classification],
        attempts=1,
        retryable=False,
        error=None if classification == "success" else "HTTP error",
        duration_ms=1.0,
    )


def _arrivals(outcomes: dict[int, str], rng: random.Random) -> Iterator[tuple[int, JournalEntry, float]]:
    """(worker, result, the worker's settled mark after it: its lowest row without a result) as the
    run's process hears them: worker `w` has the rows `(row - 1) % WORKERS == w` and ends them with up
    to 8 in flight, and the workers' streams interleave at random, one of them often far ahead."""
    streams = []
    for worker in range(WORKERS):
        rows = [row for row in sorted(outcomes) if (row - 1) % WORKERS == worker]
        completion = sorted(rows, key=lambda row: row + rng.uniform(0, 8 * WORKERS))
        streams.append((worker, rows, iter(completion)))
    lead = rng.random()  # how much more often worker 0 is heard than worker 1
    live = list(streams)
    while live:
        worker, rows, order = live[0] if len(live) == 1 or rng.random() < lead else live[1]
        ended = next(order, None)
        if ended is None:
            live = [stream for stream in live if stream[0] != worker]
            yield worker, _entry(0, "success"), math.inf  # its stream ended
            continue
        rows.remove(ended)
        yield worker, _entry(ended, outcomes[ended]), rows[0] if rows else math.inf


def _judged(
    outcomes: dict[int, str], seed: int, rate_rule: FailureRateHalt | None, limit: int
) -> StopControl:
    """The run's process's judgement of one interleaving, as ops/workers.py `_RunHalts` makes it."""
    stop = StopControl()
    streak = WorkersFailureStreak(limit, stop)
    rate = None if rate_rule is None else WorkersFailureRate(rate_rule, stop)
    marks: list[float] = [0] * WORKERS
    for worker, entry, below in _arrivals(outcomes, random.Random(seed)):
        if entry.row_number:
            for admitted in streak.admit(entry):
                if rate is not None:
                    rate.ended(admitted)
        marks[worker] = below
        for released in streak.settled_below(min(marks)):
            if rate is not None:
                rate.ended(released)
        if rate is not None:
            rate.count_below(min(*marks, streak.held_from))
    return stop


def test_the_failure_rate_halts_at_one_row_whatever_the_workers_pace() -> None:
    # Rows 1-30 succeed, then every row fails: row 41 is the first where more than 25% failed.
    outcomes = {row: "success" if row <= 30 else "http_client_error" for row in range(1, 81)}
    halts = set()
    for seed in range(200):
        stop = _judged(outcomes, seed, FailureRateHalt(above=0.25, after_rows=20), limit=0)
        assert stop.reason is StopReason.HALT_FAILURE_RATE, seed
        halts.add((stop.detail["row"], stop.detail["rows"], stop.detail["failed"]))
    assert halts == {(41, 41, 11)}


def test_failures_on_one_workers_rows_alone_do_not_make_a_rate() -> None:
    # Every tenth row fails (10%), all of them worker 1's (20% of its rows): not above 15%.
    outcomes = {row: "http_client_error" if row % 10 == 0 else "success" for row in range(1, 401)}
    for seed in range(100):
        assert _judged(outcomes, seed, FailureRateHalt(above=0.15, after_rows=50), limit=0).reason is None


def test_a_streak_of_one_workers_rows_is_broken_by_the_others() -> None:
    # Every odd row (worker 0's) answers 503: however far ahead worker 0 runs, each even row breaks it.
    outcomes = {row: "http_server_error" if row % 2 else "success" for row in range(1, 201)}
    for seed in range(100):
        assert _judged(outcomes, seed, None, limit=5).reason is None, seed


def test_a_target_down_halts_at_the_limit_in_row_order() -> None:
    outcomes = {row: "success" if row <= 10 else "http_server_error" for row in range(1, 61)}
    for seed in range(100):
        stop = _judged(outcomes, seed, None, limit=5)
        assert stop.reason is StopReason.HALT_UNAVAILABLE, seed
        assert stop.detail["consecutive_failures"] == 5


def test_a_success_far_ahead_does_not_break_a_streak_below_the_turn() -> None:
    # Rows 21-60 answer 503 and every other row succeeds: 40 failures in a row, in row order, however
    # early a worker that runs ahead sends the successes of rows 61 and on.
    outcomes = {row: "http_server_error" if 21 <= row <= 60 else "success" for row in range(1, 301)}
    for seed in range(100):
        stop = _judged(outcomes, seed, None, limit=30)
        assert stop.reason is StopReason.HALT_UNAVAILABLE, seed
        assert stop.detail["consecutive_failures"] == 30
