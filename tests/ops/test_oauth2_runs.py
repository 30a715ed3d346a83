"""Runs that outlive their OAuth2 token, with real processes: 2-second tokens from the loopback target's
token endpoint, a run of ~10 s at 300 rows/s in the foreground, then in a background job, then across a
kill -9 and a resume; and nowhere on disk or in any output a client secret or a token.

The counts asserted cannot depend on the machine's load: every row ok, no 401 halt, and at most one token
request per refresh interval of the time the endpoint itself saw pass (plus the first, plus one for a
restarted process), as a token is replaced only once it is that old (or refused, which takes older still).
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.journal import read_journal
from bulkrelay.store.rundir import RunDir
from tests.clirun import CliResult, cli_env, run_cli, start_cli
from tests.gatedruns import GATED_JOB
from tests.jobfiles import write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_S, wait_for

SECRET = "client-secret-4f9d2a"
LIFETIME = 2.0  # seconds the target accepts a token
MARGIN = 0.5  # refresh_before_seconds: a token is replaced at 1.5 s
INTERVAL = LIFETIME - MARGIN
RATE = 300


# Every row whose email holds "7@" gets the bearer header it carried echoed back, and captured:
# a target that leaks the token into what the journal keeps.
TARGET_PLAN: dict[str, Any] = {
    "oauth": {"client_id": "sync-client", "client_secret": SECRET, "lifetime_seconds": LIFETIME},
    "rules": [
        {
            "match": {"body_contains": "7@"},
            "echo_header": "Authorization",
            "body": {"id": "x", "seen": "{echo}", "seen_b64": "{echo_b64}"},
        }
    ],
}
pytestmark = [pytest.mark.slow, pytest.mark.target_plan(TARGET_PLAN)]


def _env(tmp_path: Path) -> dict[str, str]:
    return cli_env(CLIENT_ID="sync-client", CLIENT_SECRET=SECRET, BULKRELAY_STATE_DIR=str(tmp_path / "state"))


def _job(tmp_path: Path, target: TargetProcess, rows: int, **more: Any) -> Path:
    return write_job(
        tmp_path,
        target.url,
        rows=rows,
        input={"key": "id"},
        request={
            "auth": {
                "oauth2": {
                    "token_url": f"{target.url}/oauth/token",
                    "client_id": "${CLIENT_ID}",
                    "client_secret": "${CLIENT_SECRET}",
                    "scope": "contacts.write",
                    "client_auth": "basic",
                    "refresh_before_seconds": MARGIN,
                }
            }
        },
        response={"capture": {"seen": "/seen", "seen_b64": "/seen_b64"}},
        execution={"concurrency": 8, "rate_limit": {"requests_per_second": RATE}},
        **more,
    )


def _cli(tmp_path: Path, *args: str | Path) -> CliResult:
    return run_cli(*args, cwd=tmp_path, env=_env(tmp_path), timeout=HANG_S)


def _assert_every_row_ok_once(run_dir: str | Path, rows: int) -> None:
    entries = list(read_journal(Path(run_dir) / "results.jsonl"))
    assert sorted(entry.row_number for entry in entries) == list(range(1, rows + 1))
    assert all(entry.success for entry in entries)
    assert any(entry.captured and entry.captured["seen"] == "Bearer ***" for entry in entries)


def _assert_token_requests_bounded(target: TargetProcess, restarts: int = 0) -> dict[str, Any]:
    oauth: dict[str, Any] = target.stats()["oauth"]
    times = oauth["token_times"]
    span = times[-1] - times[0]
    assert oauth["refused"] == 0 and oauth["unavailable"] == 0
    assert 2 <= oauth["token_requests"] <= span / INTERVAL + 2 + restarts, oauth
    assert oauth["client_auth"]["basic"] == oauth["token_requests"]
    return oauth


def _assert_no_secret_anywhere(
    *places: Path, texts: tuple[str | bytes, ...] = (), secrets: tuple[str, ...] = (SECRET,)
) -> None:
    """Neither a client secret nor any token (the target's all begin `tok-`) in these files or texts."""
    unwanted = [secret.encode() for secret in secrets] + [b"tok-"]
    for text in texts:
        data = text.encode() if isinstance(text, str) else text
        assert not [word for word in unwanted if word in data]
    for place in places:
        files = [place] if place.is_file() else [p for p in place.rglob("*") if p.is_file()]
        assert files, f"nothing to search in {place}"
        for file in files:
            data = file.read_bytes()
            assert not [word for word in unwanted if word in data], file


def test_a_run_longer_than_many_tokens_completes_with_one_token_per_lifetime(
    tmp_path: Path, target: TargetProcess
) -> None:
    rows = 10 * RATE
    job = _job(tmp_path, target, rows)
    log, metrics = tmp_path / "run-log.jsonl", tmp_path / "run.prom"
    result = _cli(tmp_path, "run", job, "--budget", "0", "--log-file", log, "--metrics-file", metrics)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    _assert_every_row_ok_once(result.data["run_dir"], rows)
    oauth = _assert_token_requests_bounded(target)
    assert oauth["issued"] >= 2  # the run outlived its first token
    assert target.stats()["requests"] == rows + oauth["bearer_refusals"]  # a 401 sends its row once more
    assert b"bulkrelay_" in metrics.read_bytes()  # the metrics were written, with every label they carry
    _assert_no_secret_anywhere(
        Path(result.data["run_dir"]), log, metrics, texts=(result.stdout, result.stderr)
    )


def test_a_background_job_fetches_its_own_tokens(tmp_path: Path, target: TargetProcess) -> None:
    rows = 5 * RATE
    job = _job(tmp_path, target, rows)
    metrics = tmp_path / "job.prom"
    front = _cli(tmp_path, "run", job, "--budget", "1s", "--metrics-file", metrics)
    assert front.exit_code == ExitCode.INCOMPLETE, front.envelope
    job_id = front.data["job_id"]
    final = _cli(tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET)
    assert final.exit_code == ExitCode.SUCCESS, final.envelope
    _assert_every_row_ok_once(final.data["run_dir"], rows)
    _assert_token_requests_bounded(target, restarts=1)  # the front's token, then the worker's
    job_dir = tmp_path / "state" / "jobs" / job_id  # spec, status, result and the worker's log
    assert {"spec.json", "status.json", "result.json", "log"} <= {p.name for p in job_dir.iterdir()}
    _assert_no_secret_anywhere(
        Path(final.data["run_dir"]),
        tmp_path / "state",  # the job directory and the index
        metrics,
        texts=(front.stdout, front.stderr, final.stdout, final.stderr),
    )


def test_a_run_killed_9_and_resumed_gets_a_new_token_and_finishes(
    tmp_path: Path, target: TargetProcess
) -> None:
    rows = 5 * RATE
    job = _job(tmp_path, target, rows)
    proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, env=_env(tmp_path), output="discarded")
    runs = tmp_path / ".bulkrelay" / "runs"

    def past_a_token() -> Path | None:  # rows committed after the first token was replaced
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before the kill"
        issued = target.stats()["oauth"]["issued"]
        for run_dir in runs.glob("*/"):
            checkpoint = read_checkpoint(run_dir)
            if checkpoint is not None and checkpoint.rows_done > 0 and issued >= 2:
                return run_dir
        return None

    run_dir = wait_for(past_a_token, "the run to commit rows with its second token", interval=0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(HANG_S) == -signal.SIGKILL
    resumed = _cli(tmp_path, "resume", run_dir, "--budget", "0")
    assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
    _assert_every_row_ok_once(run_dir, rows)
    _assert_token_requests_bounded(target, restarts=1)
    _assert_no_secret_anywhere(run_dir, texts=(resumed.stdout, resumed.stderr))


ROTATED = "client-secret-rotated-7b31c0"
HELD_ROW = 20  # the target answers this row 503 until the secret is rotated: the run cannot end before


def test_a_secret_rotated_mid_run_halts_it_and_a_resume_with_the_new_one_sends_each_row_once(
    tmp_path: Path, target: TargetProcess
) -> None:
    rows = 5 * RATE
    held = {"match": {"body_contains": f"user{HELD_ROW}@"}, "status": 503}
    target.set_plan({**TARGET_PLAN, "rules": [held, *TARGET_PLAN["rules"]]})
    job = _job(tmp_path, target, rows, **GATED_JOB)  # the held row is retried for longer than any wait
    proc = start_cli("run", job, "--budget", "0", cwd=tmp_path, env=_env(tmp_path), output="stdout")

    def held_row_retried() -> bool:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before the secret was rotated"
        answered: int = target.stats()["by_status"].get("503", 0)
        return answered >= 2

    wait_for(held_row_retried, "the held row to be answered 503 twice")
    # The secret rotated: the endpoint forgets its tokens and refuses the old secret; the held row passes.
    target.set_plan({**TARGET_PLAN, "oauth": {**TARGET_PLAN["oauth"], "client_secret": ROTATED}})
    out = proc.communicate(timeout=HANG_S)[0]
    halted = orjson.loads(out)
    assert proc.returncode == ExitCode.AUTH_REQUIRED, halted
    assert halted["error"]["code"] == "TARGET_AUTH_FAILED"
    assert halted["error"]["context"]["error"] == "invalid_client"
    run_dir = Path(halted["error"]["context"]["run_dir"])
    run = RunDir.open(run_dir)
    assert run.manifest.stop_reason == "token_refused" and run.state.resumable
    done = list(read_journal(run_dir / "results.jsonl"))
    assert all(entry.success for entry in done) and HELD_ROW not in {e.row_number for e in done}
    assert target.stats()["oauth"]["refused"] >= 1

    resumed = run_cli(
        "resume", run_dir, "--budget", "0", cwd=tmp_path, env={**_env(tmp_path), "CLIENT_SECRET": ROTATED}
    )
    assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
    _assert_every_row_ok_once(run_dir, rows)
    delivered = Counter(r["path"] for r in target.requests() if 200 <= (r["status"] or 0) < 300)
    assert sorted(delivered.values()) == [1] * rows  # each row taken by the target once, none twice
    others = {r["status"] for r in target.requests() if not 200 <= (r["status"] or 0) < 300}
    assert others <= {401, 503}  # the old token refused, the held row's answers: nothing else
    _assert_no_secret_anywhere(
        run_dir, texts=(out, resumed.stdout, resumed.stderr), secrets=(SECRET, ROTATED)
    )


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "oauth2"


def test_the_example_checks_its_client_then_runs_as_its_readme_says(tmp_path: Path) -> None:
    plan = orjson.loads((EXAMPLE / "target-plan.json").read_bytes())
    with TargetProcess(plan) as server:
        env = cli_env(API_BASE=server.url, CLIENT_ID="demo-client", CLIENT_SECRET="demo-secret")
        checked = run_cli("validate", EXAMPLE / "job.yaml", "--check-auth", cwd=tmp_path, env=env)
        assert checked.exit_code == ExitCode.SUCCESS, checked.envelope
        assert checked.data["auth"]["accepted"] is True
        assert server.stats()["requests"] == 0 and server.stats()["oauth"]["issued"] == 1
        wrong = run_cli(
            "validate",
            EXAMPLE / "job.yaml",
            "--check-auth",
            cwd=tmp_path,
            env={**env, "CLIENT_SECRET": "nope"},
        )
        assert wrong.exit_code == ExitCode.AUTH_REQUIRED and wrong.error_code == "TARGET_AUTH_FAILED"
        assert wrong.envelope["error"]["context"]["error"] == "invalid_client"
        ran = run_cli("run", EXAMPLE / "job.yaml", "--runs-dir", tmp_path / "runs", cwd=tmp_path, env=env)
        assert ran.exit_code == ExitCode.SUCCESS, ran.envelope
        assert ran.data["progress"]["ok"] == 5 and server.stats()["requests"] == 5
        assert b"demo-secret" not in ran.stdout + checked.stdout + wrong.stdout


def test_the_examples_render_shows_its_api_base_and_hides_the_bearer_token() -> None:
    env = cli_env(API_BASE="http://127.0.0.1:8080", CLIENT_ID="demo-client", CLIENT_SECRET="demo-secret")
    result = run_cli("render", EXAMPLE / "job.yaml", "--rows", "1", "--curl", env=env)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    command = result.data["requests"][0]["curl"]
    assert "http://127.0.0.1:8080/crm/v3/contacts/1" in command and "Bearer ***" in command
    assert b"demo-secret" not in result.stdout


def test_each_shard_fetches_its_own_token(tmp_path: Path) -> None:
    plan = {"oauth": {"client_id": "sync-client", "client_secret": SECRET, "lifetime_seconds": 3600}}
    with TargetProcess(plan) as server:
        job = _job(tmp_path, server, rows=40)
        env = _env(tmp_path)
        shards = [
            start_cli(
                "run", job, "--shard", f"{k}/2", "--budget", "0", cwd=tmp_path, env=env, output="stdout"
            )
            for k in (0, 1)
        ]
        outputs = [shard.communicate(timeout=HANG_S)[0] for shard in shards]
        assert [shard.returncode for shard in shards] == [0, 0], outputs
        oauth = server.stats()["oauth"]
        assert oauth["issued"] == 2 and server.stats()["requests"] == 40  # one token a shard, every row once
        assert all(SECRET.encode() not in out and b"tok-" not in out for out in outputs)
