"""The relay's collector settings (relay/heap.py): raised while relaying, restored afterwards."""

from __future__ import annotations

import gc
import weakref

import pytest

from bulkrelay.relay.heap import RELAY_YOUNG_THRESHOLD, relay_collections


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_young_collections_are_rarer_and_the_heap_frozen_while_relaying() -> None:
    before = gc.get_threshold()
    with relay_collections():
        assert gc.get_threshold() == (RELAY_YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_settings_come_back_when_the_relay_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), relay_collections():
        raise RuntimeError("the relay failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cycles_made_while_relaying_are_still_collected() -> None:
    with relay_collections():
        first, second = _Node(), _Node()
        first.other, second.other = second, first
        gone = weakref.ref(first)
        del first, second
        gc.collect()
        assert gone() is None


def test_garbage_made_before_the_relay_is_collected_not_frozen() -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    with relay_collections():
        assert gone() is None
