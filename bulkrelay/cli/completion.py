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

# A RUN is a run id in the runs directory, `latest`, or a run directory's path. `sh` lists the ids
# whatever the user's shell, so one command serves bash, zsh and fish alike; each shell adds directories.
_LIST_RUNS = "sh -c 'ls -1 ${BULKRELAY_RUNS_DIR:-.bulkrelay/runs} 2>/dev/null; echo latest'"
# bash: shtab's script shows a function's words as file names (a slash after a directory) when its name
# has `_dir` in it.
_BASH_RUNS = f"""
_bulkrelay_compgen_runs_and_dirs() {{
  compgen -W "$({_LIST_RUNS})" -- "$1"
  compgen -d -- "$1"
}}"""
_ZSH_RUNS = f"""
_bulkrelay_runs() {{
  local -a ids
  ids=(${{(f)"$({_LIST_RUNS})"}})
  _alternative "runs:run id:(${{ids}})" 'dirs:run directory:_files -/'
}}"""


def _runs_and_directories() -> dict[str, Any]:
    """RUN: a run id or `latest` (tcsh and PowerShell: only those), or a run directory's path."""
    ids = shtab.cmd(_LIST_RUNS)
    preamble = {**ids["preamble"], "bash": _BASH_RUNS, "zsh": _ZSH_RUNS}  # type: ignore[dict-item]
    return {
        **ids,
        "bash": "_bulkrelay_compgen_runs_and_dirs",
        "zsh": "_bulkrelay_runs",
        "fish": f"({_LIST_RUNS}; __fish_complete_directories (commandline -ct))",
        "preamble": preamble,
    }


def _by_metavar() -> dict[str, Any]:
    return {
        "JOB": shtab.FILE,
        "FILE": shtab.FILE,
        "PATH": shtab.FILE,
        "DIR": shtab.DIRECTORY,
        "RUN": _runs_and_directories(),
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
