"""Shell completion scripts (bash, zsh, fish), made by shtab from the CLI's own parser: file names where
an argument is a file, directories where it is a directory, run ids and `latest` where it is a RUN.

What an argument completes to follows from its metavar, which the parser already gives every argument
(`JOB`, `FILE`, `PATH`, `DIR`, `RUN`), so the parser needs no completion code and stays fast to import:
shtab is loaded only here, for the `completion` command.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import shtab

from bulkrelay.cli.parser import build_parser

# A RUN is a run id in the runs directory, or `latest`. `sh` lists them whatever the user's shell, so one
# command serves bash, zsh and fish alike. (A run directory given as a path is typed out in full.)
_LIST_RUNS = "sh -c 'ls -1 ${BULKRELAY_RUNS_DIR:-.bulkrelay/runs} 2>/dev/null; echo latest'"


def _by_metavar() -> dict[str, Any]:
    return {
        "JOB": shtab.FILE,
        "FILE": shtab.FILE,
        "PATH": shtab.FILE,
        "DIR": shtab.DIRECTORY,
        "RUN": shtab.cmd(_LIST_RUNS),
    }


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _actions(child)


def completion_script(shell: str) -> str:
    """The completion script for `shell`, as `source <(bulkrelay completion bash)` reads it."""
    parser = build_parser()
    completes = _by_metavar()
    for action in _actions(parser):
        kind = completes.get(action.metavar) if isinstance(action.metavar, str) else None
        if kind is not None:
            action.complete = kind  # type: ignore[attr-defined]  # shtab reads this attribute
    return str(shtab.complete(parser, shell=shell))
