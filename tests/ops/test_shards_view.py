"""Shards of one job (`run --shard K/N`) against one loopback target, sharing one rate limit in a real
redis-server: every row once across shards, the limit kept by all together, a killed shard resumed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.relay.ratelimit import most_in_window
from bulkrelay.store.journal import read_journal
from tests.clirun import CliResult, cli_env, run_cli
from tests.redisproc import RedisProcess, ScriptCountingProxy
from tests.taggedjobs import write_job
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

SHARDS = 4
KEYED: dict[str, Any] = {
    "input": {"key": "id"},
    "request": {"idempotency_key": {"header": "Idempotency-Key"}},
}


def _shared(redis_url: str, rate: int) -> dict[str, object]:
    return {"concurrency": 4, "rate_limit": {"requests_per_second": rate, "shared": redis_url}}


def _shard_command(job: Path, k: int) -> list[str]:
    runs = job.parent / f"runs-{k}"
    shard = ["--shard", f"{k}/{SHARDS}", "--budget", "0", "--runs-dir", str(runs)]
    return [sys.executable, "-m", "bulkrelay", "run", str(job), *shard]


def _start_shards(job: Path) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            _shard_command(job, k),
            cwd=job.parent,
            env=cli_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for k in range(SHARDS)
    ]


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, dict[str, object]]:
    out, _ = proc.communicate(timeout=180)
    return proc.returncode, orjson.loads(out)


def _ids(target: TargetProcess) -> Counter[int]:
    return Counter(int(orjson.loads(r["body"])["id"]) for r in target.requests() if r["status"] == 200)


def test_four_shards_send_every_row_once_within_one_shared_limit(tmp_path: Path) -> None:
    rate, rows = 40, 160
    with RedisProcess() as redis_url, TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=rows, execution=_shared(redis_url, rate), **KEYED)
        results = [_finish(proc) for proc in _start_shards(job)]
        arrivals = sorted(r["t"] for r in target.requests())
        sent = _ids(target)
    assert [code for code, _ in results] == [ExitCode.SUCCESS] * SHARDS, results
    assert sent == Counter(range(1, rows + 1))  # every row once, across all the shards
    totals = [envelope["data"]["summary"]["rows_total"] for _, envelope in results]  # type: ignore[index]
    assert sum(totals) == rows and all(total > 0 for total in totals)
    # Four processes, one limit: arrivals over any 0.9 s window (jitter on the way allowed) stay within it.
    assert most_in_window(arrivals, 0.9) <= rate + 1
    assert len(arrivals) == rows


def test_twelve_shards_each_owning_few_rows_send_every_row_once(tmp_path: Path) -> None:
    """A shard that owns few rows has just them read again, by line (job/positions.py)."""
    rows, count = 240, 12
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=rows, **KEYED)
        totals = []
        for k in range(count):
            result = run_cli("run", job, "--shard", f"{k}/{count}", "--budget", "0", cwd=tmp_path)
            assert result.exit_code == ExitCode.SUCCESS, result.envelope
            totals.append(result.data["summary"]["rows_total"])
        sent = _ids(target)
    assert sent == Counter(range(1, rows + 1))
    assert sum(totals) == rows and all(total > 0 for total in totals)


def test_a_killed_shard_runs_again_and_loses_nothing(tmp_path: Path) -> None:
    rows = 120
    plan = {"dedup": True, "rules": [{"delay_ms": 20}]}
    with RedisProcess() as redis_url, TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, rows=rows, execution=_shared(redis_url, 60), **KEYED)
        procs = _start_shards(job)
        victim = procs[1]
        journal = _wait_for_journal(tmp_path / "runs-1", lines=5, proc=victim)
        victim.send_signal(signal.SIGKILL)
        victim.communicate()  # reaps it and closes its pipe
        others = [_finish(proc) for k, proc in enumerate(procs) if k != 1]
        again = run_cli(*_shard_command(job, 1)[3:], cwd=tmp_path, timeout=180)
        stats = target.stats()
    assert [code for code, _ in others] == [ExitCode.SUCCESS] * (SHARDS - 1)
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert Path(again.data["run_dir"]) == journal.parent  # the identical command continued its own run
    assert stats["effects"] == rows  # each row took effect once, the killed shard's in-flight rows too
    shards = _shards_view(tmp_path)
    assert shards.data["complete"] is True
    assert shards.data["total"]["done"] == rows == shards.data["total"]["total"]
    run_dirs = [row["run_dir"] for row in shards.data["shards"]]
    joined = run_cli("export", *run_dirs, "--format", "jsonl", "-o", tmp_path / "all.jsonl", cwd=tmp_path)
    assert joined.exit_code == ExitCode.SUCCESS, joined.envelope
    exported = [orjson.loads(line) for line in (tmp_path / "all.jsonl").read_bytes().splitlines()]
    assert len(exported) == rows and all(e["result"]["success"] for e in exported)  # each row's result found


def _wait_for_journal(runs_dir: Path, *, lines: int, proc: subprocess.Popen[bytes]) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for journal in runs_dir.glob("2*/results.jsonl"):
            if sum(1 for _ in read_journal(journal)) >= lines:
                return journal
        assert proc.poll() is None, "the shard ended before it could be killed"
        time.sleep(0.01)
    raise AssertionError("the shard committed nothing in time")


def _shards_view(tmp_path: Path) -> CliResult:
    result = run_cli("shards", *(tmp_path / f"runs-{k}" for k in range(SHARDS)), cwd=tmp_path)
    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    return result


def test_without_redis_a_shard_halts_unavailable_and_continues_once_it_is_back(tmp_path: Path) -> None:
    redis = RedisProcess()
    redis_url = redis.__enter__()
    redis.kill()  # a Redis that is gone: the port refuses
    try:
        with TargetProcess() as target:
            job = write_job(tmp_path, target.url, rows=12, execution=_shared(redis_url, 50), **KEYED)
            halted = run_cli(*_shard_command(job, 0)[3:], cwd=tmp_path)
            assert target.stats()["requests"] == 0  # never a local fallback
            assert halted.exit_code == ExitCode.UNAVAILABLE, halted.envelope
            assert halted.error_code == "SHARED_LIMIT_UNAVAILABLE"
            assert halted.data["state"] == "stopped"
            with RedisProcess() as live_url:
                job.write_text(job.read_text().replace(redis_url, live_url))  # operational: same run
                again = run_cli(*_shard_command(job, 0)[3:], cwd=tmp_path)
    finally:
        redis.__exit__(None, None, None)
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_dir"] == halted.data["run_dir"]


def test_a_shard_is_part_of_the_invocation(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=30, **KEYED)
        runs = tmp_path / "runs"
        first = run_cli("run", job, "--shard", "0/2", "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
        second = run_cli("run", job, "--shard", "1/2", "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
        sent = _ids(target)
        bad = run_cli("run", job, "--shard", "2/2", "--budget", "0", "--runs-dir", runs, cwd=tmp_path)
    assert (first.exit_code, second.exit_code) == (ExitCode.SUCCESS, ExitCode.SUCCESS)
    assert first.data["run_dir"] != second.data["run_dir"]  # two shards, two runs, in one runs dir
    assert sent == Counter(range(1, 31))
    assert bad.exit_code == ExitCode.ARG_ERROR and "does not exist" in bad.envelope["error"]["message"]
    manifest = orjson.loads((Path(first.data["run_dir"]) / "run.json").read_bytes())
    assert manifest["shard"] == {"index": 0, "count": 2}


_BAD_SHARDS = [
    (["--shard", "9/4"], {}, "--shard"),
    (["--shard=-1/4"], {}, "--shard"),
    (["--shard", "0/0"], {}, "--shard"),
    (["--shard", "a/b"], {}, "--shard"),
    ([], {"BULKRELAY_SHARD": "4/4"}, "BULKRELAY_SHARD"),
    (["--shards", "4"], {"JOB_COMPLETION_INDEX": "7"}, "JOB_COMPLETION_INDEX"),
    (["--shards", "4"], {"JOB_COMPLETION_INDEX": "x"}, "'x'"),
    (["--shards", "4"], {}, "JOB_COMPLETION_INDEX"),
    ([], {"BULKRELAY_SHARDS": "0", "JOB_COMPLETION_INDEX": "0"}, "BULKRELAY_SHARDS"),
    ([], {"BULKRELAY_SHARDS": "four", "JOB_COMPLETION_INDEX": "0"}, "BULKRELAY_SHARDS"),
]


@pytest.mark.parametrize(("flags", "env", "named"), _BAD_SHARDS)
def test_a_bad_shard_is_refused_before_any_input_is_read(
    tmp_path: Path, flags: list[str], env: dict[str, str], named: str
) -> None:
    # Before, a run under a call budget (the default without a terminal) copied all of stdin first and
    # only then looked at the shard: a typo cost a full read, and an unreadable stdin hid the mistake.
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=1)
    write_only = tmp_path / "write-only"
    with write_only.open("wb") as unreadable:  # stdin whose first read fails (EBADF)
        proc = subprocess.run(
            [sys.executable, "-m", "bulkrelay", "run", str(job), "--input", "-", "--budget", "60s", *flags],
            cwd=tmp_path,
            env=cli_env(**env),
            stdin=unreadable,
            capture_output=True,
            timeout=120,
            check=False,
        )
    error = orjson.loads(proc.stdout)["error"]
    assert (proc.returncode, error["code"]) == (ExitCode.ARG_ERROR, "USAGE_ERROR"), error
    assert named in error["message"], error


@pytest.mark.slow
def test_a_hung_redis_halts_a_busy_shard_unavailable_and_the_same_command_finishes_it(tmp_path: Path) -> None:
    """Redis stopped (SIGSTOP) under a shard with 24 workers: one question runs out of its deadline and the
    shard halts with exit 12, instead of each worker asking the hung server in turn, for a socket timeout
    and redis-py's retries each (issue 22.10). A proxy in front of Redis counts the questions."""
    rows = 200
    redis = RedisProcess()
    redis_url = redis.__enter__()
    proxy = ScriptCountingProxy(redis_url)
    try:
        with TargetProcess({"dedup": True}) as target:
            execution = {
                "concurrency": 24,
                "rate_limit": {"requests_per_second": 50, "shared": proxy.__enter__()},
            }
            job = write_job(tmp_path, target.url, rows=rows, execution=execution, **KEYED)
            proc = subprocess.Popen(
                _shard_command(job, 0),
                cwd=tmp_path,
                env=cli_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            _wait_for_journal(tmp_path / "runs-0", lines=5, proc=proc)
            redis.hang()
            asked_before = proxy.questions
            code, halted = _finish(proc)
            asked_while_hung = proxy.questions - asked_before
            redis.wake()
            again = run_cli(*_shard_command(job, 0)[3:], cwd=tmp_path)
            stats = target.stats()
    finally:
        redis.wake()
        proxy.__exit__(None, None, None)
        redis.__exit__(None, None, None)
    assert code == ExitCode.UNAVAILABLE, halted
    assert halted["error"]["code"] == "SHARED_LIMIT_UNAVAILABLE"  # type: ignore[index]
    assert halted["data"]["state"] == "stopped"  # type: ignore[index]
    # One question (the one in flight when Redis stopped, and redis-py's one reconnect), not one a worker.
    assert asked_while_hung <= 3, asked_while_hung
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_dir"] == halted["data"]["run_dir"]  # type: ignore[index]
    owned = again.data["summary"]["rows_total"]  # shard 0 of 4's rows
    assert stats["effects"] == owned == again.data["summary"]["rows_done"]  # each once, across the halt
