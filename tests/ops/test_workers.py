"""One run in several worker processes (`execution.workers`), with real processes and a real target:
one journal with every row once, one summary, stops that reach every worker, a halt in one worker
that stops the others, and a worker killed that ends the run resumable."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.relay.runahead import run_ahead_rows
from bulkrelay.store.journal import read_journal
from tests.clirun import run_cli
from tests.jobfiles import make_rows, write_job
from tests.runsteps import assert_each_row_once, resume, sent_ids
from tests.spawnedruns import finish, start_run
from tests.targetproc import TargetProcess
from tests.waiting import wait_for
from tests.workerprocs import kill_9, wait_for_workers, wait_until_gone

pytestmark = pytest.mark.slow  # real processes: outside the fast lane

ROWS = 1200  # against a target answering in 20 ms: 4 s or more, time to act on a run midway
KEYED: dict[str, Any] = {
    "input": {"key": "id"},
    "request": {"idempotency_key": {"header": "Idempotency-Key"}},
}


def _job(tmp_path: Path, url: str, rows: int, workers: int, **execution: Any) -> Path:
    return write_job(
        tmp_path, url, rows=rows, **KEYED, execution={"concurrency": 6, "workers": workers, **execution}
    )


def _committed_rows(job: Path) -> int:
    journals = list((job.parent / "runs").glob("2*/results.jsonl"))
    return 0 if not journals else sum(1 for _ in read_journal(journals[0]))


def _relaying(job: Path, workers: int) -> tuple[subprocess.Popen[bytes], list[int]]:
    """`job` run in a process of its own, once its workers have committed rows: it and their pids."""
    proc = start_run(job)
    pids = wait_for_workers(proc, workers)
    wait_for(lambda: _committed_rows(job) >= 50, "the first committed rows")
    return proc, pids


def _resumed_to_the_end(tmp_path: Path, run_dir: str | Path, target: TargetProcess) -> None:
    done = resume(tmp_path, run_dir)
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    assert_each_row_once(run_dir, ROWS)
    assert target.stats()["effects"] == ROWS


@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 1}]})
def test_a_run_in_three_workers_journals_every_row_once_in_one_run(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = _job(tmp_path, target.url, 600, 3)

    result = run_cli("run", job, "--budget", "0", cwd=tmp_path)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    run_dir = Path(result.data["run_dir"])
    assert_each_row_once(run_dir, 600)
    assert Counter(sent_ids(target).values()) == {1: 600}  # every row reached the target once
    summary = result.data["summary"]
    assert summary["rows_done"] == 600 and summary["requests"]["sent"] == 600  # the workers' requests
    logs = sorted(path.name for path in (run_dir / "workers").iterdir())
    assert logs == ["worker-0.log", "worker-1.log", "worker-2.log"]
    assert all((run_dir / "workers" / name).read_bytes() == b"" for name in logs)  # nothing went wrong


@pytest.mark.target_plan({"dedup": True, "rules": [{"match": {"path_contains": "/57"}, "status": 401}]})
def test_a_halt_in_one_worker_stops_every_worker_and_the_run_resumes(
    tmp_path: Path, target: TargetProcess
) -> None:
    # Row 57 halts its worker at once; the other's 600 rows take 6 s at its 100 a second, far longer
    # than the stop takes to reach it, however busy the machine.
    job = _job(tmp_path, target.url, ROWS, 2, rate_limit={"requests_per_second": 200})

    halted = run_cli("run", job, "--budget", "0", cwd=tmp_path)

    assert halted.exit_code == ExitCode.AUTH_REQUIRED, halted.envelope
    assert halted.error_code == "TARGET_AUTH_FAILED"
    assert halted.data["state"] == "stopped" and halted.data["progress"]["done"] < ROWS
    target.set_plan({"dedup": True})
    done = resume(tmp_path, halted.data["run_dir"])
    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    assert_each_row_once(halted.data["run_dir"], ROWS)
    assert target.stats()["effects"] == ROWS


@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 20}]})
@pytest.mark.parametrize(
    ("signum", "to_all", "ending"),
    [
        (signal.SIGTERM, False, (ExitCode.SIGTERM, "TERMINATED")),  # `kill PID`, a scheduler's stop
        (signal.SIGHUP, False, (ExitCode.SIGTERM, "TERMINATED")),  # the terminal closed
        (signal.SIGINT, True, (ExitCode.SIGINT, "INTERRUPTED")),  # Ctrl+C: a terminal signals the group
    ],
    ids=["sigterm-to-the-parent", "sighup-to-the-parent", "sigint-to-every-process"],
)
def test_a_signal_stops_every_worker_at_a_safe_point(
    tmp_path: Path, target: TargetProcess, signum: int, to_all: bool, ending: tuple[ExitCode, str]
) -> None:
    proc, workers = _relaying(_job(tmp_path, target.url, ROWS, 2), 2)

    for pid in [proc.pid, *(workers if to_all else [])]:
        os.kill(pid, signum)
    stopped = finish(proc)

    assert (stopped.exit_code, stopped.error_code) == ending, stopped.envelope
    assert f"stopped by {signal.Signals(signum).name} at a safe point" in stopped.envelope["error"]["message"]
    wait_until_gone(workers)
    _resumed_to_the_end(tmp_path, stopped.data["run_dir"], target)


@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 20}]})
def test_a_worker_killed_ends_the_run_worker_lost_and_resume_finishes_it(
    tmp_path: Path, target: TargetProcess
) -> None:
    proc, workers = _relaying(_job(tmp_path, target.url, ROWS, 3), 3)

    kill_9(workers[1])
    lost = finish(proc)

    assert lost.exit_code == ExitCode.GENERAL_ERROR, lost.envelope
    assert lost.error_code == "WORKER_LOST"
    assert lost.envelope["error"]["context"]["exit_status"] == -signal.SIGKILL
    assert lost.data["state"] == "stopped" and lost.envelope["error"]["suggestion"].startswith(
        "bulkrelay resume"
    )
    wait_until_gone(workers)  # the other workers stopped too
    _resumed_to_the_end(tmp_path, lost.data["run_dir"], target)


@pytest.mark.target_plan({"dedup": True, "rules": [{"delay_ms": 20}]})
def test_a_parent_killed_takes_its_workers_with_it(tmp_path: Path, target: TargetProcess) -> None:
    job = _job(tmp_path, target.url, ROWS, 2)
    proc, workers = _relaying(job, 2)

    kill_9(proc.pid)
    proc.communicate()  # its pipes closed

    wait_until_gone(workers)
    _resumed_to_the_end(tmp_path, next((job.parent / "runs").glob("2*")), target)


@pytest.mark.target_plan({"dedup": True})
def test_the_workers_flag_overrides_the_job_and_a_background_job_keeps_it(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = _job(tmp_path, target.url, 200, 1)

    handed = run_cli("run", job, "--workers", "2", "--budget", "1ms", cwd=tmp_path)  # a background job
    done = run_cli("job", "wait", handed.envelope["meta"]["job_id"], "--budget", "0", cwd=tmp_path)

    assert done.exit_code == ExitCode.SUCCESS, done.envelope
    run_dir = Path(done.data["run_dir"])
    assert sorted(path.name for path in (run_dir / "workers").iterdir()) == ["worker-0.log", "worker-1.log"]
    assert_each_row_once(run_dir, 200)


@pytest.mark.target_plan({"dedup": True})
def test_the_rate_limit_is_the_whole_runs_across_its_workers(tmp_path: Path, target: TargetProcess) -> None:
    job = _job(tmp_path, target.url, 120, 3, rate_limit={"requests_per_second": 30})

    result = run_cli("run", job, "--budget", "0", cwd=tmp_path)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    # Three workers at 10 a second each: the run's 30, never three times it. The elapsed time is the
    # exact check (120 rows at 30 a second cannot end before 3 s; at 90 they would in 1.3). Arrivals are
    # starts plus a loopback trip that a busy machine stretches, so a second's arrivals may hold starts
    # of the second before: at most two seconds' worth while a trip takes under a second (at three
    # times the rate, the first second alone would see 90).
    assert result.data["summary"]["this_call"]["elapsed_seconds"] >= 3.0
    assert target.stats()["max_arrivals_in_any_second"] <= 2 * 30


@pytest.mark.parametrize("command", ["run", "resume", "retry-failed"])
def test_workers_flag_for_a_batch_job_is_refused_before_anything_is_sent(
    tmp_path: Path, target: TargetProcess, command: str
) -> None:
    """The job file's `execution.workers: 2` is refused for a batch job; `--workers 2` was taken and the
    job run in one process without a word."""
    batch = {"max_items": 5, "item": {"id": {"from": "id"}}}
    request = {"url": f"{target.url}/batch", "json": None, "batch": batch}
    job = write_job(tmp_path, target.url, 20, request=request)
    target.set_plan({"rules": [{"status": 422}]})
    # a run for resume (stopped at its limit) and retry-failed (its first batch refused)
    first = run_cli("run", job, "--budget", "0", "--limit", "5", cwd=tmp_path)
    assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
    sent = target.stats()["requests"]
    args: list[str | Path] = ["run", job] if command == "run" else [command, first.data["run_dir"]]

    refused = run_cli(*args, "--workers", "2", "--budget", "0", cwd=tmp_path)

    assert refused.exit_code == ExitCode.ARG_ERROR, refused.envelope
    assert "--workers 2" in refused.envelope["error"]["message"]
    assert "request.batch" in refused.envelope["error"]["message"]
    assert target.stats()["requests"] == sent
    auto = run_cli(*args, "--workers", "auto", "--budget", "0", cwd=tmp_path)
    assert auto.exit_code != ExitCode.ARG_ERROR, auto.envelope


def _rows_marked(count: int, marked: Callable[[int], bool]) -> list[dict[str, str]]:
    """Rows whose id ends `-bad` where `marked(row number)`, for a rule matching `path_contains`."""
    rows = make_rows(count)
    for number, row in enumerate(rows, 1):
        if marked(number):
            row["id"] += "-bad"
    return rows


UNEVEN_FAILURES: dict[str, tuple[Callable[[int], bool], dict[str, Any]]] = {
    # 10% of the rows fail, all of them worker 1's: 20% of its rows
    "failure-rate": (
        lambda n: n % 10 == 0,
        {
            "plan": {"rules": [{"match": {"path_contains": "-bad"}, "status": 422}]},
            "halt": {"failure_rate": {"above": 0.15, "after_rows": 50}},
            "retry": {},
        },
    ),
    # every odd row fails: a streak of worker 0's rows, broken by every even row in row order
    "consecutive-failures": (
        lambda n: n % 2 == 1,
        {
            "plan": {"rules": [{"match": {"path_contains": "-bad"}, "status": 503}]},
            "halt": {"consecutive_failures": 20},
            "retry": {"max_attempts": 1},
        },
    ),
}


@pytest.mark.parametrize("case", UNEVEN_FAILURES)
@pytest.mark.parametrize("workers", [1, 2])
def test_halts_judge_the_whole_calls_rows_whatever_the_workers(
    tmp_path: Path, case: str, workers: int
) -> None:
    """Failures that fall unevenly on the workers' rows halt neither one process nor two: the halt
    rules count the call's rows in row order, not each worker's own."""
    marked, setting = UNEVEN_FAILURES[case]
    with TargetProcess(setting["plan"]) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=_rows_marked(400, marked),
            **KEYED,
            execution={"workers": workers},
            halt=setting["halt"],
            retry=setting["retry"],
        )
        ran = run_cli("run", job, "--budget", "0", cwd=tmp_path)

    assert (ran.exit_code, ran.error_code) == (ExitCode.PARTIAL_FAILURE, "PARTIAL_FAILURE"), ran.envelope
    assert ran.data["summary"]["by_outcome"]["failed"] == sum(map(marked, range(1, 401)))


@pytest.mark.parametrize(
    ("plan", "halt", "retry", "ending"),
    [
        (
            {"rules": [{"status": 422}]},
            {"failure_rate": {"above": 0.2, "after_rows": 50}},
            {},
            (ExitCode.PARTIAL_FAILURE, "FAILURE_RATE_EXCEEDED"),
        ),
        (
            {"rules": [{"status": 503}]},
            {"consecutive_failures": 20},
            {"max_attempts": 1},
            (ExitCode.UNAVAILABLE, "TARGET_UNAVAILABLE"),
        ),
    ],
    ids=["failure-rate", "consecutive-failures"],
)
def test_a_halt_with_workers_is_the_runs_as_one_process_judges_it(
    tmp_path: Path, plan: dict[str, Any], halt: dict[str, Any], retry: dict[str, Any], ending: tuple[int, str]
) -> None:
    """With workers the halt counts the call's rows: the failure rate fires at the 50th row in row
    order, as one process's does, and neither halt names a worker."""
    with TargetProcess(plan) as target:
        job = write_job(
            tmp_path, target.url, rows=400, **KEYED, execution={"workers": 2}, halt=halt, retry=retry
        )
        halted = run_cli("run", job, "--budget", "0", cwd=tmp_path)

    assert (halted.exit_code, halted.error_code) == ending, halted.envelope
    error = halted.envelope["error"]
    assert "worker" not in error["context"] and "worker" not in error["message"], error
    if "failure_rate" in halt:
        assert (error["context"]["rows"], error["context"]["failed"], error["context"]["row"]) == (50, 50, 50)
        assert error["message"].startswith("run ") and "50 of 50 rows failed" in error["message"], error
    else:
        assert error["context"]["consecutive_failures"] == 20


def test_no_worker_runs_far_ahead_of_a_slow_one(tmp_path: Path) -> None:
    """Worker 1's row 2 hangs at the target: worker 0 (and worker 1's other slots) go on only up to the
    run-ahead bound past it (relay/runahead.py), so the results the parent holds for the halt rules,
    and the rows a kill -9 would leave in doubt, stay bounded. Released, the run ends with every row."""
    rows = _rows_marked(6000, lambda n: n == 2)
    bound = run_ahead_rows(8)
    plan = {"rules": [{"match": {"path_contains": "-bad"}, "delay_ms": 120_000}]}
    with TargetProcess(plan) as target:
        job = write_job(tmp_path, target.url, rows=rows, **KEYED, execution={"concurrency": 8, "workers": 2})
        run = start_run(job)
        try:
            wait_for(lambda: target.stats()["requests"] >= bound or None, "the rows up to the bound")
            time.sleep(1)  # room for any row past the bound to arrive, were it sent
            sent = {int(row.split("-")[0]) for row in sent_ids(target)}
            assert max(sent) <= 2 + bound, max(sent)
        finally:
            target.release()
        finished = finish(run)
    assert finished.exit_code == ExitCode.SUCCESS, finished.envelope
    assert_each_row_once(finished.data["run_dir"], 6000)


def test_a_resume_with_workers_far_into_the_input_is_not_held_by_the_run_ahead_bound(tmp_path: Path) -> None:
    """A call whose first pending row is past the bound (a resume after 3,000 of 6,000 rows) once sent
    nothing: each worker waited for a turn no worker had told, having no result to tell it with."""
    with TargetProcess({"dedup": True}) as target:
        job = write_job(tmp_path, target.url, rows=6000, **KEYED, execution={"concurrency": 8})
        first = run_cli("run", job, "--budget", "0", "--limit", "3000", cwd=tmp_path)
        assert first.data["progress"]["done"] == 3000, first.envelope
        resumed = run_cli("resume", first.data["run_dir"], "--workers", "2", "--budget", "0", cwd=tmp_path)
        assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
        assert_each_row_once(first.data["run_dir"], 6000)
        assert target.stats()["effects"] == 6000


def test_a_streak_below_the_turn_halts_though_a_faster_worker_succeeds_past_it(tmp_path: Path) -> None:
    """Row 2 is slow, so worker 0 runs ahead; rows 101-400 answer 503. One process halts after 100 of
    them in a row; with workers the successes past row 400 arrived first and ended the streak before it
    was judged, and the 300 503s were journaled as final."""
    rows = make_rows(3000)
    rows[1]["id"] += "-slow"
    for row in rows[100:400]:
        row["id"] += "-down"
    plan = {
        "rules": [
            {"match": {"path_contains": "-slow"}, "delay_ms": 3000},
            {"match": {"path_contains": "-down"}, "status": 503},
        ]
    }
    with TargetProcess(plan) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=rows,
            **KEYED,
            execution={"concurrency": 8, "workers": 2},
            halt={"consecutive_failures": 100},
            retry={"max_attempts": 1},
        )
        halted = run_cli("run", job, "--budget", "0", cwd=tmp_path)

    assert (halted.exit_code, halted.error_code) == (ExitCode.UNAVAILABLE, "TARGET_UNAVAILABLE"), (
        halted.envelope
    )
    assert halted.data["summary"]["by_outcome"]["failed"] == 0  # the streak's 503s stay pending
