"""Issue 43's morning, as an operator has it: three real nights of one job (one clean, one with 14
failures, one halted by a 401), their reports and the job's history page, opened in headless Chromium.
The headline states each night's result, the history marks the bad nights, no page shows a raw repr
or a microsecond time, and every command a page gives works from another directory."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.chromium import dump_dom
from tests.clirun import run_cli
from tests.taggedjobs import run_job, write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real runs, a target process and Chromium

ROWS = 60
FAILING = 14
PLAN = {
    "rules": [
        {"match": {"body_field": "tag", "equals": "bad"}, "status": 422},
        {"match": {"body_field": "tag", "equals": "refused"}, "status": 401},
    ]
}
# What a page must never show: a Python repr or a time to the microsecond.
FAILED_TAGS = dict.fromkeys(range(3, 3 + FAILING), "bad")
RAW = re.compile(r"\b(True|False|None)\b|\{'|\d{2}:\d{2}:\d{2}\.\d+|_seconds\b|\bdatetime\(")


@dataclass(frozen=True)
class Morning:
    nights: dict[str, Path]  # clean, failed, halted: each night's run directory
    history: Path
    seen: dict[str, str]  # each page's text as Chromium shows it: clean, failed, halted, history

    def pages(self) -> dict[str, Path]:
        return {**{name: run / "report.html" for name, run in self.nights.items()}, "history": self.history}


def _night(tmp: Path, target: TargetProcess, tags: dict[int, str], expected: ExitCode) -> Path:
    """One night: the job, on that night's own input file (as a nightly export names its file)."""
    job = write_job(tmp, target.url, rows=ROWS, tags=tags)
    night = tmp / f"records-{len(list(tmp.glob('records-*')))}.csv"
    (tmp / "records.csv").rename(night)
    result = run_job(job, "--input", night, "--report")
    assert result.exit_code == expected, result.envelope
    return Path(result.data["run_dir"])


@pytest.fixture(scope="module")
def morning(tmp_path_factory: pytest.TempPathFactory) -> Morning:
    tmp = tmp_path_factory.mktemp("morning")
    with TargetProcess(PLAN) as target:
        nights = {
            "clean": _night(tmp, target, {}, ExitCode.SUCCESS),
            "failed": _night(tmp, target, FAILED_TAGS, ExitCode.PARTIAL_FAILURE),
            "halted": _night(tmp, target, {45: "refused"}, ExitCode.AUTH_REQUIRED),
        }
    written = run_cli("report", "--history", "test-job", "--runs-dir", tmp / "runs", cwd=tmp)
    assert written.exit_code == ExitCode.SUCCESS, written.envelope
    morning = Morning(nights, Path(written.data["output"]), {})
    for name, page in morning.pages().items():  # each page opened once, in Chromium
        morning.seen[name] = _seen(page, tmp / f"profile-{name}")
    return morning


def _seen(page: Path, profile: Path) -> str:
    """The page's text as Chromium parsed it: tags, style and charts off, entities read."""
    dom = dump_dom(page, profile)
    dom = re.sub(r"<style>.*?</style>|<svg.*?</svg>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", dom)))


def test_each_report_leads_with_its_night_s_result(morning: Morning) -> None:
    clean, failed, halted = (morning.seen[name] for name in ("clean", "failed", "halted"))
    assert "Completed: every row succeeded" in clean
    assert f"{ROWS} rows sent, 0 failed" in clean
    assert f"Completed with failures: {FAILING} rows failed" in failed
    assert f"{ROWS} rows sent, {FAILING} failed (23%)" in failed
    assert "Halted: the target answered a status in halt.on_statuses" in halted
    assert f"continue it: bulkrelay resume {morning.nights['halted']}" in halted
    assert "continue it" not in clean + failed
    assert f"requests {ROWS} sent: {ROWS - FAILING} HTTP 200, {FAILING} HTTP 422" in failed


def test_the_history_marks_the_bad_nights(morning: Morning) -> None:
    shown = morning.seen["history"]
    assert "2 of the last 3 nights need a look" in shown, shown
    html = morning.history.read_text()
    marks = dict((run, mark) for mark, run in re.findall(r'<tr class="(good|bad)" data-run="([^"]+)"', html))
    assert marks == {
        morning.nights["clean"].name: "good",
        morning.nights["failed"].name: "bad",
        morning.nights["halted"].name: "bad",
    }


def test_no_page_shows_a_raw_repr_or_a_microsecond_time(morning: Morning) -> None:
    for name, shown in morning.seen.items():
        assert not RAW.findall(shown), (name, RAW.findall(shown))


def test_every_command_on_a_page_works_from_another_directory(morning: Morning, tmp_path: Path) -> None:
    """Run last (it continues the nights): each command finds its run from a directory that is not the
    job's. The target is gone by now, so a relay ends as the target's absence says, never "not found"."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    given = re.compile(r"<code[^>]*>(bulkrelay [^<]+)</code>")
    commands = {unescape(c) for page in morning.pages().values() for c in given.findall(page.read_text())}
    assert {shlex.split(c)[1] for c in commands} == {"retry-failed", "resume"}, commands
    for command in sorted(commands):
        words = shlex.split(command)
        assert all(Path(word).is_absolute() for word in words[2:] if "/" in word), command
        done = run_cli(*words[1:], "--budget", "0", cwd=elsewhere)
        assert done.exit_code not in (ExitCode.ARG_ERROR, ExitCode.NOT_FOUND), (command, done.envelope)
        assert morning.nights["failed" if "retry" in command else "halted"].name in str(done.data), command
