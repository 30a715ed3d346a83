"""`execution.client`, `proxy` and `tls` through the real CLI: both clients relay a whole job, and the
transport's operational settings never block a resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import run_cli
from tests.taggedjobs import journal, run_job, tag_rule, target_ids, write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def test_the_httpx_client_relays_a_whole_job_with_retries(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"first_attempts": 1, "status": 503}]}) as target:
        job = write_job(
            tmp_path, target.url, rows=30, execution={"client": "httpx"}, retry={"max_attempts": 2}
        )
        result = run_job(job)
        assert sorted(set(target_ids(target))) == list(range(1, 31))
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    entries = journal(result.data["run_dir"])
    assert sorted(e["row_number"] for e in entries) == list(range(1, 31))
    assert {(e["success"], e["attempts"]) for e in entries} == {(True, 2)}


def test_switching_client_proxy_or_tls_keeps_the_run_resumable(tmp_path: Path) -> None:
    with TargetProcess({"rules": [tag_rule("stop", status=401, times=1)]}) as target:
        job = write_job(tmp_path, target.url, rows=40, tags={20: "stop"}, execution={"concurrency": 1})
        halted = run_job(job)
        assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
        text = job.read_text().replace("concurrency: 1", "concurrency: 1\n  client: httpx\n  proxy: none")
        job.write_text(text)
        finished = run_job(job)
    assert finished.exit_code == ExitCode.SUCCESS, finished.envelope
    assert finished.data["run_dir"] == halted.data["run_dir"]  # the same run, continued
    assert sorted(e["row_number"] for e in journal(finished.data["run_dir"])) == list(range(1, 41))


def test_a_proxy_that_is_not_a_url_is_a_config_error(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=2, execution={"proxy": "ftp://proxy"})
    result = run_cli("validate", job, cwd=tmp_path)
    assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
    assert result.error_code == "CONFIG_INVALID"
    assert "execution.proxy" in str(result.envelope["error"])


def test_both_clients_send_a_non_ascii_header_value_as_its_utf_8_bytes(tmp_path: Path) -> None:
    """Preflight accepts it and render shows it, so neither client may refuse it row by row."""
    sent: dict[str, str] = {}
    for client in ("reqwest", "httpx"):
        folder = tmp_path / client
        folder.mkdir()
        with TargetProcess() as target:
            job = write_job(
                folder,
                target.url,
                rows=1,
                tags={1: "Zoë €"},
                request={"headers": {"X-Tag": "{tag}"}},
                execution={"client": client},
            )
            result = run_job(job)
            assert result.exit_code == ExitCode.SUCCESS, (client, journal(result.data["run_dir"]))
            (request,) = target.requests()
        value = next(v for k, v in request["headers"].items() if k.lower() == "x-tag")
        sent[client] = value.encode("latin-1").decode("utf-8")  # the target records bytes as latin-1
    assert sent == {"reqwest": "Zoë €", "httpx": "Zoë €"}
