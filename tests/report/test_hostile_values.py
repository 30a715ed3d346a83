"""Hostile values from a run (a key, an error, a target's body, a run-log command) go through the report's
templates as text: markup escaped, control characters shown as escapes, bidi overrides defused."""

from __future__ import annotations

from pathlib import Path

from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.ops.report import facts_of
from bulkrelay.report.reportdata import Call, JournalTally, Timeline
from bulkrelay.report.reportpage import page
from bulkrelay.store.journal import JournalEntry
from bulkrelay.store.rundir import RunDir
from tests.jobfiles import write_job

SCRIPT = "<script>alert(1)</script>"
OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # a terminal's clipboard write
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE, never closed
HOSTILE = f"{SCRIPT} nul\x00 {OSC52} {RLO}gpj.exe"


def _hostile_page(tmp_path: Path) -> str:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=2))
    run = RunDir.create(tmp_path / "runs", plan_for(run_preflight(job, None)))
    tally = JournalTally()
    tally.add(
        JournalEntry(
            row_number=1,
            success=False,
            classification="http_client_error",
            status_code=422,
            attempts=1,
            retryable=False,
            error=f"HTTP 422 {HOSTILE}",
            duration_ms=2.0,
            key=HOSTILE,
            response_body=f'{{"error": "{HOSTILE}"}}',
        )
    )
    timeline = Timeline(present=True, calls=[Call(f"run {HOSTILE}", 1_790_000_000.0)])
    return page(facts_of(run, tally, timeline), tally, timeline)


def test_markup_from_the_run_is_text_never_an_element(tmp_path: Path) -> None:
    html = _hostile_page(tmp_path)
    assert "<script" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3  # key, error, body (and the call)


def test_control_characters_are_shown_escaped_and_no_override_reverses_a_cell(tmp_path: Path) -> None:
    html = _hostile_page(tmp_path)
    for raw in ("\x00", "\x1b", "\x07", RLO):
        assert raw not in html, repr(raw)
    assert "nul\\x00" in html and "\\x1b]52;c;" in html and "\\x07" in html
    assert "\\u202egpj.exe" in html
    assert "<bdi>" in html  # each failure cell is isolated from its neighbours
