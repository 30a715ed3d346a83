"""Which rows a continued call doubts: those an earlier call of the run may have sent unjournaled."""

from __future__ import annotations

from bulkrelay.relay.earliersends import EarlierSends


def test_every_row_up_to_the_journals_highest_is_in_doubt_and_the_window_above_it() -> None:
    earlier = EarlierSends(highest=10, window=3)
    assert [earlier.in_doubt(row) for row in (2, 7, 10)] == [True, True, True]  # the window is untouched
    assert [earlier.in_doubt(row) for row in (11, 12, 15, 16, 17)] == [True, True, True, False, False]


def test_a_request_of_many_rows_takes_as_many_from_the_window() -> None:
    earlier = EarlierSends(highest=0, window=250)
    assert [earlier.in_doubt(first, 100) for first in (1, 101, 201, 301)] == [True, True, True, False]


def test_a_call_after_an_earlier_one_that_journaled_nothing_doubts_its_first_rows() -> None:
    earlier = EarlierSends(highest=0, window=2)
    assert [earlier.in_doubt(row) for row in (1, 2, 3)] == [True, True, False]
