"""Outcome classification, retry decisions and Retry-After parsing."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import bulkrelay
from bulkrelay.job.config import HaltConfig, ResponseConfig, RetryConfig
from bulkrelay.relay.retry import Decision, RetryPolicy, classify_error, counts_as_success, parse_retry_after
from bulkrelay.relay.transport.base import ConnectFailed, ProtocolFailed, RequestTimeout, TransportError


def _policy(**overrides: object) -> RetryPolicy:
    values: dict[str, object] = {
        "max_attempts": 5,
        "initial_backoff_seconds": 1.0,
        "max_backoff_seconds": 30.0,
        "jitter_ratio": 0.0,
        "rng": random.Random(1),
    }
    values.update(overrides)
    return RetryPolicy(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "classification"),
    [
        (200, "success"),
        (204, "success"),
        (299, "success"),
        (400, "http_client_error"),
        (401, "http_client_error"),
        (422, "http_client_error"),
        (429, "http_rate_limited"),
        (500, "http_server_error"),
        (503, "http_server_error"),
        (301, "http_redirect"),
        (304, "http_redirect"),
        (101, "http_unexpected"),
    ],
)
def test_classify_status(status: int, classification: str) -> None:
    assert _policy().classify_status(status) == classification


def test_success_statuses_narrow_success() -> None:
    policy = _policy(success_statuses=[201])
    assert policy.classify_status(201) == "success"
    assert policy.classify_status(200) == "http_unexpected"
    assert policy.decide(1, 200, None).retry is False


@pytest.mark.parametrize(
    ("error", "classification"),
    [
        (ConnectFailed("refused"), "connect_error"),
        (RequestTimeout("slow", phase="read"), "timeout_error"),
        (ProtocolFailed("reset"), "protocol_error"),
    ],
)
def test_transport_errors_are_classified_and_retryable(error: TransportError, classification: str) -> None:
    assert classify_error(error) == classification
    assert RetryPolicy.classify_error(error) == classification
    assert _policy().decide(1, None, error) == Decision(True, 1.0, classification, True)


@pytest.mark.parametrize(
    ("attempt", "status", "expected"),
    [
        (1, 200, Decision(False, 0.0, "success", False)),
        (1, 503, Decision(True, 1.0, "http_server_error", True)),
        (2, 503, Decision(True, 2.0, "http_server_error", True)),
        (3, 429, Decision(True, 4.0, "http_rate_limited", True)),
        (4, 500, Decision(True, 8.0, "http_server_error", True)),
        (5, 503, Decision(False, 0.0, "http_server_error", True)),  # attempts exhausted, still retryable
        (1, 501, Decision(False, 0.0, "http_server_error", False)),  # not in the retry statuses
        (1, 422, Decision(False, 0.0, "http_client_error", False)),
        (1, 401, Decision(False, 0.0, "http_client_error", False, halt=True)),
        (1, 403, Decision(False, 0.0, "http_client_error", False, halt=True)),
    ],
)
def test_decision_table(attempt: int, status: int, expected: Decision) -> None:
    assert _policy().decide(attempt, status, None) == expected


def test_one_policy_gives_the_same_decisions_in_any_order() -> None:
    """decide() remembers the final decisions of statuses never retried; an exhausted retryable status
    must not be remembered, or the next row's first attempt would not be retried."""
    policy = _policy()
    exhausted = policy.decide(5, 503, None)
    assert exhausted == Decision(False, 0.0, "http_server_error", True)
    assert policy.decide(1, 503, None) == Decision(True, 1.0, "http_server_error", True)
    first = policy.decide(1, 200, None)
    assert policy.decide(3, 200, None) is first == Decision(False, 0.0, "success", False)
    assert policy.decide(2, 401, None) == Decision(False, 0.0, "http_client_error", False, halt=True)
    assert policy.decide(1, 401, None).halt


def test_halt_wins_over_retry_statuses() -> None:
    policy = _policy(halt_statuses=[503])
    assert policy.decide(1, 503, None) == Decision(False, 0.0, "http_server_error", False, halt=True)


def test_backoff_is_capped() -> None:
    policy = _policy(max_attempts=20, initial_backoff_seconds=0.5, max_backoff_seconds=3.0)
    delays = [policy.decide(n, 503, None).delay_seconds for n in range(1, 8)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0]


def test_jitter_stays_within_its_ratio_and_varies() -> None:
    policy = _policy(max_attempts=10, jitter_ratio=0.2, rng=random.Random(42))
    for attempt, base in [(1, 1.0), (3, 4.0), (9, 30.0)]:
        delays = [policy.decide(attempt, 503, None).delay_seconds for _ in range(200)]
        assert all(0.8 * base <= d <= 1.2 * base for d in delays)
        assert max(delays) - min(delays) > 0.2 * base  # it really jitters


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    first = _policy(jitter_ratio=0.5, rng=random.Random(3)).decide(2, 503, None)
    second = _policy(jitter_ratio=0.5, rng=random.Random(3)).decide(2, 503, None)
    assert first == second


def test_retry_after_is_a_minimum() -> None:
    policy = _policy()
    assert policy.decide(1, 429, None, retry_after=7.5).delay_seconds == 7.5
    assert policy.decide(4, 429, None, retry_after=2.0).delay_seconds == 8.0  # backoff already longer
    ignoring = _policy(respect_retry_after=False)
    assert ignoring.decide(1, 429, None, retry_after=7.5).delay_seconds == 1.0


def test_decide_needs_exactly_one_outcome() -> None:
    with pytest.raises(ValueError):
        _policy().decide(1, None, None)
    with pytest.raises(ValueError):
        _policy().decide(1, 500, ProtocolFailed("x"))


@pytest.mark.parametrize(("overrides"), [{"max_attempts": 0}, {"jitter_ratio": 1.5}])
def test_invalid_policy(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _policy(**overrides)


def test_from_config_takes_the_job_sections() -> None:
    retry = RetryConfig(max_attempts=3, statuses=(503,), initial_backoff_seconds=0.5, jitter_ratio=0)
    policy = RetryPolicy.from_config(
        retry, ResponseConfig(success_statuses=(201,)), HaltConfig(on_statuses=(418,))
    )
    assert policy.decide(1, 503, None) == Decision(True, 0.5, "http_server_error", True)
    assert policy.decide(1, 502, None).retry is False
    assert policy.decide(1, 200, None).classification == "http_unexpected"
    assert policy.decide(1, 418, None).halt is True
    assert policy.decide(1, 401, None).halt is False


def test_single_attempt_default_never_retries() -> None:
    policy = RetryPolicy()
    assert policy.decide(1, 503, None) == Decision(False, 0.0, "http_server_error", True)


_NOW = datetime(2026, 10, 2, 19, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5", 5.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("-3", 0.0),
        ("Fri, 02 Oct 2026 19:00:30 GMT", 30.0),
        ("Fri, 02 Oct 2026 18:59:00 GMT", 0.0),  # in the past
        ("Fri, 02 Oct 2026 19:01:00 -0000", 60.0),
        ("garbage", None),
        ("", None),
        ("1e3", None),
        ("nan", None),
        ("10 seconds", None),
        ("Fri, 02 Oct 2026 19:00:30 +99999999999999999999", None),  # an offset past a C int: OverflowError
        ("Fri, 02 Oct 2026 19:00:30 +2400", None),
    ],
)
def test_parse_retry_after(value: str, seconds: float | None) -> None:
    assert parse_retry_after(value, now=_NOW) == seconds


def test_parse_retry_after_date_defaults_to_now() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


# What decides "this response counts as a success" outside the policy: a status range or the
# "success" classification compared by hand. The demo target is the far end, not BulkRelay.
_SUCCESS_RULES = re.compile(r'200 <=|<= 299|< 300|[=!]= "success"')
_PACKAGE = Path(bulkrelay.__file__).parent


def test_the_success_rule_lives_in_the_retry_policy_only() -> None:
    elsewhere = [
        f"{path.relative_to(_PACKAGE)}:{number}: {line.strip()}"
        for path in sorted(_PACKAGE.rglob("*.py"))
        if path.relative_to(_PACKAGE).as_posix() not in ("relay/retry.py", "demo/target.py")
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if _SUCCESS_RULES.search(line)
    ]
    assert elsewhere == []
    assert not hasattr(ResponseConfig, "is_success")  # the job file states the rule; the policy applies it


def test_a_decision_says_whether_the_row_succeeded() -> None:
    policy = RetryPolicy.from_config(RetryConfig(), ResponseConfig(success_statuses=(201,)), HaltConfig())
    assert counts_as_success(policy.decide(1, 201, None).classification) is True
    assert counts_as_success(policy.decide(1, 200, None).classification) is False
    assert counts_as_success(policy.decide(1, None, ConnectFailed("refused")).classification) is False
    assert counts_as_success("success") and not counts_as_success("http_unexpected")
    default = RetryPolicy.from_config(RetryConfig(), ResponseConfig(), HaltConfig())
    assert default.is_success(204) and default.is_success(299) and not default.is_success(301)


def test_a_retry_after_waits_at_most_max_retry_after_seconds() -> None:
    assert _policy(max_retry_after_seconds=5.0).delay(1, retry_after=86400.0) == 5.0
    assert _policy(max_retry_after_seconds=5.0).delay(1, retry_after=float("inf")) == 5.0
    assert _policy(max_retry_after_seconds=5.0).delay(1, retry_after=3.0) == 3.0
    policy = RetryPolicy.from_config(RetryConfig(max_retry_after_seconds=7), ResponseConfig(), HaltConfig())
    assert policy.delay(1, retry_after=86400.0) == 7.0
