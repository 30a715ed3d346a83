"""A field the input lacks gets the column the user most likely meant ("did you mean"), as the public
alpha's users were promised (docs/migrating.md): near spellings, case, and a name's words."""

from __future__ import annotations

import pytest

from bulkrelay.job.preflight import _closest


@pytest.mark.parametrize(
    ("wanted", "columns", "meant"),
    [
        ("e_mail", ["id", "email", "age"], "email"),  # a near spelling
        ("Email", ["id", "email"], "email"),  # case
        ("customer_email", ["customer_id", "email", "name"], "email"),  # an export's longer name
        ("email", ["id", "customer_email", "name"], "customer_email"),  # and the other way round
        ("first_name", ["email", "name", "first_name_raw"], "first_name_raw"),
    ],
)
def test_the_column_meant_is_suggested(wanted: str, columns: list[str], meant: str) -> None:
    assert _closest(wanted, columns) == meant


def test_no_suggestion_when_nothing_is_close() -> None:
    assert _closest("zip", ["id", "email", "name"]) is None
