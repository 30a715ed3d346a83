"""`--metrics-file`: Prometheus text format, written atomically at the start, every ~10 s and at the end
of a run, parsed here with prometheus_client's own parser."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from bulkrelay.background.call import Call
from bulkrelay.background.jobs import arguments_key
from bulkrelay.cli.parser import parse_call
from bulkrelay.envelope import Result
from bulkrelay.errors import ExitCode
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import plan_for
from bulkrelay.relay.metrics import MetricsFile, RelayStats
from bulkrelay.relay.progress import Snapshot
from bulkrelay.store.rundir import RunDir, RunState
from tests.clirun import cli_env, run_cli, run_cli_raw
from tests.jobfiles import write_job
from tests.runfiles import metric, read_metrics
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def _held_job(tmp_path: Path, url: str) -> Path:
    """Every row keeps being retried while the target answers 503: a run that ends when the test says."""
    retry = {"max_attempts": 100, "initial_backoff_seconds": 0.05, "max_backoff_seconds": 0.05}
    return write_job(tmp_path, url, rows=8, retry=retry)


def test_a_run_writes_metrics_that_parse_and_count_what_happened(tmp_path: Path) -> None:
    plan = {
        "rules": [
            {"match": {"path_contains": "/items/3"}, "status": 429, "retry_after": "1", "first_attempts": 1},
            {"match": {"path_contains": "/items/4"}, "status": 503, "first_attempts": 1},
            {"match": {"path_contains": "/items/5"}, "status": 422},
        ]
    }
    with TargetProcess(plan) as target:
        retry = {"max_attempts": 3, "initial_backoff_seconds": 0.01, "jitter_ratio": 0}
        job = write_job(tmp_path, target.url, rows=10, retry=retry)
        prom = tmp_path / "nightly.prom"
        result = run_cli("run", job, "--budget", "0", "--metrics-file", prom, cwd=tmp_path)
        assert result.exit_code == ExitCode.PARTIAL_FAILURE, result.envelope
        samples = read_metrics(prom)
        assert metric(samples, "bulkrelay_rows", outcome="succeeded") == 9
        assert metric(samples, "bulkrelay_rows", outcome="failed") == 1
        assert metric(samples, "bulkrelay_rows", outcome="pending") == 0
        assert metric(samples, "bulkrelay_requests_total", status_class="2xx") == 9
        assert metric(samples, "bulkrelay_requests_total", status_class="4xx") == 2  # the 429 and the 422
        assert metric(samples, "bulkrelay_requests_total", status_class="5xx") == 1
        assert metric(samples, "bulkrelay_retries_total") == 2
        assert metric(samples, "bulkrelay_rate_limit_pauses_total") == 1
        assert metric(samples, "bulkrelay_rate_limit_pause_seconds_total") == 1.0
        sent = target.stats()["requests"]
        assert metric(samples, "bulkrelay_request_duration_seconds_count") == sent == 12
        assert metric(samples, "bulkrelay_request_duration_seconds_bucket", le="+Inf") == sent
        assert metric(samples, "bulkrelay_run_state", state="completed_with_failures") == 1
        assert metric(samples, "bulkrelay_run_state", state="running") == 0
        assert metric(samples, "bulkrelay_run_exit_code") == ExitCode.PARTIAL_FAILURE
        assert metric(samples, "bulkrelay_run_info", run_id=result.data["run_id"]) == 1
        assert metric(samples, "bulkrelay_rows_per_second") > 0
        assert not any(name == "bulkrelay_last_success_timestamp_seconds" for name, _ in samples)

        target.set_plan({})
        good = run_cli("run", job, "--budget", "0", "--metrics-file", prom, cwd=tmp_path)
        assert good.exit_code == ExitCode.SUCCESS, good.envelope
        succeeded_at = metric(read_metrics(prom), "bulkrelay_last_success_timestamp_seconds")

        target.set_plan({"rules": [{"match": {"path_contains": "/items/5"}, "status": 422}]})
        bad = run_cli("run", job, "--budget", "0", "--metrics-file", prom, cwd=tmp_path)
        assert bad.exit_code == ExitCode.PARTIAL_FAILURE
        after_failure = read_metrics(prom)
        assert metric(after_failure, "bulkrelay_run_exit_code") == ExitCode.PARTIAL_FAILURE
        # A failed night keeps the last success where it was: an alert on its age fires.
        assert metric(after_failure, "bulkrelay_last_success_timestamp_seconds") == succeeded_at


def test_the_environment_names_the_file_and_neither_changes_the_run(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"status": 503}]}) as target:
        job = _held_job(tmp_path, target.url)
        from_env = tmp_path / "env.prom"
        env = cli_env(BULKRELAY_METRICS_FILE=str(from_env))
        stopped = run_cli("run", job, "--budget", "0", "--timeout", "2s", cwd=tmp_path, env=env)
        assert stopped.exit_code == ExitCode.TIMEOUT, stopped.envelope
        samples = read_metrics(from_env)
        assert metric(samples, "bulkrelay_run_state", state="stopped") == 1
        assert metric(samples, "bulkrelay_run_exit_code") == ExitCode.TIMEOUT
        assert metric(samples, "bulkrelay_rows", outcome="pending") == 8
        assert metric(samples, "bulkrelay_requests_total", status_class="5xx") > 0

        target.set_plan({})
        flag = tmp_path / "flag.prom"
        args = ("--metrics-file", flag, "--log-file", tmp_path / "cron.log", "--quiet")
        continued = run_cli_raw("--json", "run", job, "--budget", "0", *args, cwd=tmp_path)
        assert continued.returncode == ExitCode.SUCCESS, continued.stdout
        assert continued.stdout == b""  # --quiet: nothing on success, even with --json
        manifest = orjson.loads((Path(stopped.data["run_dir"]) / "run.json").read_bytes())
        assert manifest["state"] == "completed"  # the identical invocation continued the same run
        assert metric(read_metrics(flag), "bulkrelay_run_state", state="completed") == 1
        assert metric(read_metrics(flag), "bulkrelay_rows", outcome="succeeded") == 8


def _parsed(*argv: str) -> Call:
    return parse_call(list(argv))


def test_operational_flags_are_not_part_of_the_invocation_identity(tmp_path: Path) -> None:
    plain = _parsed("resume", str(tmp_path / "run"), "--budget", "5s")
    loud = _parsed(
        "--quiet", "resume", str(tmp_path / "run"), "--metrics-file", "m.prom", "--log-file", "run.log"
    )
    assert arguments_key(plain, None) == arguments_key(loud, None)
    other_run = _parsed("resume", str(tmp_path / "other"))
    assert arguments_key(plain, None) != arguments_key(other_run, None)


def test_a_missing_metrics_directory_is_a_usage_error_before_anything_is_sent(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "m.prom"
    result = run_cli("run", tmp_path / "job.yaml", "--budget", "0", "--metrics-file", missing, cwd=tmp_path)
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "USAGE_ERROR"
    assert str(missing) in result.envelope["error"]["message"]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_while_a_run_goes_on_the_file_is_rewritten_every_interval_and_not_more(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", rows=10))
    preflight = run_preflight(job, None)
    run = RunDir.create(tmp_path / "runs", plan_for(preflight))
    clock = _Clock()
    prom = tmp_path / "m.prom"
    metrics = MetricsFile(prom, interval=10.0, clock=clock)
    stats = RelayStats()
    metrics.run_started(run, preflight, stats)
    assert metric(read_metrics(prom), "bulkrelay_run_state", state="running") == 1
    assert not any(name == "bulkrelay_run_exit_code" for name, _ in read_metrics(prom))

    metrics.progressed(Snapshot(total=10, done=0, ok=0, failed=0))  # the first progress is written at once
    stats.on_attempt(200, 0.02)
    clock.now += 5
    metrics.progressed(Snapshot(total=10, done=3, ok=3, failed=0))
    assert metric(read_metrics(prom), "bulkrelay_rows", outcome="succeeded") == 0  # not yet: 5 s
    clock.now += 5.5
    metrics.progressed(Snapshot(total=10, done=6, ok=5, failed=1))
    samples = read_metrics(prom)
    assert metric(samples, "bulkrelay_rows", outcome="succeeded") == 5
    assert metric(samples, "bulkrelay_rows", outcome="pending") == 4
    assert metric(samples, "bulkrelay_requests_total", status_class="2xx") == 1
    assert metric(samples, "bulkrelay_request_duration_seconds_bucket", le="0.025") == 1
    assert metric(samples, "bulkrelay_request_duration_seconds_bucket", le="0.01") == 0

    result = Result(
        exit_code=ExitCode.SUCCESS, data={"progress": {"done": 10, "total": 10, "ok": 10, "failed": 0}}
    )
    run.mark_ended(RunState.COMPLETED, None)
    metrics.run_finished(run, result)
    final = read_metrics(prom)
    assert metric(final, "bulkrelay_run_exit_code") == 0
    assert metric(final, "bulkrelay_run_state", state="completed") == 1
    assert metric(final, "bulkrelay_last_success_timestamp_seconds") > 0
    assert not list(tmp_path.glob(".m.prom.*"))  # no temp file left behind


@pytest.mark.parametrize("kind", ["empty", "directory", "fifo", "link to a fifo"])
def test_a_metrics_path_that_is_no_file_is_refused_before_the_run_is_made(tmp_path: Path, kind: str) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=2)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    named = {"empty": "", "directory": str(tmp_path), "fifo": "fifo", "link to a fifo": "link"}[kind]
    result = run_cli("run", job, "--budget", "0", "--metrics-file", named, cwd=tmp_path, timeout=60)
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    assert "--metrics-file" in result.envelope["error"]["message"]
    assert not list(tmp_path.rglob("run.json"))  # refused before a run was made


def test_a_huge_earlier_file_is_not_read_and_its_warning_keeps_the_run_s_envelope(tmp_path: Path) -> None:
    prom = tmp_path / "nightly.prom"
    prom.write_bytes(b"# " + b"x" * (2 << 20) + b"\n")  # 2 MiB: read whole before, bounded now
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "target.prom").write_text("")
    (tmp_path / "linked.prom").symlink_to(tmp_path / "real" / "target.prom")
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=2)
        result = run_cli("run", job, "--budget", "0", "--metrics-file", prom, cwd=tmp_path)
        linked = run_cli("run", job, "--budget", "0", "--metrics-file", "linked.prom", cwd=tmp_path)
    assert result.exit_code == ExitCode.SUCCESS and result.data["state"] == "completed", result.envelope
    (warning,) = [w for w in result.envelope["warnings"] if w["code"] == "METRICS_WRITE_FAILED"]
    assert "larger than 1 MiB" in warning["message"]
    assert metric(read_metrics(prom), "bulkrelay_rows", outcome="succeeded") == 2
    assert linked.exit_code == ExitCode.SUCCESS and (tmp_path / "linked.prom").is_symlink()
    assert metric(read_metrics(tmp_path / "real" / "target.prom"), "bulkrelay_rows", outcome="succeeded") == 2
