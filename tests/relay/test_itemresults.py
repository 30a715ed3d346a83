"""Reading each row's outcome from a batch's answer (relay/itemresults.py), mode by mode."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from bulkrelay.job.config import HaltConfig, ItemsConfig, ResponseConfig, RetryConfig
from bulkrelay.job.redact import Redactor
from bulkrelay.relay.itemresults import AnswerInvalid, ItemReader
from bulkrelay.relay.retry import RetryPolicy

IDS = ["a1", "b2", "c3"]
POSITIONAL = {"mode": "positional", "results": "/items"}
BY_INDEX = {"mode": "by_index", "errors": "/errors", "index": "/i"}


def _reader(**items: Any) -> ItemReader:
    policy = RetryPolicy.from_config(RetryConfig(), ResponseConfig(), HaltConfig())
    return ItemReader(ItemsConfig.model_validate(items), policy, Redactor(["hunter2-secret"]))


def _read(reader: ItemReader, answer: Any) -> list[tuple[str, bool, int | None, str | None]]:
    outcomes = reader.outcomes(orjson.dumps(answer), IDS)
    return [(o.classification, o.retryable, o.status, o.message) for o in outcomes]


def test_by_id_an_error_naming_several_ids_fails_each_and_unlisted_decides_the_rest() -> None:
    reader = _reader(mode="by_id", results="/results", errors="/errors", id="/trace",
                     error_id="/context/ids", message="/message", unlisted="failure")  # fmt: skip
    answer = {"results": [{"trace": "a1"}], "errors": [{"message": "no", "context": {"ids": ["b2"]}}]}
    assert [o[0] for o in _read(reader, answer)] == ["success", "item_rejected", "item_rejected"]
    both = {"errors": [{"message": "dup", "context": {"ids": ["a1", "c3"]}}], "results": []}
    assert [o[0] for o in _read(reader, both)] == ["item_rejected", "item_rejected", "item_rejected"]
    assert _read(reader, both)[0][3] == "dup"
    assert "named nowhere" in (_read(reader, both)[1][3] or "")


def test_a_per_item_status_is_classified_like_a_responses() -> None:
    reader = _reader(mode="positional", results="/items", status="/s", message="/e")
    answer = {"items": [{"s": 201}, {"s": 429, "e": "busy"}, {"s": 400, "e": {"type": "bad hunter2-secret"}}]}
    assert _read(reader, answer) == [
        ("success", False, 201, None),
        ("http_rate_limited", True, 429, "busy"),
        ("http_client_error", False, 400, '{"type":"bad ***"}'),
    ]


def test_an_item_5xx_is_retryable_and_a_non_retry_status_is_final() -> None:
    reader = _reader(mode="positional", results="/items", status="/s", message="/e")
    answer = {"items": [{"s": 503, "e": "shard down"}, {"s": 500}, {"s": 501, "e": "nope"}]}
    assert _read(reader, answer) == [
        ("http_server_error", True, 503, "shard down"),  # retry.statuses holds 500, 502, 503, 504
        ("http_server_error", True, 500, None),
        ("http_server_error", False, 501, "nope"),  # a 5xx outside retry.statuses is final
    ]


@pytest.mark.parametrize(
    ("items", "answer", "reason"),
    [
        ({"mode": "positional", "results": "/items"}, {"items": [{}, {}]}, "has 2 entries for 3 items"),
        ({"mode": "positional", "results": "/items"}, {"items": {"0": {}}}, "holds dict, not a list"),
        ({**POSITIONAL, "status": "/s"}, {"items": [{"s": "201"}] * 3}, "not a status"),
        (BY_INDEX, {"errors": [{"i": 3}]}, "names position 3"),
        (BY_INDEX, {"errors": [{"i": True}]}, "names position True"),
        (BY_INDEX, {}, "no list at /errors"),
        ({"mode": "by_id", "results": "/r", "id": "/id"}, {"r": [{"id": "zz"}]}, "'zz' (at /id), never sent"),
        ({"mode": "by_id", "results": "/r", "id": "/id"}, {"r": [{"id": 1}]}, "never sent"),
    ],
)  # fmt: skip
def test_an_answer_that_does_not_fit_the_mode_is_refused(
    items: dict[str, Any], answer: Any, reason: str
) -> None:
    with pytest.raises(AnswerInvalid) as refused:
        _read(_reader(**items), answer)
    assert reason in str(refused.value)


def test_whole_mode_reads_nothing_and_a_cut_answer_is_refused_elsewhere() -> None:
    assert [o.success for o in _reader(mode="whole").outcomes(b"not json at all", IDS)] == [True] * 3
    with pytest.raises(AnswerInvalid, match="cut short"):
        _reader(mode="by_index", errors="/e", index="/i").outcomes(b'{"e": []}', IDS, truncated=True)
