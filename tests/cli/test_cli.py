"""The CLI contract: one envelope on stdout in JSON mode, named exit codes, documented commands."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.cli.parser import build_parser
from bulkrelay.errors import ExitCode, UsageError
from bulkrelay.job.durations import parse_duration_ms
from tests.clirun import run_cli

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_unknown_flag_is_a_usage_error_with_an_envelope() -> None:
    result = run_cli("validate", "job.yaml", "--no-such-flag")
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "USAGE_ERROR"
    assert "--no-such-flag" in result.envelope["error"]["message"]


def test_missing_command_is_a_usage_error() -> None:
    result = run_cli()
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "USAGE_ERROR"


def test_stdout_holds_exactly_one_json_document() -> None:
    result = run_cli("status", "/nonexistent/run")
    assert result.exit_code == ExitCode.NOT_FOUND
    assert result.stdout.count(b"\n") == 1


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return [name for name in sub.choices if not name.startswith("_")]  # type: ignore[union-attr]


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_help_and_docs(command: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bulkrelay", command, "--help"], capture_output=True, check=False
    )
    assert proc.returncode == 0
    assert b"usage:" in proc.stdout
    documented = (DOCS / "commands.md").read_text()
    assert re.search(rf"^## `bulkrelay {re.escape(command)}\b", documented, re.MULTILINE), command


def _parsers(parser: argparse.ArgumentParser, name: str = "bulkrelay") -> Iterator[tuple[str, Any]]:
    """Every parser of the command line with its name, hidden subcommands (`_job-worker`) left out."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                if not sub_name.startswith("_"):
                    yield from _parsers(sub, f"{name} {sub_name}")


def test_every_argument_of_every_command_says_what_it_is() -> None:
    """`--help` must explain positionals too: a bare `JOB` or `JOB_ID` leaves a stranger guessing."""
    unexplained = [
        f"{name}: {action.metavar or action.dest}"
        for name, parser in _parsers(build_parser())
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert unexplained == []


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1500", 1_500_000),
        ("1.5", 1500),
        ("1.5s", 1500),
        ("36500d", 36500 * 86_400_000),
        ("0.0001", 1),  # a budget this short is still a budget: never rounded to 0, which means none
        ("0", 0),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


def test_bad_duration_names_itself() -> None:
    with pytest.raises(UsageError, match="'5 parsecs'"):
        parse_duration_ms("5 parsecs")


def test_a_duration_longer_than_36500_days_is_refused() -> None:
    with pytest.raises(UsageError, match="longer than 36500d"):
        parse_duration_ms("36500.5d")


def test_every_exit_code_is_documented() -> None:
    documented = (DOCS / "exit-codes.md").read_text()
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \| {code.name} \|", documented, re.MULTILINE), code.name


def test_a_word_that_is_not_utf8_is_an_envelope_not_a_traceback() -> None:
    result = run_cli("status", "caf\udce9")  # the byte E9 of a Latin-1 name, as Python reads argv
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.envelope["error"]["context"] == {"argument": "caf\\xe9"}
    assert "Traceback" not in result.stderr


def test_resume_refuses_stdin_and_says_what_each_kind_of_run_takes_instead() -> None:
    # A run that read a file is refused too: the message must not claim that it read stdin.
    result = run_cli("resume", "20261002T190000Z-ab12cd34", "--input", "-", "--budget", "0")
    assert result.exit_code == ExitCode.ARG_ERROR and result.error_code == "USAGE_ERROR"
    message = result.envelope["error"]["message"]
    assert "resume does not read standard input" in message
    assert "--input FILE" in message
