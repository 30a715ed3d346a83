"""A finished run's journal damaged as a bad disk or a hand edit would, and the refusal a reader of its
results owes: JOURNAL_CORRUPT (exit 4) naming the run, the file, the line and its byte offset.

    journal, offset = damage_second_line(parent.data["run_dir"])
    assert_refused_as_corrupt(run_job(tmp_path, child), parent.data["run_dir"], journal, offset)
"""

from __future__ import annotations

from pathlib import Path

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult


def damage_second_line(run_dir: str) -> tuple[Path, int]:
    """`"success":true` made unreadable on the journal's line 2 (as a bad disk or a hand edit would);
    the file and the line's byte offset."""
    journal = Path(run_dir) / "results.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    assert b'"success":true' in lines[1]
    lines[1] = lines[1].replace(b'"success":true', b'"success":fals')
    journal.write_bytes(b"".join(lines))
    return journal, len(lines[0])


def assert_refused_as_corrupt(refused: CliResult, parent_run: str, journal: Path, offset: int) -> None:
    """A child refused before any request with the parent journal's damage named: run, file, line, offset."""
    assert refused.exit_code == ExitCode.PRECONDITION, refused.envelope
    error = refused.envelope["error"]
    assert error["code"] == "JOURNAL_CORRUPT"
    assert error["context"]["file"] == str(journal)
    assert (error["context"]["line"], error["context"]["offset"]) == (2, offset)
    assert error["context"]["run_dir"] == parent_run
    assert Path(parent_run).name in error["message"] and "line 2" in error["message"]
