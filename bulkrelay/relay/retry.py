"""Classification of an attempt's outcome, and the retry policy that decides what happens next.

Classifications (the `classification` of a journal line):

    success               a success status (the job's `success_statuses`, else any 2xx)
    http_client_error     4xx other than 429
    http_rate_limited     429
    http_server_error     5xx
    http_redirect         3xx (redirects are never followed)
    http_unexpected       anything else: 1xx, or a 2xx the job does not count as success
    connect_error         no connection could be made
    timeout_error         a timeout phase expired (connect, write, read, pool)
    protocol_error        reset, disconnect, malformed response
    item_rejected         batch mode: the answer named the row's item as failed, without a status
    batch_answer_invalid  batch mode: the answer did not fit response.items (docs/batching.md)
    lookup_miss           not sent: a lookup with `on_miss: skip` lacked the row's key (docs/chains.md)

A status outcome is retryable when its status is in `retry.statuses` and not a halt status; transport
errors are always retryable (delivery is at-least-once: a timed-out request may have been applied,
which idempotency keys make harmless). Attempt n (from 1) failing retryably is retried while
n < max_attempts, after `min(max_backoff, initial * 2**(n-1))`, then scaled by a uniform jitter in
[1 - jitter_ratio, 1 + jitter_ratio] (so a jittered delay may exceed max_backoff by that ratio), and never
shorter than the response's Retry-After when `respect_retry_after` is on (that, at most
`max_retry_after_seconds`: for rows, batches and the OAuth2 token endpoint alike).
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from bulkrelay.job.config import (
    DEFAULT_HALT_STATUSES,
    DEFAULT_INITIAL_BACKOFF_SECONDS,
    DEFAULT_JITTER_RATIO,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BACKOFF_SECONDS,
    DEFAULT_MAX_RETRY_AFTER_SECONDS,
    DEFAULT_RESPECT_RETRY_AFTER,
    DEFAULT_RETRY_STATUSES,
)
from bulkrelay.relay.transport.base import TransportError

if TYPE_CHECKING:
    from bulkrelay.job.config import HaltConfig, ResponseConfig, RetryConfig

# The classification of a row that succeeded: given by `RetryPolicy.is_success`, read by `counts_as_success`.
SUCCESS = "success"
# Batch mode's own (docs/batching.md): read from the answer by relay/itemresults.py, relay/batchsender.py.
ITEM_REJECTED = "item_rejected"
BATCH_ANSWER_INVALID = "batch_answer_invalid"
LOOKUP_MISS = "lookup_miss"  # not sent: a lookup with `on_miss: skip` lacked its key (job/inputs/lookups.py)
# Every classification a journal line can carry, in the order of the docstring above.
CLASSIFICATIONS = (
    SUCCESS,
    "http_client_error",
    "http_rate_limited",
    "http_server_error",
    "http_redirect",
    "http_unexpected",
    "connect_error",
    "timeout_error",
    "protocol_error",
    ITEM_REJECTED,
    BATCH_ANSWER_INVALID,
    LOOKUP_MISS,
)

# A 409 to an idempotency key this process sent before means "still being processed" (the IETF
# Idempotency-Key draft, Stripe): waited out under the same key this many times at most, apart from
# retry.max_attempts, with the retry backoff (docs/batching.md, docs/configuration.md `retry`).
IN_PROGRESS_STATUS = 409
IN_PROGRESS_WAITS = 8

_DELTA_SECONDS = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?")


@dataclass(frozen=True, slots=True)
class Decision:
    retry: bool  # send the request again after delay_seconds
    delay_seconds: float  # 0 when not retrying
    classification: str
    retryable: bool  # this kind of outcome is retryable, even when no attempts are left
    halt: bool = False  # a halt status: stop the run (resumable), never retried


def counts_as_success(classification: str) -> bool:
    """Whether an outcome so classified is a success: the one reading of `RetryPolicy.is_success`."""
    return classification == SUCCESS


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # defaults: the job file's (bulkrelay.job.config)
    statuses: Collection[int] = DEFAULT_RETRY_STATUSES
    initial_backoff_seconds: float = DEFAULT_INITIAL_BACKOFF_SECONDS
    max_backoff_seconds: float = DEFAULT_MAX_BACKOFF_SECONDS
    jitter_ratio: float = DEFAULT_JITTER_RATIO
    respect_retry_after: bool = DEFAULT_RESPECT_RETRY_AFTER
    max_retry_after_seconds: float = DEFAULT_MAX_RETRY_AFTER_SECONDS  # caps what a Retry-After may ask
    success_statuses: Collection[int] | None = None  # None: any 2xx
    halt_statuses: Collection[int] = DEFAULT_HALT_STATUSES
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)
    # The final decision of each status seen that is never retried: made once, not per response.
    _finals: dict[int, Decision] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0 <= self.jitter_ratio <= 1:
            raise ValueError("jitter_ratio must be between 0 and 1")
        # frozensets make the per-response membership tests cheap whatever collection was given
        object.__setattr__(self, "statuses", frozenset(self.statuses))
        object.__setattr__(self, "halt_statuses", frozenset(self.halt_statuses))
        if self.success_statuses is not None:
            object.__setattr__(self, "success_statuses", frozenset(self.success_statuses))

    @classmethod
    def from_config(
        cls, retry: RetryConfig, response: ResponseConfig, halt: HaltConfig, rng: random.Random | None = None
    ) -> RetryPolicy:
        """The policy of a job file's `retry`, `response.success_statuses` and `halt.on_statuses`."""
        return cls(
            max_attempts=retry.max_attempts,
            statuses=retry.statuses,
            initial_backoff_seconds=retry.initial_backoff_seconds,
            max_backoff_seconds=retry.max_backoff_seconds,
            jitter_ratio=retry.jitter_ratio,
            respect_retry_after=retry.respect_retry_after,
            max_retry_after_seconds=retry.max_retry_after_seconds,
            success_statuses=response.success_statuses,
            halt_statuses=halt.on_statuses,
            rng=rng if rng is not None else random.Random(),
        )

    def is_success(self, status: int) -> bool:
        """The success rule: the job's `response.success_statuses`, else any 2xx."""
        if self.success_statuses is None:
            return 200 <= status < 300
        return status in self.success_statuses

    def classify_status(self, status: int) -> str:
        if self.is_success(status):
            return SUCCESS
        if status == 429:
            return "http_rate_limited"
        if 400 <= status < 500:
            return "http_client_error"
        if 500 <= status < 600:
            return "http_server_error"
        if 300 <= status < 400:
            return "http_redirect"
        return "http_unexpected"

    @staticmethod
    def classify_error(error: TransportError) -> str:
        return classify_error(error)

    def final(self, status: int | None) -> Decision | None:
        """The decision `decide` gives every attempt that ends with `status`, once one was seen: a
        success, or a failure never retried. None: not known yet, or it depends on the attempt."""
        return None if status is None else self._finals.get(status)

    def decide(
        self,
        attempt: int,
        status: int | None,
        error: TransportError | None,
        retry_after: float | None = None,
    ) -> Decision:
        """What to do after attempt number `attempt` (from 1) ended with `status` or `error`."""
        if (status is None) == (error is None):
            raise ValueError("decide() needs exactly one of status and error")
        final = self._finals.get(status) if status is not None else None
        if final is not None:  # the common case: a success (or a failure never retried) seen before
            return final
        halt = False
        if error is not None:
            classification, retryable = error.classification, True
        else:
            assert status is not None
            classification = self.classify_status(status)
            succeeded = self.is_success(status)
            halt = status in self.halt_statuses and not succeeded
            retryable = not succeeded and not halt and status in self.statuses
        if not retryable or attempt >= self.max_attempts:
            decision = Decision(False, 0.0, classification, retryable, halt)
            if status is not None and not retryable:  # the same whatever the attempt
                self._finals[status] = decision
            return decision
        return Decision(True, self.delay(attempt, retry_after), classification, True)

    def in_progress(self, waits: int, retry_after: float | None = None) -> Decision:
        """A 409 to a key sent before, after `waits` earlier such waits: send it again under the same key
        after the backoff, at most IN_PROGRESS_WAITS times; then the 409 is final, and retryable (the
        request may have been applied: `retry-failed` decides)."""
        if waits >= IN_PROGRESS_WAITS:
            return Decision(False, 0.0, "http_client_error", True)
        return Decision(True, self.delay(waits + 1, retry_after), "http_client_error", True)

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before the attempt after `attempt`."""
        base = min(self.max_backoff_seconds, self.initial_backoff_seconds * 2.0 ** (attempt - 1))
        jitter = self.rng.uniform(-self.jitter_ratio, self.jitter_ratio) if self.jitter_ratio else 0.0
        seconds = max(0.0, base * (1.0 + jitter))
        if self.respect_retry_after and retry_after is not None:
            seconds = max(seconds, min(retry_after, self.max_retry_after_seconds))
        return seconds


def classify_error(error: TransportError) -> str:
    """connect_error, timeout_error or protocol_error."""
    return error.classification


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """The Retry-After of a response's headers in seconds; None when there is none or it says nothing
    readable. pyreqwest raises ValueError for a value beyond visible ASCII (which HTTP allows): such a
    value reads as absent, as a Retry-After that is not a number or a date does."""
    try:
        value = headers.get("Retry-After")  # the transports' headers are case-insensitive
    except ValueError:
        return None
    return parse_retry_after(value) if value else None


def parse_retry_after(value: str, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or HTTP-date); None if it is neither."""
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):  # the RFC says digits; fractions and a sign are tolerated
        return max(0.0, float(text))
    return _seconds_until_http_date(text, now)


def _seconds_until_http_date(text: str, now: datetime | None) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):  # an offset past a C int: OverflowError
        return None
    if when.tzinfo is None:  # "-0000" dates parse naive; HTTP dates are GMT
        when = when.replace(tzinfo=UTC)
    reference = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - reference).total_seconds())


_QUOTA_PARAM = re.compile(r"\b(remaining|reset|r|t)\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)
_EPOCH_SECONDS = 1_000_000_000  # a reset this large is a Unix time (GitHub style), not a delay


def quota_exhausted_for(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds until the target's quota resets when its rate-limit headers say nothing remains.

    Reads the IETF httpapi draft's `RateLimit-Remaining` / `RateLimit-Reset` (delay seconds), its
    later combined `RateLimit: limit=10, remaining=0, reset=3` (`r=`/`t=` too), and the common
    `X-RateLimit-Remaining` / `X-RateLimit-Reset` (delay seconds, or a Unix time). None: quota left,
    or no such headers.
    """
    get = headers.get  # nearly every response has none of these: three lookups, no further call
    try:
        if (
            get("RateLimit-Remaining") is None
            and get("X-RateLimit-Remaining") is None
            and get("RateLimit") is None
        ):
            return None
        remaining, reset = _quota(headers)
    except ValueError:  # a value pyreqwest cannot give as text (beyond ASCII): no number to read
        return None
    if remaining is None or remaining > 0 or reset is None:
        return None
    if reset >= _EPOCH_SECONDS:
        reset -= now if now is not None else datetime.now(UTC).timestamp()
    return max(0.0, reset)


# Checked in this order; the first whose Remaining header holds a number wins.
_SEPARATE_QUOTAS = (
    ("RateLimit-Remaining", "RateLimit-Reset"),
    ("X-RateLimit-Remaining", "X-RateLimit-Reset"),
)


def _quota(headers: Mapping[str, str]) -> tuple[float | None, float | None]:
    """(remaining, reset) from the first quota headers present; three lookups when there are none,
    as for nearly every response (it runs once per response)."""
    for remaining_name, reset_name in _SEPARATE_QUOTAS:
        text = headers.get(remaining_name)
        remaining = None if text is None else _number(text)
        if remaining is not None:
            return remaining, _number(headers.get(reset_name))
    combined = headers.get("RateLimit")
    return (None, None) if combined is None else _combined_quota(combined)


def _combined_quota(value: str) -> tuple[float | None, float | None]:
    params = {name.lower(): float(number) for name, number in _QUOTA_PARAM.findall(value)}
    remaining = params.get("remaining", params.get("r"))
    return remaining, params.get("reset", params.get("t"))


def _number(value: str | None) -> float | None:
    if value is None or not _DELTA_SECONDS.fullmatch(value.strip()):
        return None
    return float(value.strip())
