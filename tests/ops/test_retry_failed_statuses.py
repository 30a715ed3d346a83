"""`--status`: the HTTP statuses retry-failed selects its rows by."""

from __future__ import annotations

import pytest

from bulkrelay.errors import UsageError
from bulkrelay.ops.retry_failed import parse_statuses


def test_statuses_are_parsed() -> None:
    assert parse_statuses(None) is None
    assert parse_statuses("503, 504") == frozenset({503, 504})


@pytest.mark.parametrize(
    "text", ["\u00b2", "503,\u00b2", "5" * 5000], ids=["superscript", "among-others", "5000-digits"]
)
def test_retry_failed_statuses_that_int_refuses_are_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="expected HTTP status codes"):
        parse_statuses(text)
