"""The credentials a Redis URL can carry never reach an envelope, `status` or a run's files, and the URL
may come from the environment as a secret (`shared: "${REDIS_URL}"`): real runs against a redis-server
that requires a password (issue 22.12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, cli_env, run_cli
from tests.redisproc import RedisProcess
from tests.taggedjobs import write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow

PASSWORD = "hunter2-redis-secret"
WRONG = "wrong-redis-secret"
FORMS = [
    "redis://:{pw}@127.0.0.1:{port}/0",
    "redis://default:{pw}@127.0.0.1:{port}/0",
    "redis://127.0.0.1:{port}/0?password={pw}",
    "redis://127.0.0.1:{port}/0?username=default&password={pw}",
    "redis://127.0.0.1:{port}/0?db=0&password={pw}",
    "redis://127.0.0.1:{port}/0?ssl_cert_reqs=none&password={pw}",  # an option redis:// refuses
]


def _shared(url: str) -> dict[str, object]:
    return {"concurrency": 2, "rate_limit": {"requests_per_second": 200, "shared": url}}


def _leaks(result: CliResult, run_dir: Path | None, secret: str) -> list[str]:
    """Where `secret` shows: the call's output, and every file of its run."""
    outputs = {"stdout": result.stdout.decode(), "stderr": result.stderr}
    found = [name for name, text in outputs.items() if secret in text]
    if run_dir is not None:
        found += [str(f) for f in run_dir.iterdir() if f.is_file() and secret.encode() in f.read_bytes()]
    return found


def test_a_refused_password_in_any_form_is_never_shown(tmp_path: Path) -> None:
    with RedisProcess(password=PASSWORD) as live, TargetProcess() as target:
        port = live.rsplit(":", 1)[1].split("/")[0]
        halts = []
        for n, form in enumerate(FORMS):
            job = write_job(tmp_path, target.url, rows=4, execution=_shared(form.format(pw=WRONG, port=port)))
            halts.append(
                run_cli("run", job, "--budget", "0", "--runs-dir", tmp_path / f"runs-{n}", cwd=tmp_path)
            )
        assert target.stats()["requests"] == 0
    for halted in halts:
        assert halted.exit_code == ExitCode.UNAVAILABLE, halted.envelope
        assert halted.error_code == "SHARED_LIMIT_UNAVAILABLE"
        assert "***" in halted.envelope["error"]["context"]["limiter"]  # the server named, not its secret
        assert _leaks(halted, Path(halted.data["run_dir"]), WRONG) == []


def test_a_working_password_in_the_query_is_never_shown(tmp_path: Path) -> None:
    with RedisProcess(password=PASSWORD) as live, TargetProcess() as target:
        port = live.rsplit(":", 1)[1].split("/")[0]
        job = write_job(
            tmp_path, target.url, rows=4, execution=_shared(FORMS[3].format(pw=PASSWORD, port=port))
        )
        done = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        status = run_cli("status", done.data["run_dir"], cwd=tmp_path)
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    assert _leaks(done, Path(done.data["run_dir"]), PASSWORD) == [] and _leaks(status, None, PASSWORD) == []


def test_the_redis_url_may_be_a_secret_from_the_environment(tmp_path: Path) -> None:
    with RedisProcess(password=PASSWORD) as live, TargetProcess() as target:
        url = live.replace("redis://", f"redis://:{PASSWORD}@")
        job = write_job(tmp_path, target.url, rows=6, execution=_shared("${REDIS_URL}"))
        missing = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        assert target.stats()["requests"] == 0
        done = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(REDIS_URL=url))
        sent = target.stats()["effects"]
    assert missing.exit_code == ExitCode.PRECONDITION, missing.envelope
    assert missing.error_code == "SECRET_MISSING"
    assert "REDIS_URL" in missing.envelope["error"]["message"]
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    assert sent == 6
    assert _leaks(done, Path(done.data["run_dir"]), PASSWORD) == []


def test_a_secret_redis_url_is_named_by_its_variable_never_shown(tmp_path: Path) -> None:
    gone = RedisProcess()
    url = gone.__enter__().replace("redis://", f"redis://:{PASSWORD}@")
    gone.kill()
    try:
        with TargetProcess() as target:
            job = write_job(tmp_path, target.url, rows=2, execution=_shared("${REDIS_URL}"))
            halted = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(REDIS_URL=url))
    finally:
        gone.__exit__(None, None, None)
    assert halted.exit_code == ExitCode.UNAVAILABLE, halted.envelope
    assert halted.envelope["error"]["context"]["limiter"] == "${REDIS_URL}"
    assert _leaks(halted, Path(halted.data["run_dir"]), PASSWORD) == []


def test_a_secret_that_is_no_redis_url_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=2, execution=_shared("${REDIS_URL}"))
        refused = run_cli(
            "run", job, "--budget", "0", cwd=tmp_path, env=cli_env(REDIS_URL="http://x:hunter2-not@h")
        )
        assert target.stats()["requests"] == 0
    assert refused.exit_code == ExitCode.PRECONDITION, refused.envelope
    assert refused.error_code == "SECRET_INVALID"
    assert "REDIS_URL" in refused.envelope["error"]["message"]
    assert "hunter2-not" not in refused.stdout.decode() + refused.stderr


@pytest.mark.parametrize("separator", ["/", "?", "#"])
def test_a_secret_redis_url_whose_password_is_not_percent_encoded_is_refused_unshown(
    tmp_path: Path, separator: str
) -> None:
    # Before: redis-py read the password's first part as the port, the halt's cause said "Port could not
    # be cast to integer value as 's3cr'", in the envelope and run.log, behind a limiter named ${REDIS_URL}
    url = f"redis://:s3cr{separator}hunter2@127.0.0.1:6379/0"
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=2, execution=_shared("${REDIS_URL}"))
        refused = run_cli("run", job, "--budget", "0", cwd=tmp_path, env=cli_env(REDIS_URL=url))
        assert target.stats()["requests"] == 0
    assert refused.exit_code == ExitCode.PRECONDITION, refused.envelope
    assert refused.error_code == "SECRET_INVALID"
    assert "REDIS_URL" in refused.envelope["error"]["message"]
    assert "percent-encoded" in refused.envelope["error"]["message"]
    assert _leaks(refused, None, "s3cr") == [] and _leaks(refused, None, "hunter2") == []
