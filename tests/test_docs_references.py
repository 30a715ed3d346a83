"""Docs that cannot drift: every file path and `bulkrelay` command named in the docs, the README and the
code's docstrings and comments exists. A moved module or a renamed command then fails here, not in a
reader's hands."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from bulkrelay.cli.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent
# A path in backticks: a name with a known suffix, or with a slash, e.g. `relay/transport/base.py`.
_PATH = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|yaml|yml|toml|csv|jsonl|service|timer|sh))`")
# A command as typed: in backticks or at the start of a line of a shell example.
_COMMAND = re.compile(
    r"(?:`|^[ \t]*(?:\$ )?)(?:uv run )?bulkrelay "
    r"((?:[a-z_][a-z-]*)(?: (?:wait|status|cancel|rebuild|verify))?)\b",
    re.MULTILINE,
)
# A page or a module named in prose, e.g. "DESIGN.md section 5", "tests/test_transport.py".
_PAGE = re.compile(r"(?<![\w/.`-])([A-Z][A-Z_]+\.md|(?:[\w-]+/)+[\w-]+\.py)\b")
# The product contract lives outside the repository: the code and docs point at docs/ instead.
_OUTSIDE = re.compile(r"\bDESIGN\b")
# Names of files BulkRelay writes or users keep, not files of this repository.
_NOT_REPO_FILES = {
    "results.jsonl", "run.json", "checkpoint.json", "summary.json", "input.jsonl", "report.html",
    "batch-retries.jsonl",
    "failed.csv", "export.csv", "job.yaml", "customers.csv", "customers.jsonl", "orders.jsonl",
    "customers.parquet", "x.parquet", "old.csv", "new.csv", "stdin.jsonl", "rows.csv", "big.csv",
    "alerts.yaml", "config.yaml",
}  # fmt: skip
_WHERE_NAMES_POINT = ("", "bulkrelay", "docs", "examples", "benchmarks", "tests")


def _texts() -> Iterator[tuple[Path, str]]:
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        yield path, path.read_text()
    for room in ("bulkrelay", "benchmarks", "examples"):
        for path in sorted((ROOT / room).rglob("*")):
            if path.suffix in {".py", ".md", ".yaml"} and "__pycache__" not in path.parts:
                yield path, path.read_text()


def _exists(name: str, seen_in: Path, files: set[str]) -> bool:
    if name.startswith((".bulkrelay/", "~/", "/")) or Path(name).name in _NOT_REPO_FILES:
        return True
    bases = [seen_in.parent.relative_to(ROOT).as_posix(), *_WHERE_NAMES_POINT]
    candidates = {str(Path(base) / name) for base in bases}
    if "/" not in name:  # a bare file name: anywhere in the repository
        return any(file.rsplit("/", 1)[-1] == name for file in files)
    return bool(candidates & files) or any(file.endswith("/" + name) for file in files)


def _repo_files() -> set[str]:
    skip = {".git", ".venv", "__pycache__", ".bulkrelay", ".mypy_cache", ".ruff_cache"}
    return {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if path.is_file() and not skip & set(path.relative_to(ROOT).parts)
    }


def _commands() -> set[str]:
    names: set[str] = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    names.add(f"{prefix}{name}")
                    walk(child, f"{prefix}{name} ")

    walk(build_parser(), "")
    return names


def test_every_path_named_in_the_docs_and_the_code_exists() -> None:
    files = _repo_files()
    missing = [
        f"{path.relative_to(ROOT)}: `{name}`"
        for path, text in _texts()
        for name in _PATH.findall(text) + _PAGE.findall(text)
        if not _exists(name, path, files)
    ]
    assert not missing, "named but absent:\n" + "\n".join(missing)


def test_nothing_points_at_the_contract_outside_the_repository() -> None:
    found = [str(path.relative_to(ROOT)) for path, text in _texts() if _OUTSIDE.search(text)]
    found += [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name != "test_docs_references.py" and _OUTSIDE.search(path.read_text())
    ]
    assert not found, "name DESIGN, which is not in the repository (point at docs/):\n" + "\n".join(found)


def test_every_command_named_in_the_docs_exists() -> None:
    commands = _commands()
    missing = [
        f"{path.relative_to(ROOT)}: bulkrelay {name}"
        for path, text in _texts()
        for name in _COMMAND.findall(text)
        if name not in commands and name.split(" ")[0] not in commands
    ]
    assert not missing, "commands named but absent:\n" + "\n".join(missing)
