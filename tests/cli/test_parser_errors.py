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
