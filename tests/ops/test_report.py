"""The run report: a real run (retries, rejects, a 429 pause, a SIGINT stop, a resume) rendered in headless
Chromium, its numbers held against the summary, nothing fetched, no secret; a live run's snapshot; runs of
earlier versions; batches."""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.ops.report import build_report, facts_of, report
from bulkrelay.ops.results import ReportResult
from bulkrelay.ops.status import REPORT
from bulkrelay.report.reportdata import MAX_POINTS, JournalTally, Timeline, read_timeline
from bulkrelay.report.reportpage import CSP, page
from bulkrelay.report.svgchart import BOTTOM, HEIGHT, TOP
from bulkrelay.store.journal import JournalEntry
from bulkrelay.store.manifest import SyncRecord
from bulkrelay.store.rundir import RunDir
from tests.chromium import dump_dom, screenshot
from tests.clirun import CliResult, cli_env, run_cli, run_cli_raw
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S, wait_for

SECRET = "tk-9f3e7c1d5b2a-report"
ROWS = 60
REJECTED = 6  # rows whose email holds "5@": 5, 15, ..., 55
REJECTED_ROWS = frozenset(range(5, ROWS, 10))


def _email(row: int) -> dict[str, Any]:
    return {"body_field": "email", "equals": f"user{row}@example.com"}


_REJECT = {
    "match": {"body_contains": "5@example"},
    "status": 422,
    "echo_header": "Authorization",  # a target that leaks what it was sent: the journal redacts it
    "body": {"error": "invalid email", "saw": "{echo}"},
}
_FIRST_CALL = {
    "rules": [
        {"match": _email(2), "status": 429, "retry_after": "1", "first_attempts": 1},
        {"match": _email(3), "status": 503, "first_attempts": 1},
        _REJECT,
        {"delay_ms": 800},  # slow: uninterrupted, the run would take 24 s; the SIGINT lands mid-run
    ]
}


@dataclass(frozen=True)
class Scenario:
    run_dir: Path
    stopped: CliResult
    resumed: CliResult
    live_page: str
    live_envelope: dict[str, Any]

    @property
    def page(self) -> Path:
        return self.run_dir / REPORT


def _committed(run_dir: list[Path], runs: Path, least: int) -> bool:
    found = list(runs.glob("2*/results.jsonl"))
    data = found[0].read_bytes() if found else b""
    if found and data.count(b"\n") - data.count(b'{"commit":') >= least:  # rows, not commit markers
        run_dir.append(found[0].parent)
        return True
    return False


def _finish(proc: subprocess.Popen[bytes]) -> CliResult:
    stdout, stderr = proc.communicate(timeout=HANG_S)
    envelope = orjson.loads(stdout)
    return CliResult(proc.returncode, envelope, stderr.decode(errors="replace"), stdout)


def _play(tmp: Path) -> Scenario:
    """The real run: a SIGINT mid-run (a live report taken just before it), then resume --report."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = cli_env(API_TOKEN=SECRET)
    with TargetProcess(_FIRST_CALL) as target:
        job = write_job(
            tmp,
            target.url,
            rows=ROWS,
            input={"key": "id"},  # the failure examples show each row's key: its id, the row number
            request={"headers": {"Authorization": "Bearer ${API_TOKEN}"}},
            execution={"concurrency": 2, "rate_limit": {"requests_per_second": 50}},
            retry={"max_attempts": 3, "initial_backoff_seconds": 0.05},
        )
        runs = tmp / "runs"
        command = [
            sys.executable,
            "-m",
            "bulkrelay",
            "run",
            str(job),
            "--budget",
            "0",
            "--runs-dir",
            str(runs),
        ]
        proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        found: list[Path] = []
        wait_for(lambda: _committed(found, runs, 6), "six committed rows", interval=0.02)
        live = run_cli_raw("report", found[0], "-o", "-", cwd=tmp, env=env)  # a snapshot of the live run
        proc.send_signal(signal.SIGINT)
        stopped = _finish(proc)
        target.set_plan({"rules": [_REJECT]})
        resumed = run_cli("resume", found[0], "--budget", "0", "--report", cwd=tmp, env=env)
    return Scenario(found[0], stopped, resumed, live.stdout.decode(), orjson.loads(live.stderr))


def _saved(scenario: Scenario) -> bytes:
    calls = {
        name: [r.exit_code, r.envelope]
        for name, r in (("stopped", scenario.stopped), ("resumed", scenario.resumed))
    }
    return orjson.dumps(
        {
            "run_dir": str(scenario.run_dir),
            **calls,
            "live_page": scenario.live_page,
            "live": scenario.live_envelope,
        }
    )


def _loaded(data: bytes) -> Scenario:
    saved = orjson.loads(data)
    stopped, resumed = (CliResult(saved[name][0], saved[name][1], "", b"") for name in ("stopped", "resumed"))
    return Scenario(Path(saved["run_dir"]), stopped, resumed, saved["live_page"], saved["live"])


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Scenario:
    """Played once per session: under xdist the workers share it through their common temporary
    directory (the first one plays it under a lock, the others read what it saved)."""
    if worker_id == "master":
        return _play(tmp_path_factory.mktemp("report"))
    shared = tmp_path_factory.getbasetemp().parent  # this session's, common to its workers
    with (shared / "report-scenario.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = shared / "report-scenario.json"
        if saved.exists():
            return _loaded(saved.read_bytes())
        played = _play(shared / "report-scenario")
        saved.write_bytes(_saved(played))
        return played


class _Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self._open: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, str] = {}  # id or data-summary -> its text

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        self.tags.append((tag, attributes))
        self._open.append((tag, attributes))

    def handle_endtag(self, tag: str) -> None:
        if self._open:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        for _, attributes in self._open[-1:]:
            for name in ("data-summary", "id"):
                if name in attributes:
                    key = attributes[name]
                    self.text[key] = self.text.get(key, "") + data


class _ExampleRows(HTMLParser):
    """The cells' texts of each row of the failure groups' example tables."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_examples = self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._in_examples = ("class", "examples") in attrs
        elif self._in_examples and tag == "tr":
            self.rows.append([])
        elif self._in_examples and tag == "td":
            self._in_cell = True
            self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in_cell = False
        elif tag == "table":
            self._in_examples = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.rows[-1][-1] += data


def _elements(html: str) -> _Elements:
    parser = _Elements()
    parser.feed(html)
    return parser


def _flat(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


@pytest.mark.slow
def test_the_real_run_stopped_and_resumed_as_the_test_means(scenario: Scenario) -> None:
    assert scenario.stopped.exit_code == ExitCode.SIGINT, scenario.stopped.envelope
    assert scenario.resumed.exit_code == ExitCode.PARTIAL_FAILURE, scenario.resumed.envelope
    assert scenario.resumed.data["report"] == str(scenario.page) and scenario.page.is_file()
    summary = scenario.resumed.data["summary"]
    assert summary["rows_done"] == ROWS and summary["by_outcome"]["failed"] == REJECTED
    assert summary["retries"] >= 2  # row 2 after its 429, row 3 after its 503


@pytest.mark.slow
def test_every_chart_draws_in_headless_chromium_and_the_page_logs_no_error(
    scenario: Scenario, tmp_path: Path
) -> None:
    shot = screenshot(scenario.page, tmp_path / "report.png")
    assert shot.console_errors() == [], shot.log
    from PIL import Image

    with Image.open(shot.png) as image:
        colours = dict((colour, count) for count, colour in image.convert("RGB").getcolors(1 << 24) or [])
    # Each chart's own fill, far more pixels of it than its 12x12 legend swatch: the chart drew.
    for chart, fill in (
        ("throughput (rows ok)", (0x3C, 0x9A, 0x5F)),
        ("outcomes (2xx)", (0x52, 0xB7, 0x88)),
        ("latency", (0x4C, 0x78, 0xA8)),
        ("attempts", (0x7A, 0x5C, 0xC2)),
    ):
        assert colours.get(fill, 0) > 1000, f"the {chart} chart drew {colours.get(fill, 0)} pixels"
    dom = _elements(dump_dom(scenario.page, tmp_path / "dom-profile"))
    charts = [attrs["id"] for tag, attrs in dom.tags if tag == "svg" and "chart" in attrs.get("class", "")]
    assert charts == ["chart-throughput", "chart-outcomes", "chart-latency", "chart-attempts"]
    drawn = [
        a
        for t, a in dom.tags
        if t == "rect" and float(a.get("width", 0)) > 0 and float(a.get("height", 0)) > 0
    ]
    assert len(drawn) > 10


@pytest.mark.slow
def test_the_numbers_in_the_page_are_the_summary_s(scenario: Scenario) -> None:
    html = scenario.page.read_text()
    summary = _flat(orjson.loads((scenario.run_dir / "summary.json").read_bytes()))
    shown = _elements(html).text
    numbers = {key: value for key, value in shown.items() if key in summary}
    assert {"rows_done", "rows_total", "by_outcome.succeeded", "by_outcome.failed", "attempts"} <= set(
        numbers
    )
    assert {"by_status.200", "by_status.422", "latency_ms.p50", "latency_ms.p99"} <= set(numbers)
    for key, text in numbers.items():
        assert float(text) == pytest.approx(summary[key]), key
    assert shown["exit-code"] == str(int(ExitCode.PARTIAL_FAILURE))
    assert shown["state"] == "completed_with_failures"


@pytest.mark.slow
def test_the_page_fetches_nothing_and_holds_no_secret(scenario: Scenario) -> None:
    for html in (scenario.page.read_text(), scenario.live_page):
        tags = _elements(html).tags
        csp = [
            a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"
        ]
        assert csp == [CSP] == ["default-src 'none'; style-src 'unsafe-inline'; img-src data:"]
        linked = [a[name] for _, a in tags for name in ("src", "href", "xlink:href", "action") if name in a]
        assert not [link for link in linked if re.match(r"\s*(https?:)?//", link)], linked
        assert not [t for t, _ in tags if t in ("script", "link", "img", "iframe", "object", "embed")]
        assert "@import" not in html and "url(" not in html
        assert SECRET not in html
    assert "Bearer ***" in scenario.page.read_text()  # the echoed token, as the journal redacted it


@pytest.mark.slow
def test_the_time_axis_marks_the_pause_the_stop_and_the_resume(scenario: Scenario) -> None:
    html = scenario.page.read_text()
    classes = [a.get("class", "") for t, a in _elements(html).tags if t == "line"]
    for mark in ("mark-start", "mark-pause", "mark-stop_requested", "mark-stop", "mark-resume"):
        assert mark in classes, mark
    assert "1 resumes" in _elements(html).text["events"]
    assert "configured" in [a.get("class") for t, a in _elements(html).tags if t == "polyline"]


@pytest.mark.slow
def test_the_failure_examples_show_each_row_s_number_key_error_and_redacted_body(scenario: Scenario) -> None:
    html = scenario.page.read_text()
    examples = [cells for cells in _example_rows(html) if cells]  # the header row has no td
    assert 1 <= len(examples) <= 3  # one group (422), up to three examples
    for row, key, attempts, error, body in examples:
        assert int(row) in REJECTED_ROWS, examples  # which three depends on completion order: any
        assert key == row  # input.key is the id, which write_job makes the row number
        assert (attempts, error) == ("1", "HTTP 422")
        body_sent = orjson.loads(body)
        assert body_sent == {"error": "invalid email", "saw": "Bearer ***"}  # the echoed token, redacted
    run = shlex.quote(str(scenario.run_dir))
    assert f"bulkrelay retry-failed {run} --status 422</code>" in html


def _example_rows(html: str) -> list[list[str]]:
    parser = _ExampleRows()
    parser.feed(html)
    return parser.rows


def _levels(html: str, css: str) -> list[float]:
    """The y (in pixels) of each level of a throughput chart's step line, in time order."""
    chart = html[html.index('id="chart-throughput"') :]
    chart = chart[: chart.index("</svg>")]
    ys = [
        float(point.split(",")[1])
        for points in re.findall(rf'<polyline class="{css}" points="([^"]*)"', chart)
        for point in points.split()
    ]
    return ys[::2]  # each level is drawn from its stretch's start to its end: two points


def test_the_throughput_chart_draws_the_adapted_rate_at_each_interval_s_level(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=2))
    run = RunDir.create(tmp_path / "runs", plan_for(run_preflight(job, None)))
    start = 1_790_000_000.0
    adapted = [50.0, 25.0, 27.5, 30.0, 50.0]  # a 429 halved it, then it climbed back
    lines = [_log_line(start, "start", command="run"), _log_line(start, "preflight_done", limits={"c": 1})]
    for i, rate in enumerate(adapted, start=1):
        fields = {"seconds": 2.0, "committed": 40, "ok": 40, "failed": 0, "responses": {"2xx": 40}}
        lines.append(_log_line(start + 2 * i, "interval", **fields, configured_rps=50.0, current_rps=rate))
    (run.path / "run.log").write_bytes(b"".join(lines))
    html, _ = build_report(run)
    configured, current = _levels(html, "configured"), _levels(html, "current")
    assert len(set(configured)) == 1 and len(current) == len(adapted)
    floor = HEIGHT - BOTTOM
    assert floor - configured[0] <= floor - TOP  # the configured line is inside the plot
    shown = [50.0 * (floor - y) / (floor - configured[0]) for y in current]  # as rates: configured is 50
    assert shown == pytest.approx(adapted, abs=0.05)


@pytest.mark.slow
def test_the_real_run_s_throughput_chart_draws_the_adapted_rate_the_run_log_recorded(
    scenario: Scenario,
) -> None:
    intervals = [
        line
        for line in map(orjson.loads, (scenario.run_dir / "run.log").read_bytes().splitlines())
        if line["event"] == "interval"
    ]
    assert intervals and all(line["configured_rps"] == 50 for line in intervals)
    assert all(0 < line["current_rps"] <= 50 for line in intervals)  # adapted: at most the configured
    html = scenario.page.read_text()
    assert _levels(html, "current") and _levels(html, "configured")


@pytest.mark.slow
def test_run_given_as_a_run_id_or_as_latest_names_the_same_run(scenario: Scenario, tmp_path: Path) -> None:
    runs = scenario.run_dir.parent
    for ref in (scenario.run_dir.name, "latest"):
        out = tmp_path / f"{ref}.html"
        result = run_cli("report", ref, "--runs-dir", runs, "-o", out, cwd=tmp_path)
        assert result.exit_code == ExitCode.SUCCESS, result.envelope
        assert result.data["run_dir"] == str(scenario.run_dir) and result.data["output"] == str(out)
        assert f"<small>{scenario.run_dir.name}</small>" in out.read_text()


@pytest.mark.slow
def test_a_live_run_gets_a_snapshot_of_now_and_the_envelope_goes_to_stderr(scenario: Scenario) -> None:
    envelope = scenario.live_envelope
    assert envelope["ok"] is True and envelope["data"]["output"] == "-"
    assert envelope["data"]["state"] == "running" and 6 <= envelope["data"]["rows_done"] < ROWS
    shown = _elements(scenario.live_page).text
    assert shown["state"] == "running (live)" and shown["exit-code"] == "—"
    assert int(shown["rows_done"]) == envelope["data"]["rows_done"]


@pytest.mark.slow
def test_status_names_the_report_when_there_is_one(scenario: Scenario) -> None:
    status = run_cli("status", scenario.run_dir)
    assert status.data["report"] == str(scenario.page)


@pytest.mark.slow
def test_runs_of_earlier_versions_get_a_report_that_says_what_is_missing(
    scenario: Scenario, tmp_path: Path
) -> None:
    old = tmp_path / scenario.run_dir.name
    shutil.copytree(scenario.run_dir, old)
    (old / REPORT).unlink()
    lines = [orjson.loads(line) for line in (old / "run.log").read_bytes().splitlines()]
    kept = [
        {k: v for k, v in line.items() if k not in ("limits", "transport")}
        for line in lines
        if line["event"] != "interval"
    ]
    (old / "run.log").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in kept))
    result = report(old)
    assert isinstance(result.data, ReportResult) and result.data.output == str(old / REPORT)
    assert any("no interval lines" in text for text in result.data.missing)
    html = (old / REPORT).read_text()
    assert "chart-throughput" not in html and "so there is no time series" in html
    assert "chart-latency" in html  # what the journal gives is all there
    (old / "run.log").unlink()
    assert any("run.log is absent" in text for text in report(old).data.missing)  # type: ignore[union-attr]


def test_a_batched_run_shows_its_batches_and_a_plain_one_says_it_is_not(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=5))
    run = RunDir.create(tmp_path / "runs", plan_for(run_preflight(job, None)))
    plain_html, _ = build_report(run)
    assert "not a batched run" in plain_html and "not a delta run" in plain_html
    tally = JournalTally()
    for row, (seq, index, size, success) in enumerate(
        [
            (1, 0, 3, True),
            (1, 1, 3, True),
            (1, 2, 3, True),
            (2, 0, 2, True),
            (2, 1, 2, False),
            (3, 0, 2, True),
        ],
        start=1,
    ):
        entry = JournalEntry(
            row_number=row,
            success=success,
            classification="success" if success else "http_client_error",
            status_code=200 if success else 422,
            attempts=1,
            retryable=False,
            error=None if success else "HTTP 422",
            duration_ms=2.0,
        )
        vars(entry)["batch"] = {"seq": seq, "index": index, "size": size}  # a batched journal's line
        tally.add(entry)
    batches = tally.batches
    assert (batches.batches, batches.rows, batches.still_open) == (2, 6, 1)
    assert batches.sizes == {3: 1, 2: 1}
    assert batches.outcomes == {"all succeeded": 1, "some failed": 1}
    html = page(facts_of(run, tally, Timeline()), tally, Timeline())
    assert "not a batched run" not in html and 'id="chart-batch-sizes"' in html
    assert _elements(html).text["batches"] == "2"


def test_a_delta_run_shows_its_rows_skipped_as_unchanged(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=5))
    plan = replace(plan_for(run_preflight(job, None)), sync=SyncRecord("delta", False, 2, 3))
    run = RunDir.create(tmp_path / "runs", plan)
    html, (done, total, missing) = build_report(run)
    shown = _elements(html).text
    assert shown["skipped_unchanged"] == "3" and "not a delta run" not in html
    assert (done, total) == (0, 5)
    assert any("run.log is absent" in text for text in missing)
    assert "summary.json is absent" in " ".join(missing)


def _log_line(at: float, event: str, **fields: Any) -> bytes:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{round(at % 1 * 1e6):06d}Z"
    return orjson.dumps({"ts": ts, "event": event, "pid": 7, **fields}) + b"\n"


def test_the_timeline_marks_halts_and_keeps_its_series_bounded_and_whole(tmp_path: Path) -> None:
    start = 1_790_000_000.0
    lines = [
        _log_line(start, "start", command="run"),
        _log_line(start + 0.5, "preflight_done", limits={"c": 1}),
    ]
    for i in range(2000):
        fields = {"seconds": 2.0, "committed": 3, "ok": 2, "failed": 1, "responses": {"2xx": 2, "5xx": 2}}
        lines.append(_log_line(start + 2 * (i + 1), "interval", **fields, current_rps=10.0 - i % 3))
    end = start + 4001
    lines += [_log_line(end, "halt", reason="halt_unavailable", consecutive_failures=100)]
    lines += [b"not json\n", _log_line(end, "stop", state="stopped", stop_reason="halt_unavailable")]
    lines += [_log_line(end + 0.1, "exit", exit_code=12, error_code="TARGET_UNAVAILABLE")]
    (tmp_path / "run.log").write_bytes(b"".join(lines))
    timeline = read_timeline(tmp_path)
    assert len(timeline.intervals) <= 2 * MAX_POINTS
    assert sum(i.committed for i in timeline.intervals) == 6000  # merged, never dropped
    assert sum(i.responses["5xx"] for i in timeline.intervals) == 4000
    assert timeline.relaying_seconds == pytest.approx(4000.0)
    assert [m.kind for m in timeline.marks] == ["start", "halt", "stop"]
    assert timeline.unreadable_lines == 1 and timeline.limits == {"c": 1}
    assert timeline.calls[0].exit_code == 12 and timeline.calls[0].error_code == "TARGET_UNAVAILABLE"


def test_pauses_that_overlap_count_once_in_the_events_line(tmp_path: Path) -> None:
    # Eight rows in flight answered 429 with Retry-After: 2 together: one pause of about 2 s, not
    # "8 429 pauses (16 s in all)"; a later pause that runs past the first adds only what it adds.
    start = 1_790_000_000.0
    lines = [_log_line(start, "start", command="run"), _log_line(start + 0.5, "preflight_done")]
    lines += [_log_line(start + 1 + i / 1000, "pause_429", seconds=2.0) for i in range(8)]
    lines += [_log_line(start + 2.5, "pause_429", seconds=2.0)]  # runs 1.493 s past the first
    lines += [_log_line(start + 10, "pause_429", seconds=1.0)]  # a pause of its own
    (tmp_path / "run.log").write_bytes(b"".join(lines))
    timeline = read_timeline(tmp_path)
    assert timeline.pauses == 2
    assert timeline.pause_seconds == pytest.approx(2.0 + 0.007 + 1.493 + 1.0)
    assert timeline.mark_counts["pause"] == 10  # each is still drawn where it came


@pytest.mark.slow
def test_run_with_report_writes_it_after_the_call_ended(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=3)
        result = run_cli("run", job, "--budget", "0", "--report", cwd=tmp_path)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    written = Path(result.data["report"])
    assert written == Path(result.data["run_dir"]) / REPORT
    shown = _elements(written.read_text()).text
    assert shown["exit-code"] == "0" and shown["state"] == "completed"  # the call's own exit, logged first
    assert shown["rows_done"] == "3" and "no row failed" in written.read_text()


def test_a_report_that_cannot_be_written_is_a_warning_and_the_run_s_result_stands(tmp_path: Path) -> None:
    from bulkrelay.cli.commands import _write_report
    from bulkrelay.envelope import Result
    from bulkrelay.ops.results import RunResult
    from bulkrelay.relay.progress import Snapshot
    from bulkrelay.store.manifest import RunState
    from bulkrelay.store.summary import summarize

    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=2))
    run = RunDir.create(tmp_path / "runs", plan_for(run_preflight(job, None)))
    (run.path / REPORT).mkdir()  # nothing can replace a directory with the page
    progress = Snapshot(total=2, done=0, ok=0, failed=0)
    summary = summarize(run.journal_path, total_rows=2)
    result = Result(data=RunResult(run.run_id, str(run.path), RunState.STOPPED, progress, summary))
    _write_report(result)
    assert [w.code for w in result.warnings] == ["REPORT_FAILED"]
    assert isinstance(result.data, RunResult) and result.data.report is None
    assert result.exit_code == ExitCode.SUCCESS


def test_a_call_handed_to_a_background_job_keeps_its_own_exit_apart_from_the_job_s(tmp_path: Path) -> None:
    def line(at: float, event: str, pid: int, **fields: Any) -> bytes:
        return _log_line(at, event, **fields).replace(b'"pid":7', b'"pid":%d' % pid)

    t = 1_790_000_000.0
    (tmp_path / "run.log").write_bytes(
        line(t, "start", 100, command="run")
        + line(t + 1, "start", 200, command="run")  # the job's worker, while the front call waits
        + line(t + 2, "exit", 100, exit_code=14)
        + line(t + 9, "exit", 200, exit_code=0)
    )
    calls = read_timeline(tmp_path).calls
    assert [(c.pid, c.exit_code) for c in calls] == [(100, 14), (200, 0)]


def test_an_old_run_log_without_limits_says_so_in_missing_as_the_page_does(tmp_path: Path) -> None:
    """A run log of an earlier version: no interval lines, and a preflight_done without limits or
    transport. The page says "not recorded" for both; `missing` must name them too."""
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=2))
    run = RunDir.create(tmp_path / "runs", plan_for(run_preflight(job, None)))
    start = 1_790_000_000.0
    (run.path / "run.log").write_bytes(
        _log_line(start, "start", command="run")
        + _log_line(start + 0.5, "preflight_done")
        + _log_line(start + 2, "exit", exit_code=0)
    )
    html, (_, _, missing) = build_report(run)
    assert html.count('<span class="absent">not recorded</span>') == 2  # transport and limits
    said = " ".join(missing)
    assert "no interval lines" in said
    assert "the limits in force" in said and "the transport" in said, missing


_QUERY = "SELECT id, email, name FROM customers WHERE id > :after ORDER BY id"


@pytest.mark.slow
def test_a_query_run_s_header_shows_its_query_and_its_database_and_an_old_one_says_what_is_missing(
    tmp_path: Path, target: TargetProcess
) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT, name TEXT)")
        conn.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)", [(n, f"u{n}@example.com", "U") for n in (1, 2, 3)]
        )
    conn.close()
    query = {
        "file": None,
        "query": _QUERY,
        "database": "${DATABASE_URL}",
        "params": {"after": 0},
        "key": "id",
    }
    job = write_job(tmp_path, target.url, rows=1, input=query)
    env = cli_env(DATABASE_URL=f"sqlite:///{db}")
    result = run_cli("run", job, "--budget", "0", "--report", cwd=tmp_path, env=env)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    run_dir = Path(result.data["run_dir"])
    recorded = orjson.loads((run_dir / "run.json").read_bytes())["input"]
    assert recorded["query"] == _QUERY and recorded["source"] == f"sqlite:///{db.resolve()}"
    shown = _elements((run_dir / REPORT).read_text()).text
    assert shown["input-query"] == _QUERY
    assert shown["input-database"] == recorded["source"]  # as run.json names it: no credentials
    assert shown["input-path"] == str(run_dir / "input.jsonl")

    old = tmp_path / "old" / run_dir.name  # a run of issue 26's version: the query only as a digest
    shutil.copytree(run_dir, old)
    manifest = orjson.loads((old / "run.json").read_bytes())
    del manifest["input"]["query"]
    (old / "run.json").write_bytes(orjson.dumps(manifest))
    answer = report(old)
    assert isinstance(answer.data, ReportResult)
    assert any("the query's text" in text for text in answer.data.missing), answer.data.missing
    shown = _elements((old / REPORT).read_text()).text
    assert shown["input-query"] == "not recorded" and shown["input-database"] == recorded["source"]
    assert _QUERY not in (old / REPORT).read_text()  # not guessed from the job file


def _mirror_rows(*keys: str) -> list[dict[str, str]]:
    return [{"id": key, "email": f"{key}@example.com", "name": f"User {key}"} for key in keys]


@pytest.mark.slow
def test_a_mirror_night_and_its_deletion_run_each_say_what_they_are(
    tmp_path: Path, target: TargetProcess
) -> None:
    mirror: dict[str, Any] = {
        "input": {"key": "id"},
        "request": {"method": "PUT"},
        "execution": {"sync": "mirror"},
        "mirror": {"url": f"{target.url}/items/{{id}}", "max_deletes": 10},
    }
    job = write_job(tmp_path, target.url, _mirror_rows("a", "b", "c"), **mirror)
    assert run_cli("run", job, "--budget", "0", cwd=tmp_path).exit_code == ExitCode.SUCCESS
    write_job(tmp_path, target.url, _mirror_rows("a"), **mirror)  # b and c are gone: deleted
    night = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert night.exit_code == ExitCode.SUCCESS, night.envelope
    night_dir, deletions_dir = Path(night.data["run_dir"]), Path(night.data["mirror"]["run_dir"])

    html, _ = build_report(RunDir.open(deletions_dir))
    assert "not a delta run" not in html
    shown = _elements(html).text
    assert shown["delta-mode"] == "deletion run of a mirror job"
    assert shown["deletions-of"] == night_dir.name  # the night whose vanished keys it deletes
    assert (shown["deletes"], shown["sent"]) == ("2", "2")

    night_page = _elements(build_report(RunDir.open(night_dir))[0]).text
    assert night_page["delta-mode"] == "mirror" and night_page["skipped_unchanged"] == "1"
    assert night_page["deletions-run"] == deletions_dir.name and night_page["deletes"] == "2"


@pytest.mark.slow
def test_report_o_follows_a_link_and_refuses_what_is_no_regular_file(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=2)
        run = run_cli("run", job, "--budget", "0", cwd=tmp_path)
    assert run.exit_code == ExitCode.SUCCESS, run.envelope
    (tmp_path / "pages").mkdir()
    real = tmp_path / "pages" / "tgt1.html"
    real.write_text("old")
    (tmp_path / "link1").symlink_to(real)
    linked = run_cli("report", run.data["run_dir"], "-o", "link1", cwd=tmp_path)
    assert linked.exit_code == ExitCode.SUCCESS, linked.envelope
    assert (tmp_path / "link1").is_symlink() and "<html" in real.read_text()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for refused in ("fifo", "dir"):
        for args in ((run.data["run_dir"],), ("--history", "job")):
            result = run_cli("report", *args, "-o", refused, cwd=tmp_path)
            assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
            assert "not a regular file" in result.envelope["error"]["message"]
    assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode) and (tmp_path / "dir").is_dir()
    refused = run_cli("report", run.data["run_dir"], "-o", "fifo", cwd=tmp_path).envelope["error"]
    assert "-o - > PATH" in refused["suggestion"]
