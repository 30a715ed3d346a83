"""`render --curl`: each rendered request as a curl command line that a shell reads back word for word,
secrets as `***`; sent by the real curl, it makes the request `render` shows."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.ops.curl import curl_command
from tests.clirun import cli_env, run_cli, run_cli_raw
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # a real target process: outside the fast lane

TOKEN = "t0ps3cret-value"
JOB = """\
version: 1
input: {file: people.jsonl}
request:
  method: PATCH
  url: "%s/v1/people/{id}?tag=[x]"
  headers: {Authorization: "Bearer ${API_TOKEN}", X-Note: "it's {note}"}
  json:
    note: {from: note}
"""
ROWS = '{"id": "a b", "note": "O\'Brien $(touch pwned) `id` \\\\ \\"q\\""}\n{"id": "2", "note": "plain"}\n'


def _write(tmp_path: Path, base: str) -> Path:
    (tmp_path / "people.jsonl").write_text(ROWS)
    job = tmp_path / "job.yaml"
    job.write_text(JOB % base)
    return job


def test_each_request_is_one_command_line_the_shell_reads_back_word_for_word(tmp_path: Path) -> None:
    job = _write(tmp_path, "http://127.0.0.1:9")
    result = run_cli("render", job, "--curl", env=cli_env(API_TOKEN=TOKEN))
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    request = result.data["requests"][0]
    command = request["curl"]
    assert TOKEN not in result.stdout.decode()
    words = ["curl", "--globoff", "-X", "PATCH", request["url"]]
    words += [arg for name, value in request["headers"] for arg in ("-H", f"{name}: {value}")]
    words += ["--data-raw", request["body"]]
    assert shlex.split(command) == words
    assert "Authorization: Bearer ***" in words
    # A real shell reads the same words (and runs nothing inside them): printf stands in for curl.
    echoed = subprocess.run(
        ["sh", "-c", "printf '%s\\0' " + command.removeprefix("curl ")],
        cwd=tmp_path,
        capture_output=True,
        check=True,
    )
    assert echoed.stdout.decode().split("\0")[:-1] == words[1:]
    assert not (tmp_path / "pwned").exists()


def test_human_output_is_one_curl_line_per_request(tmp_path: Path) -> None:
    job = _write(tmp_path, "http://127.0.0.1:9")
    proc = run_cli_raw("render", job, "--curl", "--human", env=cli_env(API_TOKEN=TOKEN))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 2 and all(line.startswith("curl --globoff -X PATCH ") for line in lines)
    assert TOKEN.encode() not in proc.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl (Debian package: curl)")
def test_the_command_sent_by_curl_makes_the_request_render_shows(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = _write(tmp_path, target.url)
        result = run_cli("render", job, "--curl", "--rows", "1", env=cli_env(API_TOKEN=TOKEN))
        request = result.data["requests"][0]
        subprocess.run(["sh", "-c", request["curl"] + " --silent --output /dev/null"], check=True, timeout=60)
        received = target.requests()[0]
    assert received["method"] == "PATCH"
    assert received["raw_path"] + "?" + received["query"] == request["url"].removeprefix(target.url)
    assert received["body"] == request["body"]
    assert received["headers"]["X-Note"] == dict(request["headers"])["X-Note"]
    assert received["headers"]["Authorization"] == "Bearer ***"  # the secret stays out of the ticket


RAW_JOB = """\
version: 1
input: {file: notes.jsonl}
request:
  method: POST
  url: "%s/notes/{id}"
  content_type: text/plain
  body: "{note}"
"""
# A body that starts with `@` (curl's "upload this file"), then bodies with a line break, a NUL, an
# escape sequence, a bidi override, printf's own `%` and `\\`, and shell words.
NOTES = [
    "@/proc/self/environ",
    "@-",
    "two\nlines\r\n\ttab \u0000 nul \u001b]52;c;eA==\u0007 \u202eevil 100% back\\slash \\0101 é",
    "'quoted' $(touch pwned) `id`",
]


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl (Debian package: curl)")
def test_curl_sends_exactly_the_bytes_the_relay_sends_whatever_the_body_holds(tmp_path: Path) -> None:
    rows = [orjson.dumps({"id": str(n), "note": note}) for n, note in enumerate(NOTES, start=1)]
    (tmp_path / "notes.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    job = tmp_path / "job.yaml"
    with TargetProcess() as target:
        job.write_text(RAW_JOB % target.url)
        run = run_cli("run", job, "--runs-dir", tmp_path / "runs", cwd=tmp_path)
        assert run.exit_code == ExitCode.SUCCESS, run.envelope
        relayed = [(got["path"], got["body"]) for got in target.requests()]
        target.reset()
        rendered = run_cli("render", job, "--curl", "--rows", f"1-{len(NOTES)}", cwd=tmp_path)
        for request in rendered.data["requests"]:
            command = request["curl"]
            assert "\n" not in command and not any(ord(c) < 32 or c == "\u202e" for c in command)
            subprocess.run(
                ["sh", "-c", command + " --silent --output /dev/null"], cwd=tmp_path, check=True, timeout=60
            )
        curled = [(got["path"], got["body"]) for got in target.requests()]
    assert [body for _, body in sorted(relayed)] == NOTES
    assert sorted(curled) == sorted(relayed)
    assert not (tmp_path / "pwned").exists()


def test_curl_command_quotes_every_word() -> None:
    command = curl_command("GET", "http://h/a?b=1&c=2", [("A", "x y")], None)
    assert command == "curl --globoff -X GET 'http://h/a?b=1&c=2' -H 'A: x y'"
