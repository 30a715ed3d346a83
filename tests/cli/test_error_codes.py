"""Every error class exits with the code docs/exit-codes.md gives its `error.code`: a class that lost
its `exit_code` (a merge, a copy) would fall back to exit 1 and break every script that reads it."""

from __future__ import annotations

import re
from pathlib import Path

from bulkrelay import errors

EXIT_CODES_MD = Path(__file__).resolve().parents[2] / "docs" / "exit-codes.md"


def _documented() -> dict[str, set[int]]:
    """Each error code named in the table's third column, with the exit codes of the rows naming it."""
    found: dict[str, set[int]] = {}
    for number, codes in re.findall(r"^\| (\d+) \| [A-Z_]+ \| ([^|]*) \|", EXIT_CODES_MD.read_text(), re.M):
        for code in re.findall(r"`([A-Z_]+)`", codes):
            found.setdefault(code, set()).add(int(number))
    return found


def _classes() -> list[type[errors.BulkRelayError]]:
    return [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, errors.BulkRelayError) and "code" in vars(value)
    ]  # a base that names no code of its own (PreconditionFailed) is no answer anyone gets


def test_each_error_exits_with_its_documented_code() -> None:
    documented = _documented()
    wrong = [
        f"{cls.__name__} ({cls.code}): exit {int(cls.exit_code)}, documented {sorted(documented[cls.code])}"
        for cls in _classes()
        if cls.code in documented and int(cls.exit_code) not in documented[cls.code]
    ]
    assert wrong == []


def test_the_oauth2_token_endpoint_down_is_unavailable_and_retryable() -> None:
    assert errors.TargetUnavailable("down").exit_code == errors.ExitCode.UNAVAILABLE
    assert errors.TargetUnavailable("down").retryable is True
