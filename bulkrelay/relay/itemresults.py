"""Each row's outcome, read from a batch's answer (`response.items`, docs/batching.md).

    whole        the request's status is every item's
    positional   `results` holds one entry per item, in request order
    by_index     `errors` lists the failures, each naming its item's position (`index`, from 0)
    by_id        `results` and `errors` name their items by the ids sent (`id`, `error_id`; an error
                 naming a list of ids fails each of them)

An entry's `status`, when configured, is classified like a response's (an item 429 or 5xx retryable,
another 4xx final); an item named as failed without one is `item_rejected`, final. `unlisted` decides
an item named nowhere. An answer that does not fit (not JSON, a list missing or of the wrong length, a
position or id never sent, a status that is not one) raises `AnswerInvalid`: no row's success is ever
guessed from it.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from bulkrelay.job.config import ItemsConfig
from bulkrelay.job.redact import Redactor
from bulkrelay.relay.response import resolve_pointer
from bulkrelay.relay.retry import ITEM_REJECTED, SUCCESS, RetryPolicy, counts_as_success

MESSAGE_CHARS = 500  # of an item's message, kept in its row's error
_WHOLE = ItemsConfig(mode="whole")


class AnswerInvalid(Exception):
    """The batch's answer does not match `response.items`; the message says how."""


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    classification: str
    retryable: bool
    status: int | None = None  # the item's own status, when the answer gives one
    message: str | None = None  # redacted, cut to MESSAGE_CHARS
    entry: Any = None  # the answer's entry for the item (a result), for `response.capture`

    @property
    def success(self) -> bool:
        return counts_as_success(self.classification)


# A success with nothing more to say (every item of a `whole` answer's success, an item left unlisted
# as a success): one object, which the batch sender recognises by identity.
PLAIN_SUCCESS = ItemOutcome(SUCCESS, False)


class ItemReader:
    """Reads the outcomes of one job's batches."""

    def __init__(self, config: ItemsConfig | None, policy: RetryPolicy, redactor: Redactor) -> None:
        self.config = config or _WHOLE
        # Items are judged by their own success list (default any 2xx), never the answer's (issue 38):
        # Elasticsearch answers 200 and creates items with 201.
        self._policy = replace(policy, success_statuses=self.config.success_statuses)
        self._redactor = redactor

    def hiding(self, values: Collection[str]) -> ItemReader:
        """A reader of the answer to one attempt that carried `values` (its signatures), hiding them too."""
        reader = copy.copy(self)
        reader._redactor = self._redactor.hiding(values)
        return reader

    @property
    def whole(self) -> bool:
        return self.config.mode == "whole"

    def outcomes(self, body: bytes, item_ids: Sequence[str], *, truncated: bool = False) -> list[ItemOutcome]:
        """One outcome per item, in request order, from a success answer's body."""
        mode = self.config.mode
        if mode == "whole":
            return [PLAIN_SUCCESS] * len(item_ids)
        if truncated:
            raise AnswerInvalid(
                "the answer is longer than the transport reads for this batch (cut short): not read, and "
                "no refusal of its items, which the target may have applied"
            )
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise AnswerInvalid(f"the answer is not JSON ({exc})") from None
        if mode == "positional":
            return self._positional(document, len(item_ids))
        if mode == "by_index":
            return self._by_index(document, len(item_ids))
        return self._by_id(document, item_ids)

    def _positional(self, document: Any, count: int) -> list[ItemOutcome]:
        results = self._list(document, self.config.results)
        if len(results) != count:
            raise AnswerInvalid(f"{self.config.results} has {len(results)} entries for {count} items")
        return [self._judged(entry, named_failure=False) for entry in results]

    def _by_index(self, document: Any, count: int) -> list[ItemOutcome]:
        errors = self._list(document, self.config.errors)
        outcomes: list[ItemOutcome | None] = [None] * count
        pointer = self.config.index or ""
        for entry in errors:
            index = resolve_pointer(entry, pointer)
            if type(index) is not int or not 0 <= index < count:
                raise AnswerInvalid(
                    f"an entry of {self.config.errors} names position {_shown(index)} "
                    f"(at {pointer}) of a batch of {count} items"
                )
            outcomes[index] = self._judged(entry, named_failure=True)
        return [self._unlisted() if outcome is None else outcome for outcome in outcomes]

    def _by_id(self, document: Any, item_ids: Sequence[str]) -> list[ItemOutcome]:
        config = self.config
        positions = {item_id: n for n, item_id in enumerate(item_ids)}
        results = self._optional_list(document, config.results)
        errors = self._optional_list(document, config.errors)
        if results is None and errors is None:
            named = " nor ".join(p for p in (config.results, config.errors) if p is not None)
            raise AnswerInvalid(f"the answer has neither {named}")
        outcomes: list[ItemOutcome | None] = [None] * len(item_ids)
        id_pointer = config.id or ""
        for entry in results or ():
            for n in self._named(entry, id_pointer, positions, config.results):
                outcomes[n] = self._judged(entry, named_failure=False)
        error_pointer = config.error_id or id_pointer
        for entry in errors or ():
            failed = self._judged(entry, named_failure=True)
            for n in self._named(entry, error_pointer, positions, config.errors):
                outcomes[n] = failed  # an error wins over a result naming the same item
        return [self._unlisted() if outcome is None else outcome for outcome in outcomes]

    def _named(self, entry: Any, pointer: str, positions: dict[str, int], where: str | None) -> list[int]:
        value = resolve_pointer(entry, pointer)
        ids = value if isinstance(value, list) else [value]
        found = []
        for item_id in ids:
            if type(item_id) is not str or item_id not in positions:
                raise AnswerInvalid(f"an entry of {where} names {_shown(item_id)} (at {pointer}), never sent")
            found.append(positions[item_id])
        return found

    def _judged(self, entry: Any, *, named_failure: bool) -> ItemOutcome:
        message = self._message(entry)
        if self.config.status is None:
            if named_failure:
                return ItemOutcome(ITEM_REJECTED, False, None, message)
            return ItemOutcome(SUCCESS, False, None, None, entry)
        status = resolve_pointer(entry, self.config.status)
        if type(status) is not int or not 100 <= status <= 599:
            raise AnswerInvalid(f"an item's status at {self.config.status} is {_shown(status)}, not a status")
        classification = self._policy.classify_status(status)
        if classification == SUCCESS and not named_failure:
            return ItemOutcome(SUCCESS, False, status, None, entry)
        if classification == SUCCESS:
            classification = ITEM_REJECTED
        retryable = status in self._policy.statuses and status not in self._policy.halt_statuses
        return ItemOutcome(classification, retryable, status, message)

    def _unlisted(self) -> ItemOutcome:
        if self.config.unlisted != "failure":
            return PLAIN_SUCCESS
        return ItemOutcome(ITEM_REJECTED, False, None, "named nowhere in the answer (unlisted: failure)")

    def _message(self, entry: Any) -> str | None:
        if self.config.message is None:
            return None
        value = resolve_pointer(entry, self.config.message)
        if value is None or _absent(value) or value in ("", [], {}):
            return None
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        return self._redactor.redact(text)[:MESSAGE_CHARS]

    def _list(self, document: Any, pointer: str | None) -> list[Any]:
        found = self._optional_list(document, pointer)
        if found is None:
            raise AnswerInvalid(f"the answer has no list at {pointer}")
        return found

    @staticmethod
    def _optional_list(document: Any, pointer: str | None) -> list[Any] | None:
        if pointer is None:
            return None
        value = resolve_pointer(document, pointer)
        if isinstance(value, list):
            return value
        if value is None or _absent(value):
            return None
        raise AnswerInvalid(f"{pointer} holds {type(value).__name__}, not a list")


def _absent(value: Any) -> bool:
    """`resolve_pointer` found nothing there (its marker is a bare object)."""
    return type(value) is object


def _shown(value: Any) -> str:
    """A value the answer gave, for a message: short (the row's error is redacted as a whole)."""
    return "nothing" if _absent(value) else repr(value)[:60]
