"""Users of the public alpha (SerDrozd/bulkrelay) move over: its job files, its CLI invocations and its
run directories, each either working or refused with the message docs/migrating.md documents.

The examples in examples/alpha/ are in the alpha's schema. The alpha's URL cannot take a `${NAME}`
(it had no interpolation), so each test copies an example next to its input files with the alpha's
demo address `http://127.0.0.1:8000` replaced by the loopback target's; nothing else changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.job.config import parse_job_with_deprecations
from bulkrelay.store.journal import read_journal
from tests.alpharuns import CSV_ROWS, write_alpha_run
from tests.clirun import CliResult, run_cli
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "alpha"
ALPHA_BASE = "http://127.0.0.1:8000"
JSONL_ROWS = 5


def example_copy(name: str, folder: Path, target_url: str) -> Path:
    """examples/alpha/<name>.yaml and its inputs in `folder`, the URL pointed at the target."""
    for data in ("customers.csv", "customers.jsonl"):
        shutil.copy(EXAMPLES / data, folder / data)
    text = (EXAMPLES / f"{name}.yaml").read_text()
    assert ALPHA_BASE in text
    path = folder / f"{name}.yaml"
    path.write_text(text.replace(ALPHA_BASE, target_url))
    return path


def run_job(job: Path, *extra: str | Path) -> CliResult:
    """`bulkrelay run JOB` as the alpha documents it; `--budget 0` keeps it in this process."""
    return run_cli("run", job, "--budget", "0", *extra, cwd=job.parent)


# The alpha's demo API (its examples/fake_api/app.py) reads each POST as `UserIn`, a pydantic model of
# three required strings, other fields ignored; a body without one of them gets 422.
ALPHA_API_FIELDS = ("email", "first_name", "source")


def _the_alpha_demo_api_takes(body: dict[str, Any]) -> bool:
    return all(isinstance(body.get(field), str) for field in ALPHA_API_FIELDS)


def bodies(target: TargetProcess) -> list[dict[str, Any]]:
    return sorted((json.loads(r["body"]) for r in target.requests()), key=lambda body: str(body["email"]))


# ------------------------------------------------------------------ the alpha's example jobs

EXPECTED_FIRST_BODY = {
    "basic": {
        "email": "ada.lovelace@example.com",
        "first_name": "Ada",
        "city": "London",
        "source": "alpha-basic",
    },
    "concurrency": {
        "email": "ada.lovelace@example.com",
        "first_name": "Ada",
        "source": "alpha-concurrency",
    },
    "reliability": {
        "email": "ada.lovelace@example.com",
        "first_name": "Ada",
        "source": "alpha-reliability",
    },
    "jsonl": {
        "email": "ada@example.com",
        "first_name": "Ada",
        "age": 36,
        "active": True,
        "address": {"city": "London", "country": "XX"},
        "tags": ["math"],
        "campaign": {"name": "spring-import", "wave": 2},
        "source": "alpha-jsonl",
    },
    "spellings": {"email": "ada.lovelace@example.com", "first_name": "Ada", "source": "alpha-spellings"},
}
PATHS = {"concurrency": "/concurrent/users", "reliability": "/unstable/users"}


@pytest.mark.parametrize("name", sorted(EXPECTED_FIRST_BODY))
def test_each_alpha_example_validates_renders_and_runs_unchanged(tmp_path: Path, name: str) -> None:
    # The reliability job meets a flaky target: every row's first attempt gets a 503, its retry succeeds.
    plan = {"rules": [{"first_attempts": 1, "status": 503}]} if name == "reliability" else None
    rows = JSONL_ROWS if name == "jsonl" else CSV_ROWS
    with TargetProcess(plan) as target:
        job = example_copy(name, tmp_path, target.url)

        validated = run_cli("validate", job)
        assert validated.exit_code == ExitCode.SUCCESS, validated.envelope
        assert validated.data["record_count"] == rows

        rendered = run_cli("render", job, "--rows", "1")
        assert rendered.exit_code == ExitCode.SUCCESS, rendered.envelope
        (request,) = rendered.data["requests"]
        assert request["method"] == "POST"
        assert request["url"] == target.url + PATHS.get(name, "/users")
        assert json.loads(request["body"]) == EXPECTED_FIRST_BODY[name]

        ran = run_job(job)
        assert ran.exit_code == ExitCode.SUCCESS, ran.envelope
        received = target.requests()
        assert len({r["body"] for r in received}) == rows
        assert len(received) == rows * (2 if name == "reliability" else 1)
        assert all(r["method"] == "POST" for r in received)
        if name != "spellings":
            assert all(r["headers"].get("X-Client") == "alpha-migration" for r in received)
        assert EXPECTED_FIRST_BODY[name] in bodies(target)
        assert all(_the_alpha_demo_api_takes(body) for body in bodies(target))
    expected_warnings = 2 if name == "spellings" else 0
    assert [w["code"] for w in validated.envelope["warnings"]] == ["DEPRECATED_KEY"] * expected_warnings
    assert [w["code"] for w in ran.envelope["warnings"]] == ["DEPRECATED_KEY"] * expected_warnings


def test_alpha_spellings_warn_with_their_place_and_mean_the_same_job(tmp_path: Path) -> None:
    alpha = example_copy("spellings", tmp_path, ALPHA_BASE)
    canonical = tmp_path / "canonical.yaml"
    text = alpha.read_text().replace("from_column:", "from:")
    canonical.write_text(text.replace("request:\n", "request:\n  method: POST\n"))

    old, new = run_cli("validate", alpha), run_cli("validate", canonical)
    assert (old.exit_code, new.exit_code) == (ExitCode.SUCCESS, ExitCode.SUCCESS)
    assert new.envelope["warnings"] == []
    assert old.data["config_sha256"] == new.data["config_sha256"]
    lines = alpha.read_text().splitlines()
    method, column = old.envelope["warnings"]
    assert "write `method: POST`" in method["message"]
    assert method["context"]["path"] == "request"
    assert lines[method["context"]["line"] - 1] == "request:"
    assert "write `from: email`" in column["message"]
    assert column["context"]["path"] == "request.json.email.from_column"
    assert lines[column["context"]["line"] - 1].strip() == "from_column: email"
    assert column["context"]["file"] == str(alpha)


def test_from_and_from_column_together_are_refused_with_what_to_write(tmp_path: Path) -> None:
    job = example_copy("spellings", tmp_path, ALPHA_BASE)
    job.write_text(job.read_text().replace("from_column: email", "from_column: email\n      from: mail"))
    result = run_cli("validate", job)
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "CONFIG_INVALID"
    (problem,) = result.envelope["error"]["context"]["problems"]
    assert "write only `from: mail`" in problem["message"]
    assert problem["path"] == "request.json.email.from_column"


def test_a_value_literal_and_an_output_field_named_from_column_are_not_rewritten() -> None:
    text = """
version: 1
request:
  url: http://127.0.0.1:8000/users
  json:
    meta: { value: { from_column: kept } }
    from_column: { from: email }
"""
    config, notes = parse_job_with_deprecations(text, file="job.yaml")
    assert config.model_dump(mode="json", by_alias=True)["request"]["json"] == {
        "meta": {"value": {"from_column": "kept"}},
        "from_column": {"from": "email", "type": None},
    }
    assert [note.path for note in notes] == ["request"]  # only the missing method


def test_a_missing_column_in_an_alpha_job_is_an_argument_error(tmp_path: Path) -> None:
    job = example_copy("basic", tmp_path, ALPHA_BASE)
    job.write_text(job.read_text().replace("from: email", "from: customer_email"))  # an older export's name
    for command in ("validate", "run"):
        result = run_cli(command, job, "--budget", "0") if command == "run" else run_cli(command, job)
        assert result.exit_code == ExitCode.ARG_ERROR, result.envelope
        assert result.error_code in ("CONFIG_INVALID", "INPUT_INVALID")
        assert "customer_email" in json.dumps(result.envelope["error"])
        assert "did you mean 'email'" in json.dumps(result.envelope["error"])  # as docs/migrating.md says


# ------------------------------------------------------------------ the alpha's CLI invocations


def test_output_dir_is_the_runs_dir_with_a_deprecation(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = example_copy("basic", tmp_path, target.url)
        result = run_job(job, "--output-dir", tmp_path / "reports")
        assert result.exit_code == ExitCode.SUCCESS, result.envelope
        assert Path(result.data["run_dir"]).parent == tmp_path / "reports"
        (warning,) = result.envelope["warnings"]
        assert warning["code"] == "DEPRECATED_FLAG"
        assert f"--runs-dir {tmp_path / 'reports'}" in warning["message"]
        listed = run_cli("runs", "--runs-dir", tmp_path / "reports")
        assert [run["run_dir"] for run in listed.data["runs"]] == [result.data["run_dir"]]

        both = run_job(job, "--output-dir", tmp_path / "a", "--runs-dir", tmp_path / "b")
        assert both.exit_code == ExitCode.ARG_ERROR
        assert both.error_code == "USAGE_ERROR"
        assert "--output-dir" in both.envelope["error"]["message"]
        assert len(target.requests()) == CSV_ROWS  # the refused call sent nothing


def test_failed_rows_exit_3_and_keep_the_response_body(tmp_path: Path) -> None:
    rule = {"match": {"body_field": "email", "equals": "alan.turing@example.com"}, "status": 422}
    with TargetProcess({"rules": [{**rule, "body": {"detail": "email taken"}}]}) as target:
        job = example_copy("basic", tmp_path, target.url)
        result = run_job(job)
    assert result.exit_code == ExitCode.PARTIAL_FAILURE  # the alpha exited 1
    assert result.data["state"] == "completed_with_failures"
    failed = [e for e in read_journal(Path(result.data["run_dir"]) / "results.jsonl") if not e.success]
    assert [(e.row_number, e.classification, e.error) for e in failed] == [
        (2, "http_client_error", "HTTP 422")
    ]
    assert json.loads(failed[0].response_body or "") == {"detail": "email taken"}  # the alpha's `error`


def test_resume_with_a_moved_config_continues_and_a_completed_run_is_refused(tmp_path: Path) -> None:
    # Each row takes at least 400 ms at four in flight: 20 rows need 2 s, far beyond the 500 ms timeout.
    with TargetProcess({"rules": [{"delay_ms": 400}]}) as target:
        job = example_copy("concurrency", tmp_path, target.url)
        stopped = run_job(job, "--timeout", "500ms")
        assert stopped.exit_code == ExitCode.TIMEOUT, stopped.envelope
        run_dir = stopped.data["run_dir"]
        moved = tmp_path / "jobs" / "concurrency.yaml"
        moved.parent.mkdir()
        job.rename(moved)
        (moved.parent / "customers.csv").write_bytes((tmp_path / "customers.csv").read_bytes())
        target.set_plan({})

        resumed = run_cli("resume", run_dir, "--config", moved, "--budget", "0")
        assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
        received = target.requests()
        assert len(received) == CSV_ROWS == len({r["body"] for r in received})  # no row sent twice

        again = run_cli("resume", run_dir, "--config", moved)
    assert again.exit_code == ExitCode.PRECONDITION  # the alpha exited 2
    assert again.error_code == "RUN_NOT_RESUMABLE"


# ------------------------------------------------------------------ the alpha's run directories


def test_runs_lists_an_alpha_run_beside_ours(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    with TargetProcess() as target:
        job = example_copy("basic", tmp_path, target.url)
        ours = run_job(job, "--runs-dir", runs_dir)
    assert ours.exit_code == ExitCode.SUCCESS, ours.envelope
    alpha = write_alpha_run(runs_dir, job)

    listed = run_cli("runs", "--runs-dir", runs_dir)
    assert listed.exit_code == ExitCode.SUCCESS, listed.envelope
    by_dir = {run["run_dir"]: run for run in listed.data["runs"]}
    assert set(by_dir) == {str(alpha), ours.data["run_dir"]}
    assert {k: by_dir[str(alpha)][k] for k in ("state", "format", "done", "total", "failed")} == {
        "state": "alpha", "format": "alpha", "done": 2, "total": CSV_ROWS, "failed": 1,
    }  # fmt: skip
    assert (by_dir[ours.data["run_dir"]]["state"], by_dir[ours.data["run_dir"]]["format"]) == (
        "completed",
        "v1",
    )

    exported = run_cli("export", ours.data["run_dir"])  # an alpha sibling does not get in the way
    assert exported.exit_code == ExitCode.SUCCESS, exported.envelope


@pytest.mark.parametrize("command", ["resume", "retry-failed", "export", "status"])
def test_commands_on_an_alpha_run_refuse_and_say_what_to_do(tmp_path: Path, command: str) -> None:
    job = example_copy("basic", tmp_path, ALPHA_BASE)
    alpha = write_alpha_run(tmp_path / "runs", job)
    before = {path.name: path.read_bytes() for path in alpha.iterdir()}

    result = run_cli(command, alpha)
    assert result.exit_code == ExitCode.PRECONDITION, result.envelope
    error = result.envelope["error"]
    assert error["code"] == "RUN_NOT_RESUMABLE"
    assert "public alpha" in error["message"]
    assert error["context"] == {"run_dir": str(alpha), "format": "alpha", "alpha_state": "stopped"}
    assert f"bulkrelay run {job}" in error["suggestion"]
    assert "finish it with the alpha" in error["suggestion"]
    assert {path.name: path.read_bytes() for path in alpha.iterdir()} == before
