"""What docs/transport.md and docs/running.md say about pauses, proxies and 429s is what the code does
(issue 22.15: they said a Retry-After had no upper bound, that no proxy was ever used, and that a 429
lowered every limit, a shared one too)."""

from __future__ import annotations

import re
from pathlib import Path

from bulkrelay.job.config import DEFAULT_PROXY, RetryConfig
from bulkrelay.relay.ratelimit_redis import SharedRateLimiter

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _flat(name: str) -> str:
    return re.sub(r"\s+", " ", (DOCS / name).read_text())


def test_transport_md_states_the_retry_after_cap_the_config_applies() -> None:
    text = _flat("transport.md")
    cap = RetryConfig().max_retry_after_seconds
    assert "no upper bound" not in text
    assert f"capped at `retry.max_retry_after_seconds` (default {cap:g})" in text


def test_transport_md_says_proxies_follow_execution_proxy() -> None:
    text = _flat("transport.md")
    assert "No cookies, no proxy" not in text
    assert f"by default (`{DEFAULT_PROXY}`)" in text and "`execution.proxy`" in text


def test_running_md_says_a_shared_limit_keeps_its_rate_on_429_as_it_does() -> None:
    limiter = SharedRateLimiter("redis://127.0.0.1:1/0", "k", 80)  # never asked: no connection is made
    limiter.rate_limited()
    limiter.rate_limited()
    assert limiter.state().current_rps == 80
    running, scale_out = _flat("running.md"), _flat("scale-out.md")
    assert "a limit shared by shards in Redis keeps its configured rate" in running
    assert "A 429 does not lower the shared rate." in scale_out
