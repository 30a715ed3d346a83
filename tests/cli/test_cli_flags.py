"""Global flags in any position, `--help` and `--version` as text (envelopes with `--json`), durations in
seconds.

Every command runs through the real CLI (`run_cli`) with its flags after the subcommand, once with the
call budget off and once with one, because a budget sends `run`, `resume` and `retry-failed` through a
background worker that parses the same command line again.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bulkrelay.cli.parser import build_parser
from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, cli_env, run_cli, run_cli_raw
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

_UNKNOWN_JOB = "run-0123456789"


def _failing_row_target() -> TargetProcess:
    return TargetProcess({"rules": [{"match": {"path_contains": "/items/3"}, "status": 503}]})


def _checked(result: CliResult, expected: ExitCode, what: str) -> CliResult:
    assert result.error_code != "USAGE_ERROR", (what, result.envelope)
    assert result.exit_code == expected, (what, result.envelope)
    return result


@pytest.mark.parametrize("budget_ms", ["0", "60000"])
def test_every_command_takes_its_flags_after_the_subcommand(tmp_path: Path, budget_ms: str) -> None:
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"), AGENT_CALL_BUDGET_MS=budget_ms)
    runs = tmp_path / "runs"

    def cli(*args: str | Path) -> CliResult:
        return run_cli(*args, cwd=tmp_path, env=env)

    with _failing_row_target() as target:
        job = write_job(tmp_path, target.url, rows=4)
        _checked(
            cli("validate", job, "--input", tmp_path / "data.csv", "--json"), ExitCode.SUCCESS, "validate"
        )
        _checked(cli("render", job, "--rows", "1-2", "--json"), ExitCode.SUCCESS, "render")
        ran = _checked(
            cli("run", job, "--json", "--runs-dir", runs, "--timeout", "60", "--idempotency-key", "k"),
            ExitCode.PARTIAL_FAILURE,
            "run",
        )
        run_dir = ran.data["run_dir"]
        assert ran.envelope["meta"]["budget_ms"] == int(budget_ms)
        _checked(cli("status", run_dir, "--json"), ExitCode.SUCCESS, "status")
        _checked(cli("runs", "--json", "--runs-dir", runs), ExitCode.SUCCESS, "runs")
        _checked(cli("export", run_dir, "--failed", "--json"), ExitCode.SUCCESS, "export")
        _checked(
            cli(
                "retry-failed", run_dir, "--json", "--classification", "http_server_error", "--timeout", "60"
            ),
            ExitCode.PARTIAL_FAILURE,
            "retry-failed",
        )
        resumed = _checked(
            cli("resume", run_dir, "--json", "--timeout", "60"), ExitCode.PRECONDITION, "resume"
        )
        assert resumed.error_code == "RUN_NOT_RESUMABLE"
    job_id = ran.envelope["meta"].get("job_id", _UNKNOWN_JOB)
    ended, cancelled = (
        (ExitCode.PARTIAL_FAILURE, ExitCode.SUCCESS)  # the run's own code; cancelling an ended job is 0
        if budget_ms != "0"
        else (ExitCode.NOT_FOUND, ExitCode.NOT_FOUND)  # no budget: no job was started
    )
    _checked(cli("job", "status", job_id, "--json"), ended, "job status")
    _checked(cli("job", "wait", job_id, "--json", "--budget", HANG_BUDGET), ended, "job wait")
    _checked(cli("job", "cancel", job_id, "--json"), cancelled, "job cancel")
    _checked(cli("demo", "--rows", "5", "--json", "--runs-dir", runs), ExitCode.SUCCESS, "demo")


def test_global_flags_also_stand_before_the_subcommand(tmp_path: Path) -> None:
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    runs = tmp_path / "runs"
    with _failing_row_target() as target:
        job = write_job(tmp_path, target.url, rows=4)
        ran = run_cli(
            "--json",
            "--runs-dir",
            runs,
            "--budget",
            "30s",
            "--timeout",
            "60",
            "run",
            job,
            cwd=tmp_path,
            env=env,
        )
    assert ran.exit_code == ExitCode.PARTIAL_FAILURE, ran.envelope
    assert ran.envelope["meta"]["budget_ms"] == 30_000
    assert Path(ran.data["run_dir"]).parent == runs
    listed = run_cli("--runs-dir", runs, "runs", cwd=tmp_path, env=env)
    assert [r["run_dir"] for r in listed.data["runs"]] == [ran.data["run_dir"]]


@pytest.mark.parametrize(
    ("argv", "flag", "command"),
    [
        (["--timeout", "5s", "status", "RUN"], "--timeout", "status"),
        (["status", "RUN", "--timeout", "5s"], "--timeout", "status"),
        (["job", "status", "--budget", "5s", _UNKNOWN_JOB], "--budget", "job status"),
        (["job", "status", _UNKNOWN_JOB, "--budget=5s"], "--budget", "job status"),
        (["validate", "job.yaml", "--log-file", "x.log"], "--log-file", "validate"),
    ],
)
def test_a_global_flag_the_command_does_not_take_is_a_usage_error_naming_both(
    tmp_path: Path, argv: list[str], flag: str, command: str
) -> None:
    """In either position: after the subcommand, its value must not pass for a positional."""
    result = run_cli(*argv, cwd=tmp_path)
    assert result.exit_code == ExitCode.ARG_ERROR
    assert result.error_code == "USAGE_ERROR"
    assert result.envelope["error"]["message"] == f"{flag} does not apply to `bulkrelay {command}`"


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["job", "wait", "-h"]])
def test_help_without_a_terminal_is_plain_text_and_an_envelope_with_json(argv: list[str]) -> None:
    proc = run_cli_raw(*argv)
    assert proc.returncode == ExitCode.SUCCESS
    assert proc.stdout.startswith(b"usage: bulkrelay") and b'"ok"' not in proc.stdout
    result = run_cli(*argv, "--json")
    assert result.exit_code == ExitCode.SUCCESS
    assert result.stdout.count(b"\n") == 1
    text = result.data["help"]
    assert text.startswith("usage: bulkrelay")
    assert "_job-worker" not in text
    assert "SUPPRESS" not in text
    assert proc.stdout.decode() == text  # the same text, as it is


def test_help_piped_to_grep_finds_the_flag_as_an_operator_greps_for_it() -> None:
    command = f"{shlex.quote(sys.executable)} -m bulkrelay run --help | grep -e --budget"
    proc = subprocess.run(["sh", "-c", command], capture_output=True, env=cli_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    assert b"--budget DUR" in proc.stdout


def test_version_without_a_terminal_is_plain_text_and_an_envelope_with_json() -> None:
    from bulkrelay._version import __version__

    assert run_cli_raw("--version").stdout == f"bulkrelay {__version__}\n".encode()
    result = run_cli("--version", "--json")
    assert result.exit_code == ExitCode.SUCCESS
    assert result.data == {"name": "bulkrelay", "version": __version__}
    assert orjson.loads(result.stdout) == result.envelope


def test_a_bare_duration_is_seconds_on_every_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "job.yaml", "--timeout", "300"]).timeout == 300_000
    assert parser.parse_args(["run", "job.yaml", "--budget", "2.5"]).budget == 2_500
    assert parser.parse_args(["job", "wait", _UNKNOWN_JOB, "--budget", "20"]).budget == 20_000
    assert parser.parse_args(["run", "job.yaml", "--timeout", "300ms"]).timeout == 300


@pytest.mark.parametrize(
    ("args", "extra_env"),
    [
        (["--budget", "99999999999999999999"], {}),
        (["--timeout", "99999999999999999999"], {}),
        (["--timeout", "36501d"], {}),
        ([], {"AGENT_CALL_BUDGET_MS": "99999999999999999999"}),
    ],
    ids=["budget", "timeout", "timeout-days", "budget-env"],
)
def test_a_duration_beyond_the_longest_is_a_usage_error_with_its_envelope(
    tmp_path: Path, args: list[str], extra_env: dict[str, str]
) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=2)  # nothing may be sent: port 9 is discard
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"), **extra_env)
    result = run_cli("run", job, *args, cwd=tmp_path, env=env)
    assert result.exit_code == ExitCode.ARG_ERROR, (result.envelope, result.stderr)
    assert result.error_code == "USAGE_ERROR"
    assert "36500d" in result.envelope["error"]["message"]
    assert not (tmp_path / ".bulkrelay" / "runs").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["prune", "--keep", "99999999999999999999", "--dry-run"],
        ["prune", "--keep", "0"],
        ["demo", "--rows", "0"],
        ["demo", "--rows", "99999999999999999999"],  # would write rows until the disk is full
        ["run", "job.yaml", "--shards", "99999999999999999999"],
        ["prune", "--keep", "\u00b2", "--dry-run"],  # str.isdigit takes it, int() refuses it
        ["demo", "--rows", "9" * 5000],  # so does int() a number this long
    ],
    ids=[
        "keep-huge",
        "keep-zero",
        "demo-none",
        "demo-huge",
        "shards-huge",
        "keep-superscript",
        "rows-5000-digits",
    ],
)
def test_a_count_out_of_its_range_is_a_usage_error_naming_the_flag(tmp_path: Path, args: list[str]) -> None:
    result = run_cli(*args, cwd=tmp_path, env=cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state")))
    assert result.exit_code == ExitCode.ARG_ERROR, (result.envelope, result.stderr)
    assert result.error_code == "USAGE_ERROR"
    flag = next(arg for arg in args if arg.startswith("--") and arg != "--dry-run")
    assert result.envelope["error"]["message"].startswith(f"{flag}: expected a whole number from 1 to ")
    assert not (tmp_path / ".bulkrelay").exists()  # the demo wrote nothing


def test_the_demo_counts_its_rejections_in_words_and_exits_0_for_the_planned_ones(tmp_path: Path) -> None:
    env = cli_env(BULKRELAY_STATE_DIR=str(tmp_path / "state"))
    shown = run_cli_raw("demo", "--rows", "5", "--human", cwd=tmp_path, env=env)
    text = shown.stdout.decode()
    assert shown.returncode == ExitCode.SUCCESS, text
    assert "rejected 1 row on purpose" in text
    (run_dir,) = (tmp_path / ".bulkrelay" / "runs").glob("2*")
    assert (run_dir / "run.log").is_file()  # like any run's: `bulkrelay report latest` has its series
