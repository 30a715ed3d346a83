"""The call budget and background jobs (docs/jobs.md), with real processes and a slow loopback target.

Every test gets its own state directory (BULKRELAY_STATE_DIR), so job directories can be counted.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bulkrelay.background.budget import DEFAULT_BUDGET_MS, resolve_budget
from bulkrelay.errors import ExitCode, UsageError
from bulkrelay.store.journal import read_journal
from tests.background.jobcli import cli as _cli
from tests.background.jobcli import env as _env
from tests.background.jobcli import worker_pid as _worker_pid
from tests.clirun import CliResult, run_cli
from tests.jobfiles import make_rows, write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_BUDGET_MS, HANG_S, wait_for

# real processes: outside the fast lane (`-m "not slow"`)
pytestmark = [pytest.mark.slow, pytest.mark.target_plan({"rules": [{"delay_ms": 200}]})]


def _job_dirs(tmp_path: Path) -> list[Path]:
    jobs = tmp_path / "state" / "jobs"
    return sorted(
        p for p in jobs.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "index"
    )


def _kill_worker(tmp_path: Path, job_id: str) -> None:
    """SIGKILL the job's worker, which must still be alive: a worker that already ended (its deadline
    came first) would leave the test proving nothing, so that fails here, naming how the job ended."""
    try:
        os.kill(_worker_pid(tmp_path, job_id), signal.SIGKILL)
    except ProcessLookupError:
        status = (tmp_path / "state" / "jobs" / job_id / "status.json").read_text()
        raise AssertionError(f"the worker of {job_id} ended before the test killed it: {status}") from None


def _wait_until_lost(tmp_path: Path, job_id: str) -> CliResult:
    """`job status` once it calls the killed worker's job JOB_LOST (its lock is free once it has died)."""

    def lost() -> CliResult | None:
        status = _cli(tmp_path, "job", "status", job_id)
        return status if status.error_code == "JOB_LOST" else None

    return wait_for(lost, f"job {job_id} to be JOB_LOST")


def _rows_per_key(run_dir: str) -> Counter[int]:
    return Counter(entry.row_number for entry in read_journal(Path(run_dir) / "results.jsonl"))


def _bodies(target: TargetProcess) -> Counter[str]:
    return Counter(str(request["path"]) for request in target.requests())


def _start_front(tmp_path: Path, *args: str | Path, **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bulkrelay", *map(str, args)],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )


def _wait_for_progress(tmp_path: Path, job_id: str, at_least: int = 1) -> None:
    status = tmp_path / "state" / "jobs" / job_id / "status.json"

    def progressed() -> bool:
        progress = orjson.loads(status.read_bytes()).get("progress") or {} if status.exists() else {}
        return bool(progress.get("done", 0) >= at_least)

    wait_for(progressed, f"job {job_id} to commit {at_least} row(s)")


def _wait_until_catching_sigterm(pid: int) -> None:
    """Until the front catches SIGTERM (the SigCgt mask in /proc) and sleeps between polls of its job.

    Start-up catches SIGTERM too (it ends the call with 143); only the front's wait loop sleeps."""

    def catching() -> bool:
        fields = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        # Not dumpable (no core file): to a reader other than root its wchan shows "0"; its state then.
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        sleeping = "nanosleep" in wchan or (wchan == "0" and state == "S")
        return bool(int(fields["SigCgt"].strip(), 16) & (1 << (signal.SIGTERM - 1))) and sleeping

    wait_for(catching, "the front to take over SIGTERM")


# ----------------------------------------------------------------------------------- budget


def test_budget_resolution_order() -> None:
    assert resolve_budget(2000, {"AGENT_CALL_BUDGET_MS": "9000"}, False) == 2000
    assert resolve_budget(0, {"AGENT_CALL_BUDGET_MS": "9000"}, False) == 0
    assert resolve_budget(None, {"AGENT_CALL_BUDGET_MS": "9000"}, True) == 9000
    assert resolve_budget(None, {}, False) == DEFAULT_BUDGET_MS == 30_000
    assert resolve_budget(None, {}, True) is None
    assert resolve_budget(None, {"AGENT_CALL_BUDGET_MS": ""}, True) is None


@pytest.mark.parametrize("raw", ["\u00b2", "9" * 5000], ids=["superscript-two", "5000-digits"])
def test_a_budget_variable_that_int_refuses_is_a_usage_error(raw: str) -> None:
    # str.isdigit takes both; int() refuses both: that was an unexpected ValueError, exit 1
    with pytest.raises(UsageError, match="AGENT_CALL_BUDGET_MS"):
        resolve_budget(None, {"AGENT_CALL_BUDGET_MS": raw}, False)


def test_bad_budget_env_is_a_usage_error(tmp_path: Path) -> None:
    result = _cli(tmp_path, "run", "job.yaml", AGENT_CALL_BUDGET_MS="soon")
    assert result.exit_code == ExitCode.ARG_ERROR
    assert "AGENT_CALL_BUDGET_MS" in result.envelope["error"]["message"]


def test_work_inside_the_budget_answers_as_usual_with_budget_ms(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=5)
        result = _cli(tmp_path, "run", job)  # no --budget, no terminal: 30 s
        assert result.exit_code == ExitCode.SUCCESS, result.envelope
        assert result.envelope["meta"]["budget_ms"] == 30_000
        assert result.data["state"] == "completed"
        assert len(_job_dirs(tmp_path)) == 1

        # The resume's worker answers inside this budget unless it hangs (a loaded machine starts it slowly).
        from_env = _cli(tmp_path, "resume", result.data["run_dir"], AGENT_CALL_BUDGET_MS="90000")
        assert from_env.envelope["meta"]["budget_ms"] == 90_000
        assert from_env.error_code == "RUN_NOT_RESUMABLE"

        synchronous = _cli(tmp_path, "run", job, "--budget", "0")
        assert synchronous.exit_code == ExitCode.SUCCESS
        assert synchronous.envelope["meta"]["budget_ms"] == 0
        assert "job_id" not in synchronous.envelope["meta"]
        assert len(_job_dirs(tmp_path)) == 2  # the synchronous run started no job (the resume did)


# ------------------------------------------------------------------------------- hand-off


def test_pipe_reaches_eof_and_the_job_survives_its_callers_group(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 2})
    # The caller: a shell (its own process group) piping the call into cat, then lingering on.
    command = f"{shlex.quote(sys.executable)} -m bulkrelay run {shlex.quote(str(job))} --budget 2s | cat"
    caller = subprocess.Popen(
        ["sh", "-c", f"{command}; exec sleep 60 >/dev/null 2>&1"],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert caller.stdout is not None
    stdout = caller.stdout.read()  # returns at end-of-file
    envelope = orjson.loads(stdout)
    assert envelope["meta"]["exit_code"] == ExitCode.INCOMPLETE
    data = envelope["data"]
    assert envelope["error"]["code"] == "INCOMPLETE"
    assert data["state"] == "running"
    job_id = data["job_id"]
    assert data["continue_command"] == f"bulkrelay job wait {job_id}"
    assert data["cancel_command"] == f"bulkrelay job cancel {job_id}"
    assert set(data["progress"]) >= {"done", "total", "unit"}
    # Released at the budget, while the job (20 s of work and more) goes on: not at the job's end.
    assert _cli(tmp_path, "job", "status", job_id).data["state"] == "running"

    os.killpg(caller.pid, signal.SIGTERM)  # kill -TERM -<pgid> of the caller's group
    assert caller.wait(HANG_S) == -signal.SIGTERM
    caller.stdout.close()
    os.kill(_worker_pid(tmp_path, job_id), 0)  # the worker lives on in its own session

    _wait_for_progress(tmp_path, job_id)
    before = _cli(tmp_path, "job", "status", job_id)
    assert before.exit_code == ExitCode.INCOMPLETE
    # A row committed after `before`, whatever the load: the wait must then report it, not older progress.
    _wait_for_progress(tmp_path, job_id, at_least=before.data["progress"]["done"] + 1)
    first = _cli(tmp_path, "job", "wait", job_id, "--budget", "1s")
    assert first.exit_code == ExitCode.INCOMPLETE
    assert first.data["progress"]["done"] > before.data["progress"]["done"]  # fresh, larger progress

    target.set_plan({})  # let the job finish
    waited = time.monotonic()
    final = _cli(tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET)
    wait_ms = (time.monotonic() - waited) * 1000
    assert final.exit_code == ExitCode.SUCCESS, final.envelope
    assert final.data["state"] == "completed"
    assert final.data["run_dir"] == before.data["run_dir"]
    assert final.envelope["meta"]["duration_ms"] > wait_ms  # the work's duration, not the wait's
    assert final.envelope["meta"]["budget_ms"] == HANG_BUDGET_MS
    assert _cli(tmp_path, "job", "status", job_id).exit_code == ExitCode.SUCCESS
    assert sorted(_bodies(target).values()) == [1] * 200


def test_job_wait_with_budget_0_waits_for_the_end(tmp_path: Path) -> None:
    # `--budget 0` turns the budget off (docs/jobs.md): from cron, `job wait ID --budget 0` must hold
    # until the job ends, not answer 14 at its first look. The job is still sending when the wait
    # starts: each of its 20 rows takes 100 ms, one at a time.
    with TargetProcess({"rules": [{"delay_ms": 100}]}) as target:
        job = write_job(tmp_path, target.url, rows=20, execution={"concurrency": 1})
        started = _cli(tmp_path, "run", job, "--budget", "100ms")
        assert started.exit_code == ExitCode.INCOMPLETE, started.envelope
        waited = _cli(tmp_path, "job", "wait", started.data["job_id"], "--budget", "0")
    assert waited.exit_code == ExitCode.SUCCESS, waited.envelope
    assert waited.data["state"] == "completed" and waited.data["progress"]["ok"] == 20
    assert waited.envelope["meta"]["budget_ms"] == 0


def test_sigterm_to_the_front_hands_off_and_the_invocation_attaches(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 1})
    first = _cli(tmp_path, "run", job, "--budget", "1s")
    assert first.exit_code == ExitCode.INCOMPLETE
    job_id = first.data["job_id"]
    _wait_for_progress(tmp_path, job_id)

    front = _start_front(tmp_path, "run", job, "--budget", HANG_BUDGET)  # only the signal ends it in time
    _wait_until_catching_sigterm(front.pid)
    front.send_signal(signal.SIGTERM)
    stdout, _ = front.communicate(timeout=HANG_S)
    envelope = orjson.loads(stdout)
    assert front.returncode == ExitCode.INCOMPLETE
    assert envelope["data"]["job_id"] == job_id  # attached: the same job, no second worker
    assert envelope["meta"]["budget_ms"] == HANG_BUDGET_MS
    assert "handed off on SIGTERM" in envelope["error"]["message"]  # not "after the call budget"
    assert "budget" not in envelope["error"]["message"]
    assert envelope["error"]["context"] == {"handed_off_on": "SIGTERM"}
    assert len(_job_dirs(tmp_path)) == 1

    cancel = _cli(tmp_path, "job", "cancel", job_id)
    assert cancel.exit_code == ExitCode.SUCCESS
    assert cancel.data["state"] == "cancelled"
    assert cancel.data["run_state"] == "cancelled"
    assert cancel.data["run_dir"] is not None
    ended = _cli(tmp_path, "job", "wait", job_id)
    assert ended.error_code == "CANCELLED"
    assert ended.data["state"] == "cancelled"

    target.set_plan({})  # fast now: the fresh run ends inside its budget
    target.reset()
    again = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_dir"] != cancel.data["run_dir"]  # started from the beginning
    assert again.envelope["meta"]["job_id"] != job_id
    assert sorted(_bodies(target).values()) == [1] * 200


def _job_status_file(tmp_path: Path) -> Path:
    """The status file of the one job of this test, once the front has created it."""

    def status_file() -> Path | None:
        jobs = _job_dirs(tmp_path) if (tmp_path / "state" / "jobs").is_dir() else []
        return jobs[0] / "status.json" if jobs and (jobs[0] / "status.json").exists() else None

    return wait_for(status_file, "the front to start a job")


def _wait_for_status(status: Path, condition: Callable[[dict[str, Any]], bool]) -> None:
    wait_for(lambda: condition(orjson.loads(status.read_bytes())), f"the job's status {status} to get there")


def _hand_off_now(front: subprocess.Popen[bytes]) -> dict[str, Any]:
    _wait_until_catching_sigterm(front.pid)
    front.send_signal(signal.SIGTERM)
    stdout, _ = front.communicate(timeout=HANG_S)
    assert front.returncode == ExitCode.INCOMPLETE, stdout
    envelope: dict[str, Any] = orjson.loads(stdout)
    return envelope


def test_a_discarded_checkpoint_is_in_the_hand_off_envelope(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"match": {"path_contains": "/items/5"}, "status": 401}]}) as target:
        job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 1})
        halted = _cli(tmp_path, "run", job, "--budget", "0")
        assert halted.error_code == "TARGET_AUTH_FAILED" and halted.data["state"] == "stopped"

        write_job(tmp_path, target.url, rows=make_rows(200, tag="-changed"), execution={"concurrency": 1})
        target.set_plan({"rules": [{"delay_ms": 200}]})  # 40 s of work: it outlasts the call
        front = _start_front(tmp_path, "run", job, "--budget", HANG_BUDGET)
        status = _job_status_file(tmp_path)
        _wait_for_status(status, lambda s: bool(s.get("warnings")) and s.get("run_dir") is not None)
        envelope = _hand_off_now(front)
        job_id = envelope["data"]["job_id"]
        # With no terminal and no agent budget the hand-off also warns BUDGET_HANDOFF_UNATTENDED.
        (warning,) = [w for w in envelope["warnings"] if w["code"] == "CHECKPOINT_DISCARDED"]
        assert warning["context"] == {"previous_run": halted.data["run_id"], "reason": "INPUT_CHANGED"}
        assert envelope["data"]["run_dir"] not in (None, halted.data["run_dir"])  # the new run's
        assert warning in _cli(tmp_path, "job", "status", job_id).envelope["warnings"]
        assert _cli(tmp_path, "job", "cancel", job_id).exit_code == ExitCode.SUCCESS


def test_a_hand_off_during_preflight_names_the_stage_and_the_rows_read(tmp_path: Path) -> None:
    job = write_job(tmp_path, "http://127.0.0.1:9", rows=1)
    fifo = tmp_path / "live.csv"
    os.mkfifo(fifo)  # preflight reads what the test writes, and waits for the rest
    front = _start_front(tmp_path, "run", job, "--input", fifo, "--budget", HANG_BUDGET)
    writer = _open_fifo_for_writing(fifo)
    try:
        os.write(writer, b"id,email,name\n1,a@example.com,A\n2,b@example.com,B\n3,c@example.com,C\n")
        status = _job_status_file(tmp_path)
        _wait_for_status(status, lambda s: s.get("stage") == "preflight" and s.get("rows_read", 0) >= 1)
        envelope = _hand_off_now(front)
        job_id = envelope["data"]["job_id"]
        os.kill(_worker_pid(tmp_path, job_id), signal.SIGKILL)  # it would wait for the rest forever
    finally:
        os.close(writer)
    data = envelope["data"]
    assert data["state"] == "running"
    assert data["stage"] == "preflight"
    assert 1 <= data["rows_read"] <= 3
    assert data["run_dir"] is None  # a fresh run's directory exists only once preflight passed


def _open_fifo_for_writing(fifo: Path) -> int:
    """The write end of `fifo`, once the worker has opened its read end (never blocks the test)."""

    def opened() -> int | None:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader yet
            return None
        os.set_blocking(fd, True)
        return fd

    return wait_for(opened, "the worker to open its input")


# ---------------------------------------------------------------------------- failure modes


def test_a_killed_worker_is_lost_and_the_identical_invocation_finishes_its_run(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 2})
    first = _cli(tmp_path, "run", job, "--budget", "1s")
    assert first.exit_code == ExitCode.INCOMPLETE
    job_id = first.data["job_id"]
    _wait_for_progress(tmp_path, job_id, at_least=4)
    run_dir = _cli(tmp_path, "job", "status", job_id).data["run_dir"]
    _kill_worker(tmp_path, job_id)

    lost = _cli(
        tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET
    )  # notices the death, whenever it lands
    assert lost.exit_code == ExitCode.GENERAL_ERROR
    assert lost.error_code == "JOB_LOST"
    assert f"bulkrelay job {job_id}: worker" in lost.envelope["error"]["detail"]  # the log's tail
    assert lost.envelope["meta"]["job_id"] == job_id
    status = _cli(tmp_path, "job", "status", job_id)
    assert status.error_code == "JOB_LOST" and status.envelope["meta"]["job_id"] == job_id

    target.set_plan({})
    again = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)
    assert again.exit_code == ExitCode.SUCCESS, again.envelope
    assert again.data["run_dir"] == run_dir  # the same run, continued
    assert again.envelope["meta"]["job_id"] != job_id
    assert sorted(_rows_per_key(again.data["run_dir"]).values()) == [1] * 200


def test_the_call_whose_worker_was_killed_names_its_job_in_meta(
    tmp_path: Path, target: TargetProcess
) -> None:
    """The front process that sees its job's worker die answers JOB_LOST with `meta.job_id`, as every
    answer about a job: the caller knows the job by it (docs/jobs.md's `jq -r .meta.job_id`)."""
    job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 2})
    front = _start_front(tmp_path, "run", job, "--budget", HANG_BUDGET)
    jobs = tmp_path / "state" / "jobs"

    def made() -> Path | None:
        return next(iter(_job_dirs(tmp_path)), None) if jobs.is_dir() else None

    job_dir = wait_for(made, "the background job to be made")
    _wait_for_progress(tmp_path, job_dir.name, at_least=4)
    _kill_worker(tmp_path, job_dir.name)
    out, _ = front.communicate(timeout=HANG_S)
    answer = orjson.loads(out)
    assert front.returncode == ExitCode.GENERAL_ERROR, answer
    assert answer["error"]["code"] == "JOB_LOST"
    assert answer["meta"]["job_id"] == job_dir.name


def test_no_progress_for_the_idle_timeout_ends_the_job_stalled(tmp_path: Path) -> None:
    # Only the watchdog can end the call in time: the target answers after the budget, a hang's bound.
    with TargetProcess({"rules": [{"delay_ms": 2 * HANG_BUDGET_MS}]}) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=4,
            execution={"concurrency": 2, "idle_timeout_seconds": 1, "timeout": {"read_seconds": 3 * HANG_S}},
        )
        result = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)
    assert result.exit_code == ExitCode.TIMEOUT
    assert result.error_code == "STALLED"
    assert result.data["state"] in ("stopped", "forced")
    assert result.data["progress"]["done"] == 0


def test_timeout_bounds_the_job(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=100, execution={"concurrency": 1})
    # 20 s of work; 10 s leave a loaded machine time to start the worker and commit a first row.
    result = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET, "--timeout", "10s")
    assert result.exit_code == ExitCode.TIMEOUT
    assert result.error_code == "TIMEOUT"
    assert result.data["state"] == "stopped"
    assert 0 < result.data["progress"]["done"] < 100


def test_max_lifetime_bounds_the_job_when_no_timeout_is_given(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 1, "max_lifetime_seconds": 10})
    result = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)  # the work takes 40 s: it would complete
    assert result.exit_code == ExitCode.TIMEOUT
    assert result.error_code == "TIMEOUT"
    assert result.data["state"] == "stopped"
    assert 0 < result.data["progress"]["done"] < 200


def _job_spec(tmp_path: Path, job_id: str) -> dict[str, Any]:
    spec: dict[str, Any] = orjson.loads((tmp_path / "state" / "jobs" / job_id / "spec.json").read_bytes())
    return spec


def test_a_deadline_ends_with_its_job(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 1})  # 40 s of work
    first = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET, "--timeout", "10s")  # its run exists by then
    assert first.exit_code == ExitCode.TIMEOUT, first.envelope

    longer = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET, "--timeout", "12s")  # a deadline of its own

    assert longer.exit_code == ExitCode.TIMEOUT, longer.envelope
    assert longer.data["run_dir"] == first.data["run_dir"]  # the same run, continued
    deadline = longer.envelope["error"]["context"]["deadline"]
    assert deadline > first.envelope["error"]["context"]["deadline"]
    assert _job_spec(tmp_path, longer.envelope["meta"]["job_id"])["previous_job"] is None
    target.set_plan({})
    unbounded = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)  # no --timeout: the job's lifetime
    assert unbounded.exit_code == ExitCode.SUCCESS, unbounded.envelope
    assert sorted(_rows_per_key(unbounded.data["run_dir"]).values()) == [1] * 200


def test_after_a_completed_job_the_identical_call_has_a_lifetime_of_its_own(tmp_path: Path) -> None:
    with TargetProcess() as target:
        # A lifetime a loaded machine's first call ends well inside, and the second call starts after.
        job = write_job(tmp_path, target.url, rows=5, execution={"max_lifetime_seconds": 15})
        first = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)
        assert first.exit_code == ExitCode.SUCCESS, first.envelope
        lifetime_end = _job_spec(tmp_path, first.envelope["meta"]["job_id"])["created_at"] + 15
        while time.time() <= lifetime_end:  # until the first job's lifetime is over
            time.sleep(0.1)

        second = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)

    assert second.exit_code == ExitCode.SUCCESS, second.envelope
    assert second.data["run_dir"] != first.data["run_dir"]
    assert second.data["summary"]["this_call"]["rows_committed"] == 5


def test_the_continuation_of_a_lost_job_keeps_its_deadline(tmp_path: Path, target: TargetProcess) -> None:
    job = write_job(tmp_path, target.url, rows=200, execution={"concurrency": 1})
    # The worker must still be alive when the test kills it: a deadline only a hang reaches first.
    first = _cli(tmp_path, "run", job, "--budget", "1s", "--timeout", "30s")
    assert first.exit_code == ExitCode.INCOMPLETE
    job_id = first.data["job_id"]
    _wait_for_progress(tmp_path, job_id)
    _kill_worker(tmp_path, job_id)
    run_dir = _wait_until_lost(tmp_path, job_id).envelope["error"]["context"]["run_dir"]
    assert run_dir is not None
    target.set_plan({"rules": [{"delay_ms": 1000}]})  # 150 s of work and more are left

    again = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)  # a fresh deadline would let it complete

    assert again.exit_code == ExitCode.TIMEOUT, again.envelope
    assert again.data["run_dir"] == run_dir
    continuation = _job_spec(tmp_path, again.envelope["meta"]["job_id"])
    assert continuation["previous_job"] == job_id
    assert continuation["deadline"] == _job_spec(tmp_path, job_id)["deadline"]


def test_retry_failed_runs_under_the_budget_as_a_job(tmp_path: Path) -> None:
    with TargetProcess({"rules": [{"match": {"path_contains": "/items/3"}, "status": 503}]}) as target:
        job = write_job(tmp_path, target.url, rows=5)
        parent = _cli(tmp_path, "run", job, "--budget", "0")
        assert parent.exit_code == ExitCode.PARTIAL_FAILURE
        target.set_plan({"rules": [{"delay_ms": 1500}]})  # recovered, but slower than the budget
        handed_off = _cli(tmp_path, "retry-failed", parent.data["run_dir"], "--budget", "500ms")
        assert handed_off.exit_code == ExitCode.INCOMPLETE, handed_off.envelope
        job_id = handed_off.data["job_id"]
        assert handed_off.data["continue_command"] == f"bulkrelay job wait {job_id}"
        finished = _cli(tmp_path, "job", "wait", job_id, "--budget", HANG_BUDGET)
    assert finished.exit_code == ExitCode.SUCCESS, finished.envelope
    assert finished.data["parent_run"] == parent.data["run_id"]
    assert finished.data["progress"]["done"] == finished.data["progress"]["total"] == 1


# ----------------------------------------------------------------------- stdin and retention


def test_stdin_is_spooled_into_the_job(tmp_path: Path) -> None:
    records = b"id,email,name\n1,a@example.com,A\n2,b@example.com,B\n"
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=1)
        result = run_cli(
            "run",
            job,
            "--input",
            "-",
            "--budget",
            HANG_BUDGET,
            cwd=tmp_path,
            env=_env(tmp_path),
            stdin=records,
        )
        assert result.exit_code == ExitCode.SUCCESS, result.envelope
        assert result.data["progress"]["done"] == 2
        assert sorted(_bodies(target)) == ["/items/1", "/items/2"]
    (job_dir,) = _job_dirs(tmp_path)
    assert (job_dir / "stdin").read_bytes() == records
    spec = orjson.loads((job_dir / "spec.json").read_bytes())
    assert spec["argv"][:4] == ["run", str(job), "--input", "-"]


def test_finished_jobs_are_removed_after_the_retention_period(tmp_path: Path) -> None:
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=2)
        result = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)
    job_id = result.envelope["meta"]["job_id"]
    kept = _cli(tmp_path, "job", "status", job_id, BULKRELAY_JOB_RETENTION_SECONDS="3600")
    assert kept.exit_code == ExitCode.SUCCESS
    assert kept.data["state"] == "completed"
    time.sleep(1.1)
    gone = _cli(tmp_path, "job", "status", job_id, BULKRELAY_JOB_RETENTION_SECONDS="1")
    assert gone.exit_code == ExitCode.NOT_FOUND
    assert _job_dirs(tmp_path) == []


def test_reaching_a_job_never_waits_behind_the_index_lock(tmp_path: Path) -> None:
    """`job status|wait|cancel` tidy expired jobs in passing only when the index is free: a process that
    holds it (a hand-off starting a job; one stopped while it did) never holds them. Here the test holds
    it for the whole call: blocking on it, the call would not answer at all."""
    with TargetProcess() as target:
        job = write_job(tmp_path, target.url, rows=2)
        result = _cli(tmp_path, "run", job, "--budget", HANG_BUDGET)
    job_id = result.envelope["meta"]["job_id"]
    fd = os.open(tmp_path / "state" / "jobs" / "index.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for action in ("status", "wait", "cancel"):
            answer = _cli(tmp_path, "job", action, job_id)
            assert answer.exit_code == ExitCode.SUCCESS, (action, answer.envelope)
    finally:
        os.close(fd)


def test_unknown_job_ids_are_not_found(tmp_path: Path) -> None:
    for action in ("status", "wait", "cancel"):
        result = _cli(tmp_path, "job", action, "run-0123456789")
        assert result.exit_code == ExitCode.NOT_FOUND, action


@pytest.mark.parametrize("job_id", ["../../etc", "run-0123456789/../x", "RUN-0123456789", "", "run-"])
def test_a_malformed_job_id_is_a_usage_error_never_a_path(tmp_path: Path, job_id: str) -> None:
    for action in ("status", "wait", "cancel"):
        result = _cli(tmp_path, "job", action, job_id)
        assert result.exit_code == ExitCode.ARG_ERROR, (action, result.envelope)
        assert result.error_code == "USAGE_ERROR"
        assert str(tmp_path / "state") not in orjson.dumps(result.envelope).decode()  # never used as a path
