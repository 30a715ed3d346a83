"""`StopReason`: the values written to run.json, the run log and envelopes, and what each one means."""

from __future__ import annotations

import os
import signal
import time
from functools import partial

import anyio
import orjson
import pytest

from bulkrelay.relay.ratelimit import RateLimiter
from bulkrelay.relay.stopping import StopControl, StopReason, watch_signals
from tests.waiting import until

# On disk and on the wire: a renamed member must never change one of these.
VALUES = {
    StopReason.INTERRUPTED: "interrupted",
    StopReason.TERMINATED: "terminated",
    StopReason.TIMEOUT: "timeout",
    StopReason.HALT_AUTH: "halt_auth",
    StopReason.HALT_UNAVAILABLE: "halt_unavailable",
    StopReason.HALT_LIMIT_UNAVAILABLE: "halt_limit_unavailable",
    StopReason.TOKEN_REFUSED: "token_refused",
    StopReason.TOKEN_UNAVAILABLE: "token_unavailable",
    StopReason.AUTH_UNUSABLE: "auth_unusable",
    StopReason.SIGNATURE_REFUSED: "signature_refused",
    StopReason.HALT_FAILURE_RATE: "halt_failure_rate",
    StopReason.CANCELLED: "cancelled",
    StopReason.STALLED: "stalled",
    StopReason.INPUT_CHANGED: "input_changed",
    StopReason.INCOMPLETE: "incomplete",
    StopReason.LIMIT: "limit",
    StopReason.WORKER_LOST: "worker_lost",
}


def test_every_stop_reason_keeps_its_string_value() -> None:
    assert {reason: reason.value for reason in StopReason} == VALUES
    assert [str(reason) for reason in StopReason] == list(VALUES.values())


def test_a_stop_reason_is_written_as_its_bare_string() -> None:
    assert orjson.dumps({"stop_reason": StopReason.HALT_AUTH}) == b'{"stop_reason":"halt_auth"}'
    assert f"{StopReason.STALLED}" == "stalled"
    assert StopReason("input_changed") is StopReason.INPUT_CHANGED


def test_only_the_halt_rules_halt() -> None:
    halting = {reason for reason in StopReason if reason.halts}
    assert halting == {
        StopReason.HALT_AUTH,
        StopReason.HALT_UNAVAILABLE,
        StopReason.HALT_LIMIT_UNAVAILABLE,
        StopReason.TOKEN_REFUSED,  # the OAuth2 token endpoint: a halt of its own kind
        StopReason.TOKEN_UNAVAILABLE,
        StopReason.AUTH_UNUSABLE,
        StopReason.SIGNATURE_REFUSED,
        StopReason.HALT_FAILURE_RATE,
    }


def test_halts_and_a_changed_input_are_the_outcome_even_when_every_row_ended() -> None:
    # Not the failure rate: a run whose every row has its result is complete (exit 3 either way).
    outcome = {reason for reason in StopReason if reason.outcome_even_when_all_rows_ended}
    assert outcome == {
        StopReason.HALT_AUTH,
        StopReason.HALT_UNAVAILABLE,
        StopReason.HALT_LIMIT_UNAVAILABLE,
        StopReason.TOKEN_REFUSED,
        StopReason.TOKEN_UNAVAILABLE,
        StopReason.AUTH_UNUSABLE,
        StopReason.SIGNATURE_REFUSED,
        StopReason.INPUT_CHANGED,
    }


def test_the_first_stop_reason_wins() -> None:
    stop = StopControl()
    stop.request(StopReason.HALT_AUTH, status_code=401)
    stop.request(StopReason.INTERRUPTED)
    assert stop.reason is StopReason.HALT_AUTH and stop.detail == {"status_code": 401}


@pytest.mark.anyio
async def test_a_stop_request_ends_a_start_held_by_a_pause_and_one_asked_after_it() -> None:
    """A Retry-After pause of an hour must not hold a stopped run (issue 22.11)."""
    stop = StopControl()
    limiter = RateLimiter(10)
    limiter.pause_until(time.monotonic() + 3600)
    outcomes: list[bool] = []

    async def wait_for_a_start() -> None:
        with stop.ends_on_request() as scope:
            await limiter.acquire()
        outcomes.append(scope.cancelled_caught)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait_for_a_start)
        await anyio.wait_all_tasks_blocked()
        stop.request(StopReason.TERMINATED)
    await wait_for_a_start()  # asked after the stop: never waits at all
    assert outcomes == [True, True]


@pytest.mark.anyio
@pytest.mark.parametrize("in_a_worker", [False, True], ids=["the-run", "a-worker"])
async def test_a_sigint_after_a_stop_forces_it_but_a_workers_first_own_sigint_does_not(
    in_a_worker: bool,
) -> None:
    """A terminal's Ctrl+C reaches the run's parent and each worker once: the parent's word of it may
    reach a worker before its own SIGINT does, which is the same Ctrl+C, not a second one."""
    stop = StopControl()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(partial(watch_signals, stop, sigint_forces_any_stop=not in_a_worker))
        await anyio.wait_all_tasks_blocked()
        stop.request(StopReason.INTERRUPTED, by="parent")
        os.kill(os.getpid(), signal.SIGINT)
        await anyio.sleep(0.2)  # the signal heard (a slow machine makes this test pass, never fail)
        assert stop.forced is not in_a_worker
        os.kill(os.getpid(), signal.SIGINT)  # a second one forces the stop, in a worker too
        await until(lambda: stop.forced, "the forced stop")
        tasks.cancel_scope.cancel()
