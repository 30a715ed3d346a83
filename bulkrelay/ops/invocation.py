"""The identity of an invocation, so that running the same command again continues its run.

Two invocations are identical when they have the same command, normalized arguments, working
directory, tool version, stdin digest and `--idempotency-key`. How long the caller is willing
to wait (`--budget`, `--timeout`) is not part of what the command does, so it is left out.

The key is recorded in the run's manifest and in a small index (`<runs-dir>/.invocations/<key>`
holding the newest run id), so finding the run is one file read, not a scan of every run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from bulkrelay._version import __version__
from bulkrelay.envelope import printable
from bulkrelay.errors import UsageError
from bulkrelay.job.fingerprint import canonical_sha256
from bulkrelay.private import make_private_dir
from bulkrelay.store.atomic import write_atomic
from bulkrelay.store.runs import runs_dir_unreadable

INDEX_DIR = ".invocations"


def invocation_key(
    command: str,
    arguments: Mapping[str, str | None],
    *,
    stdin_sha256: str | None,
    idempotency_key: str | None,
) -> str:
    """A stable hash of everything that makes two invocations the same."""
    return canonical_sha256(
        {
            "command": command,
            "arguments": dict(arguments),
            "cwd": os.getcwd(),
            "tool_version": __version__,
            "stdin_sha256": stdin_sha256,
            "idempotency_key": idempotency_key,
        }
    )[:32]


def refuse_unrecordable(paths: Iterable[tuple[str, Path | None]]) -> None:
    """Refuse a call that would record a path that is not UTF-8, before it writes or sends anything.

    `paths`: what the call records besides the working directory (which every run's manifest and
    every background job's spec hold), each named by what it is (`job file`, `runs directory`).
    Python keeps a name's undecodable bytes (Latin-1 `caf\\xe9`) as lone surrogates, which no JSON file
    can hold, and writing them otherwise (`\\xe9`) would name another file when a resume reads it back."""
    for what, path in (*paths, ("working directory", Path(os.getcwd()))):
        if path is None:
            continue
        recorded = str(path.resolve())
        shown = printable(recorded)
        if shown != recorded:
            raise UsageError(
                f"the {what} {shown} is not valid UTF-8: BulkRelay records it in the JSON files of its "
                "runs (run.json, run.log, a background job's state) and reads it back to resume",
                context={"path": shown, "what": what},
                suggestion=_utf8_suggestion(what),
            )


def _utf8_suggestion(what: str) -> str:
    if what == "working directory":
        return "rename the directory to a UTF-8 name, or run from a directory whose path is UTF-8 (cd /)"
    return (
        f"rename the directory to a UTF-8 name, or point at a {what} whose path is UTF-8 "
        "(a run follows links, so a link with a UTF-8 name to it does not help)"
    )


def normalized_path(path: Path | None) -> str | None:
    return None if path is None else str(path.resolve())


def remember(runs_dir: Path, key: str, run_id: str) -> None:
    index = runs_dir / INDEX_DIR
    make_private_dir(index)
    write_atomic(index / key, run_id.encode())


def last_run_id(runs_dir: Path, key: str) -> str | None:
    """The run the identical invocation made last; a record this user cannot read is refused: guessing
    there is none would start a second run beside it."""
    try:
        return (runs_dir / INDEX_DIR / key).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):  # no runs dir (yet): creating a run says why
        return None
    except PermissionError as exc:
        raise runs_dir_unreadable(runs_dir / INDEX_DIR, exc) from None
