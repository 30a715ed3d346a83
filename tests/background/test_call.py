"""The typed call: every command line becomes one `Call`, a background job keeps it in `spec.json` as the
JSON of its fields and its worker runs the same record read back; a job an earlier version wrote (its
spec has only `argv`) still runs, and a stored call that does not read back is refused naming its field."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from bulkrelay.background import jobs
from bulkrelay.background.call import OPTIONS, Call, ResumeArgs, RetryFailedArgs, RunArgs, call_from_json
from bulkrelay.background.state import BackgroundJob, BackgroundJobSpec
from bulkrelay.cli.parser import parse_call
from bulkrelay.errors import BulkRelayError, ExitCode
from tests.clirun import cli_env, run_cli

# One command line of every command, with options of every kind (paths, lists, numbers, flags).
COMMAND_LINES = [
    ["run", "job.yaml", "--input", "-", "--shard", "1/3", "--budget", "2s", "--metrics-file", "m.prom"],
    ["resume", "latest", "--config", "job.yaml", "--timeout", "5m", "--report", "--runs-dir", "runs"],
    ["retry-failed", "run-1", "--status", "503,504", "--classification", "http_server_error"],
    ["validate", "job.yaml", "--check-auth"],
    ["render", "job.yaml", "--rows", "1-3", "--curl"],
    ["status", "latest"],
    ["shards", "a", "b"],
    ["runs", "--runs-dir", "runs"],
    ["export", "run-1", "run-2", "--failed", "--with-reasons", "--format", "csv", "-o", "-"],
    ["failures", "latest"],
    ["report", "latest", "-o", "page.html"],
    ["prune", "--keep", "3", "--older-than", "30d", "--dry-run"],
    ["completion", "zsh"],
    ["demo", "--rows", "10"],
    ["sync-state", "rebuild", "job.yaml"],
    ["sync-state", "verify", "job.yaml"],
    ["job", "wait", "run-0123456789", "--budget", "1s"],
    ["job", "status", "run-0123456789"],
    ["job", "cancel", "run-0123456789"],
    ["_job-worker", "run-0123456789"],
    ["--quiet", "run", "job.yaml"],
]


def test_every_command_is_a_typed_call_and_reads_back_from_its_stored_form() -> None:
    seen = set()
    for argv in COMMAND_LINES:
        call = parse_call(argv)
        seen.add(call.command)
        assert isinstance(call.options, OPTIONS[call.command])
        stored = orjson.loads(orjson.dumps(call.to_json()))  # as spec.json holds it
        assert call_from_json(stored, call.argv) == call
    assert seen == set(OPTIONS)
    run = parse_call(COMMAND_LINES[0])
    assert run.options == RunArgs(
        job=Path("job.yaml"), input="-", shard="1/3", budget=2000, metrics_file=Path("m.prom")
    )
    assert parse_call(COMMAND_LINES[-1]).quiet


def test_the_invocation_key_leaves_out_what_says_how_long_or_where_to_report(tmp_path: Path) -> None:
    resume = parse_call(["resume", str(tmp_path / "run"), "--runs-dir", str(tmp_path)])
    assert isinstance(resume.options, ResumeArgs)
    assert resume.options.identity() == {
        "config": None,
        "input": None,
        "report": "False",
        "run_dir": str(tmp_path / "run"),
        "runs_dir": str(tmp_path.resolve()),
    }
    bounded = parse_call(["resume", str(tmp_path / "run"), "--runs-dir", str(tmp_path), "--budget", "1s"])
    assert jobs.arguments_key(resume, None) == jobs.arguments_key(bounded, None)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"options": {"run_dir": 7}}, "call.options.run_dir"),
        ({"options": {"run_dir": "r", "budget": "2s"}}, "call.options.budget"),
        ({"options": {"run_dir": "r", "nosuch": 1}}, "call.options.nosuch"),
        ({"options": {}}, "call.options"),
        ({"command": "nosuch"}, "call.command"),
        ({"form": 2}, "call.form"),  # a later version's form: refused, never half read
    ],
)
def test_a_stored_call_that_does_not_read_back_is_refused_naming_the_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, object], field: str
) -> None:
    monkeypatch.setenv("BULKRELAY_STATE_DIR", str(tmp_path))
    spec = BackgroundJobSpec("retry-failed", ("retry-failed", "r"), str(tmp_path), "k" * 32, 0.0)
    background = BackgroundJob.create(spec)
    path = background.path / "spec.json"
    on_disk = orjson.loads(path.read_bytes())
    on_disk["call"] = {**Call("retry-failed", RetryFailedArgs(run_dir="r")).to_json(), **change}
    path.write_bytes(orjson.dumps(on_disk))
    with pytest.raises(BulkRelayError) as refused:
        background.spec()
    assert refused.value.context == {"path": str(path), "field": field}


def _worker_answer(tmp_path: Path, call: Call | None) -> dict[str, object]:
    """A job whose spec holds `call` (None: as an earlier version wrote it, `argv` alone), run by its
    worker, started by hand; its stored final envelope."""
    tmp_path.mkdir()
    state = tmp_path / "state"
    env = cli_env(BULKRELAY_STATE_DIR=str(state))
    spec = BackgroundJobSpec(
        "retry-failed", ("retry-failed", "nosuch-a"), str(tmp_path), "k" * 32, time.time(), call=call
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BULKRELAY_STATE_DIR", str(state))
        background = BackgroundJob.create(spec)
    answer = run_cli("_job-worker", background.job_id, cwd=tmp_path, env=env)
    assert answer.exit_code == ExitCode.NOT_FOUND, answer.envelope
    stored = orjson.loads((background.path / "result.json").read_bytes())
    assert stored["envelope"]["error"] == answer.envelope["error"]
    error: dict[str, object] = stored["envelope"]["error"]
    return error


@pytest.mark.slow
def test_the_worker_runs_the_stored_call_and_an_earlier_version_s_job_by_its_command_line(
    tmp_path: Path,
) -> None:
    typed = Call("retry-failed", RetryFailedArgs(run_dir="nosuch-b"), ("retry-failed", "nosuch-a"))
    # The typed record runs, not its command line: the run it looks for is the call's.
    assert "'nosuch-b'" in str(_worker_answer(tmp_path / "typed", typed)["message"])
    # A spec without `call` (an earlier version's): its argv is parsed again, as that version's worker did.
    assert "'nosuch-a'" in str(_worker_answer(tmp_path / "earlier", None)["message"])
