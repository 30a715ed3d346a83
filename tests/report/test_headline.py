"""The report leads with the answer: the night's result in words and numbers, compared with the job's
nights before it; every value as a person writes it; commands that work from any directory."""

from __future__ import annotations

import os
import re
from html import unescape
from pathlib import Path

import pytest

from bulkrelay.job.config import load_job
from bulkrelay.job.request import RequestRenderer
from bulkrelay.ops.report import build_report
from bulkrelay.ops.runlog import limits_of, transport_of
from bulkrelay.store.manifest import RunState
from tests.jobfiles import write_job
from tests.report.nightfiles import job_plan, make_night

RAW = re.compile(r"\b(True|False|None)\b|\{'|\d{2}:\d{2}:\d{2}\.\d+|_seconds\b")


def _text(html: str) -> str:
    """What a reader sees: tags, style and charts off, entities read."""
    html = re.sub(r"<style>.*?</style>|<svg.*?</svg>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def _verdict(html: str) -> str:
    found = re.search(r'id="verdict">([^<]*)<', html)
    assert found, html[:2000]
    return unescape(found.group(1))


def test_the_headline_states_each_kind_of_night_in_words(tmp_path: Path) -> None:
    plan = job_plan(tmp_path)
    runs = tmp_path / "runs"
    clean = make_night(runs, plan, 0)
    failed = make_night(runs, plan, 1, failed=14)
    halted = make_night(runs, plan, 2, state=RunState.STOPPED, stop_reason="halt_auth", done=40)
    assert _verdict(build_report(clean)[0]) == "Completed: every row succeeded"
    assert _verdict(build_report(failed)[0]) == "Completed with failures: 14 rows failed"
    assert _verdict(build_report(halted)[0]).startswith("Halted: the target answered a status")
    shown = _text(build_report(failed)[0])
    assert "100 rows sent, 14 failed (14%), 0 skipped" in shown, shown
    assert "took 1m 00s" in shown


def test_a_night_outside_the_job_s_usual_range_is_flagged_in_words(tmp_path: Path) -> None:
    plan = job_plan(tmp_path)
    runs = tmp_path / "runs"
    for night in range(3):
        make_night(runs, plan, night, failed=night % 2, seconds=60 + night)
    usual = make_night(runs, plan, 3, failed=1, seconds=61)
    bad = make_night(runs, plan, 4, failed=14, seconds=300)
    usual_text = _text(build_report(usual)[0])
    assert "failures: 1; the job's last 3 nights: 0 to 1" in usual_text, usual_text
    assert "outside the usual range" not in usual_text
    bad_html = build_report(bad)[0]
    unusual = re.findall(r'<li class="unusual">(.*?)</li>', bad_html)
    assert [item.split(":")[0] for item in unusual] == ["failures", "duration"], unusual
    assert "outside the usual range" in _text(bad_html)
    first = make_night(tmp_path / "other", plan, 0)
    assert "nothing to compare with yet" in _text(build_report(first)[0])


def test_the_requests_sent_are_shown_by_status_with_retries_and_splits_apart(tmp_path: Path) -> None:
    plan = job_plan(tmp_path)
    runs = tmp_path / "runs"
    counted = {"sent": 1320, "by_status": {"200": 1310, "413": 8, "none": 2}, "retries": 3, "splits": 8}
    batched = make_night(runs, plan, 0, requests=counted)
    older = make_night(runs, plan, 1)  # a summary of an earlier version: no `requests` block

    shown = _text(build_report(batched)[0])
    assert (
        "requests 1,320 sent: 1,310 HTTP 200, 8 HTTP 413, 2 without an answer; of them 3 retries, "
        "and 8 splits of a refused batch (new requests, not retries)"
    ) in shown, shown
    assert "requests not counted (a run of an earlier version)" in _text(build_report(older)[0])


def test_settings_times_and_booleans_read_as_a_person_writes_them(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=3))
    run = make_night(tmp_path / "runs", job_plan(tmp_path, 3), 0)
    line = (
        '{"ts": "2026-12-01T02:30:00.123456Z", "event": "preflight_done", "pid": 1, '
        f'"limits": {_json(limits_of(job.config))}, "transport": {_json(transport_of(job.config))}}}\n'
    )
    (run.path / "run.log").write_text(line)
    shown = _text(build_report(run)[0])
    assert not RAW.findall(shown), RAW.findall(shown)
    assert "http2 no" in shown and "timeout connect 10 s, read 30 s, write 30 s, pool 5 s" in shown
    assert "max lifetime 7 days" in shown and "2026-" in shown and " UTC" in shown


def _json(value: object) -> str:
    import orjson

    return orjson.dumps(value).decode()


def test_times_are_shown_in_utc_and_in_the_machine_s_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    from bulkrelay.report.words import when

    monkeypatch.setenv("TZ", "Europe/Paris")
    import time

    time.tzset()
    try:
        assert when("2026-12-01T02:30:00.999999Z") == "2026-12-01 02:30:00 UTC (03:30:00 CET)"
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(("listed", "shown"), [(["API_BASE"], "https://api.example.com:8443"), ([], "***")])
def test_the_target_s_origin_is_shown_when_the_url_starts_with_a_variable(
    tmp_path: Path, listed: list[str], shown: str
) -> None:
    job_file = write_job(tmp_path, "${API_BASE}", rows=1, vars=listed) if listed else None
    job = load_job(job_file or write_job(tmp_path, "${API_BASE}", rows=1))
    env = {**os.environ, "API_BASE": "https://api.example.com:8443"}
    renderer = RequestRenderer.from_config(job.config.request, env, shown=job.config.vars)
    assert job.config.request.url.startswith("${API_BASE}")
    assert transport_of(job.config, renderer)["target"] == shown  # a secret's value never: `***`


def test_the_commands_on_the_page_name_the_run_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_night(tmp_path / "runs", job_plan(tmp_path), 0, failed=2)
    monkeypatch.chdir(tmp_path)
    relative = type(run).open(Path("runs") / run.run_id)
    commands = re.findall(r'<code class="command">([^<]*)</code>', build_report(relative)[0])
    assert commands and all(f" {run.path.absolute()}" in unescape(c) for c in commands), commands
