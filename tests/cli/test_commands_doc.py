"""docs/commands.md and every command's `--help` name the same flags: a flag the page omits is a flag
nobody finds, and a flag the page names but the parser lacks is a usage error waiting for a reader."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulkrelay.cli.parser import build_parser

COMMANDS_MD = Path(__file__).resolve().parents[2] / "docs" / "commands.md"
# Flags every command takes, and the global and operational ones the page's opening paragraphs
# describe once for the commands that take them.
_DESCRIBED_ONCE = {
    "--help", "--json", "--human", "--quiet", "--version",
    "--budget", "--timeout", "--runs-dir", "--metrics-file", "--log-file", "--metrics-push", "--workers",
}  # fmt: skip
# Flags of other tools the page explains (`render --curl` writes curl's).
_OTHER_TOOLS = {"--globoff", "--data-binary", "--data-raw"}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(command path, its --help text) for every visible command and sub-action."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if name.startswith("_"):
                    continue
                yield f"{prefix}{name}", child.format_help()
                yield from _commands(child, f"{prefix}{name} ")


def _sections() -> list[tuple[set[str], str]]:
    """Each "## `bulkrelay ...`" section of the page with the commands its heading names
    (`job wait|status|cancel` names `job` and its three actions)."""
    text = COMMANDS_MD.read_text()
    sections: list[tuple[set[str], str]] = []
    for heading, body in re.findall(r"^## `bulkrelay ([^`]*)`[^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        words = heading.split()
        names = {words[0]}
        if len(words) > 1 and "|" in words[1]:
            names |= {f"{words[0]} {action}" for action in words[1].split("|")}
        sections.append((names, heading + "\n" + body))
    return sections


def _flags(text: str) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # an example's own tools (curl) have flags
    return set(_FLAG.findall(prose)) - _DESCRIBED_ONCE - _OTHER_TOOLS


CASES = list(_commands(build_parser()))


@pytest.mark.parametrize(("command", "help_text"), CASES, ids=[name for name, _ in CASES])
def test_the_page_and_help_name_the_same_flags(command: str, help_text: str) -> None:
    section = next((text for names, text in _sections() if command in names), None)
    assert section is not None, f"docs/commands.md has no section for `bulkrelay {command}`"
    in_help = _flags(help_text)
    in_page = _flags(section)
    assert in_help - in_page == set(), f"`{command} --help` names flags docs/commands.md does not"
    assert in_page - in_help == set(), f"docs/commands.md names flags `{command} --help` lacks"
