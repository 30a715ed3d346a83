"""Usage errors name what a user can type: never a hidden subcommand."""

from __future__ import annotations

import pytest

from bulkrelay.cli.parser import parse_command_line
from bulkrelay.errors import UsageError


def test_an_unknown_command_lists_the_commands_but_not_the_hidden_worker() -> None:
    with pytest.raises(UsageError) as caught:
        parse_command_line(["nosuch"])
    message = str(caught.value)
    assert "'validate'" in message and "'demo'" in message
    assert "_job-worker" not in message


def test_an_argument_that_is_not_utf8_is_a_usage_error_naming_it() -> None:
    # A file name in Latin-1 (`café.csv` as the byte E9) reaches Python as a lone surrogate, which no
    # JSON file BulkRelay writes (envelope, run.json, run.log) can hold: refused at once, named readably.
    with pytest.raises(UsageError) as caught:
        parse_command_line(["validate", "job.yaml", "--input", "caf\udce9.csv"])
    assert "caf\\xe9.csv" in str(caught.value)
    assert caught.value.context == {"argument": "caf\\xe9.csv"}
    assert "\udce9" not in str(caught.value)


@pytest.mark.parametrize(
    ("argv", "given", "meant"),
    [
        (["rnu", "job.yaml"], "rnu", "run"),
        (["retry-faild", "RUN"], "retry-faild", "retry-failed"),
        (["job", "stauts", "j-1"], "stauts", "status"),
        (["export", "RUN", "--format", "jsnol"], "jsnol", "jsonl"),
    ],
)
def test_a_mistyped_command_or_choice_gets_did_you_mean(argv: list[str], given: str, meant: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_command_line(argv)
    assert caught.value.suggestion is not None
    assert caught.value.suggestion.startswith(f"did you mean `{meant}`?")
    assert caught.value.context == {"given": given, "did_you_mean": meant}
    assert "invalid choice" in str(caught.value) and "_job-worker" not in str(caught.value)


def test_nothing_near_is_suggested_for_a_word_like_no_command() -> None:
    with pytest.raises(UsageError) as caught:
        parse_command_line(["zzzzzz"])
    assert caught.value.suggestion == "see `bulkrelay --help`"


def test_a_hidden_command_is_never_suggested() -> None:
    with pytest.raises(UsageError) as caught:
        parse_command_line(["_job-workr"])
    assert "_job-worker" not in (caught.value.suggestion or "")
