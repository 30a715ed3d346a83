"""The steps of a run through the real CLI in a test's directory (its runs in `.bulkrelay/runs`, as a
user's would be): run, stop midway, resume, and what the journal and the target saw.

    job = write_job(tmp_path, target.url, rows=ROWS)  # tests/jobfiles.py: rows POSTed to /items/{id}
    stopped = stop_midway(tmp_path, job)  # against a target with the SLOW plan
    resumed = resume(tmp_path, stopped.data["run_dir"])
    assert_each_row_once(resumed.data["run_dir"], ROWS)
    assert set(sent_ids(target).values()) == {1}
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import yaml

from bulkrelay.envelope import Result
from bulkrelay.errors import ExitCode
from bulkrelay.job.config import load_job
from bulkrelay.ops.launch import RunRequest, run
from bulkrelay.ops.lifecycle import RunOptions
from bulkrelay.relay.progress import Reporter
from bulkrelay.store.journal import read_journal
from bulkrelay.store.runs import default_runs_dir
from tests.clirun import CliResult, run_cli
from tests.targetproc import TargetProcess

ROWS = 150
SLOW = {"rules": [{"delay_ms": 10}]}  # 4 workers: ~400 rows/s, so a 150 ms timeout stops midway


def run_job(cwd: Path, job: Path, *extra: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli("run", job, "--budget", "0", *extra, cwd=cwd, env=env)


def run_job_stdin(cwd: Path, job: Path, data: bytes, *extra: str) -> CliResult:
    return run_cli("run", job, "--input", "-", "--budget", "0", *extra, cwd=cwd, stdin=data)


def run_here(job: Path, reporter: Reporter | None = None) -> Result:
    """`bulkrelay run JOB` in this process (in the current directory, as the command would be)."""
    request = RunRequest(
        job=load_job(job),
        input_path=None,
        from_stdin=False,
        runs_dir=default_runs_dir(None),
        idempotency_key=None,
        options=RunOptions(handle_signals=False),
    )
    return run(request, reporter=reporter)


def stop_midway(cwd: Path, job: Path, *extra: str, env: dict[str, str] | None = None) -> CliResult:
    """Run `job` with a short `--timeout`, so it stops at a safe point with some rows done."""
    result = run_job(cwd, job, "--timeout", "150ms", *extra, env=env)
    assert result.exit_code == ExitCode.TIMEOUT, result.envelope
    assert result.data["state"] == "stopped"
    assert 0 < result.data["progress"]["done"] < result.data["progress"]["total"]
    return result


def resume(
    cwd: Path, run_dir: str | Path, *extra: str | Path, env: dict[str, str] | None = None
) -> CliResult:
    return run_cli("resume", run_dir, "--budget", "0", *extra, cwd=cwd, env=env)


def journal_rows(run_dir: str | Path) -> list[int]:
    return [entry.row_number for entry in read_journal(Path(run_dir) / "results.jsonl")]


def sent_ids(target: TargetProcess) -> Counter[str]:
    """How often the target received each row (the job's URL ends in the row's id)."""
    return Counter(request["path"].rsplit("/", 1)[-1] for request in target.requests())


def assert_each_row_once(run_dir: str | Path, rows: int) -> None:
    assert sorted(journal_rows(run_dir)) == list(range(1, rows + 1))


def rewrite_job(job: Path, **changes: Any) -> None:
    """Change settings in place: `rewrite_job(job, request={"url": ...})` merges one level deep."""
    data = yaml.safe_load(job.read_text())
    for section, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(section), dict):
            data[section].update(value)
        else:
            data[section] = value
    job.write_text(yaml.safe_dump(data, sort_keys=False))


# Answers take 1-6 ms depending on the row, so kills land with requests in flight at the target; the
# target keeps idempotency keys, so a row sent again after a kill takes effect once.
KILL_LOOP_TARGET: dict[str, Any] = {
    "dedup": True,
    "rules": [
        {"match": {"body_contains": "3@"}, "delay_ms": 6},
        {"match": {"body_contains": "7@"}, "delay_ms": 3},
        {"delay_ms": 1},
    ],
}


def assert_each_row_took_effect_once(
    target_saw: tuple[list[dict[str, Any]], dict[str, Any]], journal: Path, rows: int
) -> None:
    """Every row reached the target (`target_saw`: its requests and stats) under one idempotency key,
    the key its journal line holds, and took effect once, however often it was sent."""
    requests, stats = target_saw
    keys_by_row: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        keys_by_row[request["path"].rsplit("/", 1)[-1]].add(request["idempotency_key"])
    assert set(keys_by_row) == {str(n) for n in range(1, rows + 1)}
    assert all(len(keys) == 1 for keys in keys_by_row.values())
    journal_keys = {str(e.row_number): e.idempotency_key for e in read_journal(journal)}
    assert journal_keys == {row: next(iter(keys)) for row, keys in keys_by_row.items()}
    assert stats["effects"] == rows
    assert stats["requests"] == rows + stats["duplicates"]
