"""What goes on the wire is what preflight checked and what `render` shows (issue 9, items 1 and 2).

Each test drives the real CLI against a real loopback target and reads the target's request log, so
"sent nothing" and "sent exactly these bytes" are facts observed at the far end of a socket.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, cli_env, run_cli
from tests.jobfiles import write_job
from tests.taggedjobs import run_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)


def problems(result: CliResult) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = result.envelope["error"]["context"]["problems"]
    return found


def write_jsonl_job(tmp_path: Path, request: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    """A job over a JSON Lines input, so that values may hold any character (NUL included)."""
    (tmp_path / "data.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    job = {"version": 1, "input": {"file": "data.jsonl"}, "request": request, "execution": {"concurrency": 2}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def assert_refused_before_sending(
    tmp_path: Path, target: TargetProcess, job: Path, exit_code: int, env: dict[str, str] | None = None
) -> CliResult:
    """`validate` and `run` both refuse with `exit_code`, and the target never hears of the job."""
    checked = run_cli("validate", job, env=env)
    assert checked.exit_code == exit_code, checked.envelope
    ran = run_job(job, env=env)
    assert ran.exit_code == exit_code, ran.envelope
    assert target.stats()["requests"] == 0
    return checked


# --------------------------------------------------------------------------------- item 1: path segments


def delete_profile(target: TargetProcess) -> dict[str, Any]:
    return {"method": "DELETE", "url": f"{target.url}/ok/{{id}}/profile", "json": None}


PATH_VALUES = ["%2e%2e", "%2E", "a/b", "/", "q?x=1", "frag#ment", "caf\u00e9", "\u65e5\u672c", "a b", "..."]


def test_render_shows_the_exact_path_the_target_receives(tmp_path: Path) -> None:
    rows = [{"id": value, "email": "e", "name": "n"} for value in PATH_VALUES]
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows, request=delete_profile(target))
        rendered = run_cli("render", job, "--rows", f"1-{len(rows)}")
        assert rendered.exit_code == ExitCode.SUCCESS, rendered.envelope
        ran = run_job(job)
        assert ran.exit_code == ExitCode.SUCCESS, ran.envelope
        received = sorted(r["raw_path"] for r in target.requests())
    shown = sorted(r["url"].removeprefix(target.url) for r in rendered.data["requests"])
    assert received == shown
    # Every value stayed inside its own segment, and arrived as itself.
    assert all(path.startswith("/ok/") and path.endswith("/profile") for path in received)
    assert all(path.count("/") == 3 for path in received)
    assert "/ok/%252e%252e/profile" in received


@pytest.mark.parametrize(("value", "segment"), [("..", ".."), (".", ".")])
def test_a_dot_segment_value_is_refused_with_row_and_field(tmp_path: Path, value: str, segment: str) -> None:
    rows = [{"id": "7", "email": "e", "name": "n"}, {"id": value, "email": "e", "name": "n"}]
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows, request=delete_profile(target))
        checked = assert_refused_before_sending(tmp_path, target, job, ExitCode.ARG_ERROR)
        rendered = run_cli("render", job, "--rows", "2")
    [problem] = problems(checked)
    assert (problem["row"], problem["field"], problem["line"]) == (2, "id", 3)
    assert f"'{segment}'" in problem["message"]
    assert rendered.exit_code == ExitCode.ARG_ERROR
    assert "/profile" not in rendered.stdout.decode()


# ----------------------------------------------------------------------- item 2: what the transport refuses


@pytest.mark.parametrize("bad", ["a\u0000b", "a\u0001b", "a\rb", "a\nb", "a\u007fb"])
def test_a_header_value_the_transport_refuses_is_a_preflight_error(tmp_path: Path, bad: str) -> None:
    with TargetProcess() as target:
        request = {"method": "POST", "url": f"{target.url}/h", "headers": {"X-Tag": "t-{tag}"}, "body": "x"}
        request["content_type"] = "text/plain"
        job = write_jsonl_job(tmp_path, request, [{"tag": "fine"}, {"tag": bad}])
        checked = assert_refused_before_sending(tmp_path, target, job, ExitCode.ARG_ERROR)
    [problem] = problems(checked)
    assert (problem["row"], problem["field"], problem["line"]) == (2, "tag", 2)
    assert "X-Tag" in problem["message"]


@pytest.mark.parametrize("bad", ["tok\r\nX-Evil: 1", "tok\n", "tok\u0001en"])
def test_a_secret_the_transport_refuses_is_secret_invalid(tmp_path: Path, bad: str) -> None:
    with TargetProcess() as target:
        request = {
            "method": "POST",
            "url": f"{target.url}/s",
            "headers": {"Authorization": "Bearer ${API_TOKEN}"},
        }
        job = write_jsonl_job(tmp_path, request | {"json": {"a": {"from": "a"}}}, [{"a": 1}])
        env = cli_env(API_TOKEN=bad)
        checked = assert_refused_before_sending(tmp_path, target, job, ExitCode.PRECONDITION, env)
    assert checked.error_code == "SECRET_INVALID"
    assert "API_TOKEN" in checked.envelope["error"]["message"]
    assert b"tok" not in checked.stdout


@pytest.mark.parametrize("host", ["bad host", "127.0.0.1:1/x", "[::1", "exa%mple"])
def test_a_host_from_a_field_that_makes_no_url_is_a_preflight_error(tmp_path: Path, host: str) -> None:
    with TargetProcess() as target:
        request = {"method": "POST", "url": f"http://{{host}}:{target.port}/h", "json": {"a": {"from": "a"}}}
        job = write_jsonl_job(tmp_path, request, [{"host": "127.0.0.1", "a": 1}, {"host": host, "a": 2}])
        checked = assert_refused_before_sending(tmp_path, target, job, ExitCode.ARG_ERROR)
    [problem] = problems(checked)
    assert (problem["row"], problem["field"], problem["line"]) == (2, "host", 2)


def test_render_shows_the_template_text_as_the_transport_sends_it(tmp_path: Path) -> None:
    rows = [{"id": "1", "email": "e", "name": "n"}]
    with TargetProcess() as target:
        url = f"{target.url.replace('http', 'HTTP')}/v1/./x/../caf\u00e9 au lait/{{id}}#top"
        job = write_job(tmp_path, target.url, rows, request={"url": url})
        rendered = run_cli("render", job, "--rows", "1")
        ran = run_job(job)
        assert ran.exit_code == ExitCode.SUCCESS, ran.envelope
        [received] = target.requests()
    assert received["raw_path"] == "/v1/caf%C3%A9%20au%20lait/1"
    assert rendered.data["requests"][0]["url"] == f"{target.url}{received['raw_path']}"


@pytest.mark.parametrize("base", ["not a url", "ftp://127.0.0.1/v1", "http://bad host/v1", "http://[::1/v1"])
def test_a_secret_that_makes_no_url_is_secret_invalid(tmp_path: Path, base: str) -> None:
    with TargetProcess() as target:
        request = {"method": "POST", "url": "${API_BASE}/items/{a}", "json": {"a": {"from": "a"}}}
        job = write_jsonl_job(tmp_path, request, [{"a": 1}])
        env = cli_env(API_BASE=base)
        checked = assert_refused_before_sending(tmp_path, target, job, ExitCode.PRECONDITION, env)
    assert checked.error_code == "SECRET_INVALID"
    assert "API_BASE" in checked.envelope["error"]["message"]
    assert base.encode() not in checked.stdout
