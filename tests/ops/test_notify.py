"""`notify:` messages at the end of a night, to a loopback receiver: Slack's format and JSON for a failed
night, none for a good night with `on: [failure]`, `NOTIFY_FAILED` (printed even under --quiet) when the
receiver is down; the webhook's secret never written; notify never in the fingerprint."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
import pytest
import yaml

from bulkrelay.errors import ExitCode
from bulkrelay.job.config import load_job
from bulkrelay.job.fingerprint import config_fingerprint
from tests.clirun import cli_env, run_cli, run_cli_raw
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow

SECRET_PATH = "T000/B000/xoxb-9f3e7c1d5b2a"


def _job(tmp: Path, target: str, *, on: list[str]) -> Path:
    notify = [
        {"on": on, "webhook": "${SLACK_WEBHOOK_URL}", "format": "slack"},
        {"on": list(on), "webhook": "${JSON_WEBHOOK_URL}", "format": "json"},
    ]
    return write_job(tmp, target, rows=20, notify=notify)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(base: str) -> dict[str, str]:
    return cli_env(SLACK_WEBHOOK_URL=f"{base}/hooks/{SECRET_PATH}", JSON_WEBHOOK_URL=f"{base}/hooks/json")


def _hooks(target: TargetProcess) -> list[dict[str, object]]:
    return [r for r in target.requests() if str(r["path"]).startswith("/hooks/")]


def test_a_failed_night_sends_one_slack_and_one_json_message(tmp_path: Path) -> None:
    plan = {"rules": [{"match": {"body_contains": "5@example"}, "status": 422}]}
    with TargetProcess(plan) as target:
        job = _job(tmp_path, target.url, on=["failure", "halt"])
        result = run_cli("run", job, "--budget", "0", "--report", cwd=tmp_path, env=_env(target.url))
        assert result.exit_code == ExitCode.PARTIAL_FAILURE, result.envelope
        assert not [w for w in result.envelope["warnings"] if w["code"] == "NOTIFY_FAILED"]
        hooks = _hooks(target)
    assert sorted(str(h["path"]) for h in hooks) == sorted([f"/hooks/{SECRET_PATH}", "/hooks/json"])
    slack = next(orjson.loads(str(h["body"])) for h in hooks if h["path"] != "/hooks/json")
    sent = next(orjson.loads(str(h["body"])) for h in hooks if h["path"] == "/hooks/json")
    assert set(slack) == {"text"} and "Completed with failures: 2 rows failed" in slack["text"]
    assert "http_client_error: 2 rows" in slack["text"] and "report.html" in slack["text"]
    assert sent["failed"] == 2 and sent["rows_done"] == 20 and sent["state"] == "completed_with_failures"
    assert sent["top_failure_reasons"] == [{"classification": "http_client_error", "rows": 2}]
    assert sent["report"] == result.data["report"]
    run_dir = Path(result.data["run_dir"])
    for path in run_dir.iterdir():
        assert SECRET_PATH.encode() not in path.read_bytes(), path
    assert SECRET_PATH not in result.stderr and SECRET_PATH.encode() not in result.stdout


def test_a_good_night_with_on_failure_sends_nothing(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = _job(tmp_path, target.url, on=["failure"])
        result = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=_env(target.url))
        assert result.exit_code == ExitCode.SUCCESS, result.envelope
        assert _hooks(target) == []


def test_an_undeliverable_message_is_a_warning_even_under_quiet(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = _job(tmp_path, target.url, on=["success"])
        down = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
        proc = run_cli_raw("run", job, "--budget", "0", "--quiet", cwd=tmp_path, env=_env(down))
    assert proc.returncode == ExitCode.SUCCESS  # the night's code stands
    warned = proc.stderr.decode()
    assert warned.count("warning NOTIFY_FAILED") == 2 and "after 3 attempts" in warned
    assert SECRET_PATH not in warned and proc.stdout == b""


def test_notify_is_never_part_of_the_fingerprint(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=1)
    before = config_fingerprint(load_job(job).config)
    data = yaml.safe_load(job.read_text())
    data["notify"] = [{"on": "failure", "webhook": "${HOOK}", "format": "slack"}]
    job.write_text(yaml.safe_dump(data))
    assert config_fingerprint(load_job(job).config) == before


@pytest.mark.parametrize(
    ("hook", "said"),
    [
        ("{base}/hooks/" + SECRET_PATH + "\n", "a control character or space at its end"),
        ("http://[::1/hooks/" + SECRET_PATH, "not a valid URL"),
        ("ftp://127.0.0.1/hooks/" + SECRET_PATH, "not an http:// or https:// URL"),
    ],
)
def test_a_malformed_webhook_is_a_warning_and_the_night_stands(tmp_path: Path, hook: str, said: str) -> None:
    with TargetProcess() as target:
        notify = [{"on": ["success"], "webhook": "${HOOK}"}]
        job = write_job(tmp_path, target.url, rows=3, notify=notify)
        env = cli_env(HOOK=hook.format(base=target.url))
        result = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=env)
        assert _hooks(target) == []
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert result.data["state"] == "completed" and result.data["summary"]["by_outcome"]["succeeded"] == 3
    (warning,) = [w for w in result.envelope["warnings"] if w["code"] == "NOTIFY_FAILED"]
    assert said in warning["message"] and "notify[0]" in warning["message"]
    assert SECRET_PATH not in result.stderr and SECRET_PATH.encode() not in result.stdout
