"""Human output shows a row's text as text: control characters (an OSC 52 clipboard write, NUL) and
bidi overrides escaped, square brackets kept (rich would read `[email]` as markup and drop it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.background.reach import BackgroundJobEnded, BackgroundJobGoesOn
from bulkrelay.background.state import BackgroundJobState
from bulkrelay.cli.human import print_human
from bulkrelay.envelope import EnvelopeWarning, ErrorInfo, Result, to_envelope
from bulkrelay.errors import ExitCode
from tests.clirun import run_cli_raw
from tests.jobfiles import write_job

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"


@pytest.mark.slow
def test_render_human_shows_a_row_s_control_characters_escaped(tmp_path: Path) -> None:
    rows = [{"id": "1", "email": f"a{OSC52}@example.com", "name": "\u202egpj.exe [email] nul\x01"}]
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=rows)
    proc = run_cli_raw("render", job, "--rows", "1", "--human", cwd=tmp_path)
    shown = proc.stdout.decode()
    assert proc.returncode == 0, proc.stderr
    for raw in ("\x1b", "\x07", "\x01", "\u202e"):
        assert raw not in shown, repr(raw)
    assert "\\u001b]52;c;" in shown and "\\u202egpj.exe" in shown  # the JSON body's escapes, and ours
    assert "[email]" in shown


@pytest.mark.slow
def test_square_brackets_in_a_message_never_vanish(tmp_path: Path) -> None:
    job = write_job(
        tmp_path, "http://127.0.0.1:9", rows=1, request={"url": "http://127.0.0.1:9/{user[email]}"}
    )
    proc = run_cli_raw("validate", job, "--human", cwd=tmp_path)
    assert "user[email]" in proc.stderr.decode() + proc.stdout.decode(), proc.stderr


def test_brackets_in_an_error_a_hint_and_a_warning_are_printed_as_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = ErrorInfo(
        "INPUT_UNAVAILABLE",
        "a PostgreSQL input needs psycopg, which the extra bulkrelay[postgres] installs",
        retryable=False,
        suggestion="pip install 'bulkrelay[postgres]'",
    )
    warned = EnvelopeWarning("LOOKUP_MISSES_SKIPPED", "the key user[email] is [bold]missing[/]", {})
    result = Result(exit_code=ExitCode.ARG_ERROR, error=error, warnings=[warned])
    print_human(result, to_envelope(result, duration_ms=1))
    shown = capsys.readouterr().err
    assert "extra bulkrelay[postgres] installs" in shown
    assert "hint: pip install 'bulkrelay[postgres]'" in shown
    assert "the key user[email] is [bold]missing[/]" in shown


def test_a_background_job_is_shown_as_lines_with_the_commands_that_reach_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`job status` and a handed-off call at a terminal: where the job is and the commands that reach it,
    not the envelope's data as JSON; a run directory with brackets in its name printed as it is."""
    going = BackgroundJobGoesOn(
        state=BackgroundJobState.RUNNING,
        stage="relay",
        job_id="run-0123456789",
        progress={"done": 1234, "total": None, "unit": "rows"},
        run_dir="/runs/[nightly]/20261207T000000Z-0a1b2c3d",
        continue_command="bulkrelay job wait run-0123456789",
        cancel_command="bulkrelay job cancel run-0123456789",
    )
    ended = BackgroundJobEnded("run-0123456789", BackgroundJobState.CANCELLED, None, "cancelled", 143)
    for data in (going, ended):
        result = Result(data=data)
        print_human(result, to_envelope(result, duration_ms=1))
    shown = capsys.readouterr().out
    assert "job run-0123456789: running (relay), 1,234 of ? rows done" in shown
    assert "run dir: /runs/[nightly]/20261207T000000Z-0a1b2c3d" in shown
    assert "wait with:   bulkrelay job wait run-0123456789" in shown
    assert "cancel with: bulkrelay job cancel run-0123456789" in shown
    assert "job run-0123456789: cancelled, its run cancelled (exit 143)" in shown
    assert "{" not in shown
