"""Delta nights, run as real processes, end with the target holding exactly what the input says.

The target is a key-value store that keeps idempotency keys (`"dedup": true, "store": true`): an
applied write sets the record at its path, and a request whose key it answered before gets the
stored answer again and changes nothing, as Stripe-style APIs do. After each scenario the target's
records are compared with the input, and `sync-state verify` must agree with the journals.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode
from tests.clirun import CliResult, cli_env, run_cli, start_cli
from tests.jobfiles import make_rows, write_csv, write_job
from tests.sync.nights import KEEPS_KEYS, holding, run_night, verified
from tests.targetproc import TargetProcess
from tests.waiting import HANG_S

ROWS = 20
pytestmark = [pytest.mark.slow, pytest.mark.target_plan(KEEPS_KEYS)]
DELTA: dict[str, Any] = {
    "input": {"key": "id"},
    "request": {"method": "PUT", "idempotency_key": {"header": "Idempotency-Key"}},
    "execution": {"concurrency": 2, "sync": "delta"},
}


def changed(rows: list[dict[str, str]], numbers: tuple[int, ...], tag: str) -> list[dict[str, str]]:
    out = [dict(row) for row in rows]
    for n in numbers:
        out[n - 1]["email"] = f"user{n}{tag}@example.com"
    return out


def test_a_revert_a_b_a_reaches_a_target_that_keeps_idempotency_keys(
    tmp_path: Path, target: TargetProcess
) -> None:
    a = make_rows(ROWS)
    job = write_job(tmp_path, target.url, rows=a, **DELTA)
    run_night(tmp_path, job)
    b = changed(a, (3, 7, 15), "-b")
    write_csv(tmp_path / "data.csv", b)
    run_night(tmp_path, job)
    assert target.store() == holding(b)

    write_csv(tmp_path / "data.csv", a)  # night 3: back to night 1's values
    third = run_night(tmp_path, job)

    assert third.data["progress"]["total"] == 3
    assert target.stats()["duplicates"] == 0  # no key of night 1 came back
    assert target.store() == holding(a)
    verified(tmp_path, job)


def test_every_attempt_of_one_delivery_keeps_its_key_and_the_next_delivery_has_another(
    tmp_path: Path,
) -> None:
    plan = {**KEEPS_KEYS, "rules": [{"first_attempts": 1, "status": 503}]}  # each key's first try
    with TargetProcess(plan) as target:
        rows = make_rows(ROWS)
        retry = {"max_attempts": 3, "initial_backoff_seconds": 0.01, "max_backoff_seconds": 0.01}
        job = write_job(tmp_path, target.url, rows=rows, **DELTA, retry=retry)
        run_night(tmp_path, job)
        keys: dict[str, set[str]] = {}
        for request in target.requests():
            keys.setdefault(request["path"], set()).add(request["idempotency_key"])
        assert len(keys) == ROWS and all(len(seen) == 1 for seen in keys.values())
        assert target.stats()["requests"] == 2 * ROWS  # 503, then the retry under the same key
        assert target.stats()["effects"] == ROWS

        run_night(tmp_path, job, "--full")  # another delivery of the same content: new keys, applied
        again = {r["idempotency_key"] for r in target.requests()[2 * ROWS :]}
        assert len(again) == ROWS and not again & set().union(*keys.values())
        assert target.store() == holding(rows)
    verified(tmp_path, job)


def test_retry_failed_delivers_its_parents_rows_under_their_keys(tmp_path: Path) -> None:
    refused = {"match": {"path_contains": "/items/5"}, "status": 422, "times": 1}
    with TargetProcess({**KEEPS_KEYS, "rules": [refused]}) as target:
        rows = make_rows(ROWS)
        job = write_job(tmp_path, target.url, rows=rows, **DELTA)
        first = run_cli("run", job, "--budget", "0", cwd=tmp_path)
        assert first.exit_code == ExitCode.PARTIAL_FAILURE, first.envelope
        retried = run_cli("retry-failed", first.data["run_dir"], "--budget", "0", cwd=tmp_path)
        assert retried.exit_code == ExitCode.SUCCESS, retried.envelope
        tries = [r["idempotency_key"] for r in target.requests() if r["path"] == "/items/5"]
        assert len(tries) == 2 and tries[0] == tries[1]
        assert target.store() == holding(rows)
    verified(tmp_path, job)


def _wait_for(condition: str, check: Any) -> None:
    deadline = time.monotonic() + HANG_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {condition}"
        time.sleep(0.02)


def test_two_job_files_of_one_name_never_relay_together(tmp_path: Path) -> None:
    """They share one sync state: the second waits for nothing, it gets RUN_LOCKED naming the first's run."""
    stalled = {"match": {"path_contains": "/items/1"}, "delay_ms": 600_000, "times": 1}
    with TargetProcess({**KEEPS_KEYS, "rules": [stalled]}) as target:
        rows = make_rows(ROWS)
        first = write_job(tmp_path, target.url, rows=rows, job_name="a.yaml", **DELTA)
        second = write_job(tmp_path, target.url, rows=rows, job_name="b.yaml", **DELTA)
        relaying = start_cli("run", first, "--budget", "0", cwd=tmp_path, output="discarded")
        try:
            _wait_for("a.yaml's run to send", lambda: target.stats()["requests"] >= 1)
            refused = run_cli("run", second, "--budget", "0", cwd=tmp_path)
            assert refused.exit_code == ExitCode.CONFLICT, refused.envelope
            assert refused.error_code == "RUN_LOCKED"
            [run_dir] = [p.parent for p in (tmp_path / ".bulkrelay" / "runs").glob("*/run.json")]
            assert refused.envelope["error"]["context"]["run_dir"] == str(run_dir)
            assert "name:test-job" in refused.envelope["error"]["message"]
        finally:
            relaying.send_signal(signal.SIGKILL)
            relaying.wait()
        paths = [r["path"] for r in target.requests()]
        assert len(paths) == len(set(paths))  # no row went twice: b.yaml sent nothing beside a.yaml

        run_night(tmp_path, second)  # once a.yaml's run is gone, b.yaml's run sends the rest
        assert target.store() == holding(rows)
    verified(tmp_path, second)


def test_a_moved_api_base_makes_a_full_night_at_the_new_target(tmp_path: Path) -> None:
    rows = make_rows(ROWS)
    with TargetProcess(KEEPS_KEYS) as old, TargetProcess(KEEPS_KEYS) as new:
        job = write_job(tmp_path, "${API_BASE}", rows=rows, **DELTA)
        run_night(tmp_path, job, env=cli_env(API_BASE=old.url))
        assert old.store() == holding(rows)

        moved = run_night(tmp_path, job, env=cli_env(API_BASE=new.url))
        assert moved.data["progress"]["total"] == ROWS
        assert new.store() == holding(rows)
        assert old.stats()["requests"] == ROWS  # nothing more went to the old one

        again = run_night(tmp_path, job, env=cli_env(API_BASE=new.url))  # the same target: nothing to send
        assert again.data["progress"]["total"] == 0
        assert new.stats()["requests"] == ROWS
    verified(tmp_path, job)
    state = b"".join(p.read_bytes() for p in (tmp_path / ".bulkrelay" / "runs" / "sync-state").iterdir())
    assert str(new.port).encode() not in state and b"127.0.0.1" not in state  # hashed, never stored


def _prune_keep_1(cwd: Path) -> CliResult:
    pruned = run_cli("prune", "--keep", "1", cwd=cwd)
    assert pruned.exit_code == ExitCode.SUCCESS, pruned.envelope
    return pruned


def test_prune_keeps_the_runs_the_sync_state_needs_and_verify_stays_true(
    tmp_path: Path, target: TargetProcess
) -> None:
    a = make_rows(ROWS)
    job = write_job(tmp_path, target.url, rows=a, **DELTA)
    first = run_night(tmp_path, job)
    write_csv(tmp_path / "data.csv", changed(a, (3, 7), "-b"))
    second = run_night(tmp_path, job)
    c = changed(a, (3, 7), "-c")  # night 3 replaces every delivery night 2 made
    write_csv(tmp_path / "data.csv", c)
    run_night(tmp_path, job)

    pruned = _prune_keep_1(tmp_path)

    assert pruned.data["removed"] == [second.data["run_id"]]
    [kept] = [w for w in pruned.envelope["warnings"] if w["code"] == "KEPT_FOR_SYNC_STATE"]
    assert kept["context"]["runs"] == [first.data["run_id"]]  # night 1 still delivered 18 keys
    verified(tmp_path, job)
    rebuilt = run_cli("sync-state", "rebuild", job, cwd=tmp_path)
    assert rebuilt.data["keys"] == ROWS, rebuilt.envelope
    fourth = run_night(tmp_path, job)  # nothing changed: nothing is sent, whatever was pruned
    assert fourth.data["progress"]["total"] == 0
    assert target.store() == holding(c)
    verified(tmp_path, job)


def test_after_prune_a_mirror_job_still_deletes_the_keys_gone(tmp_path: Path, target: TargetProcess) -> None:
    mirror = {
        **DELTA,
        "execution": {"concurrency": 2, "sync": "mirror"},
        "mirror": {"url": f"{target.url}/items/{{id}}", "max_deletes": 5},
    }
    a = make_rows(ROWS)
    job = write_job(tmp_path, target.url, rows=a, **mirror)
    run_night(tmp_path, job)
    b = changed(a, (3, 7), "-b")
    write_csv(tmp_path / "data.csv", b)
    run_night(tmp_path, job)
    _prune_keep_1(tmp_path)
    verified(tmp_path, job)

    left = [row for row in b if row["id"] not in ("10", "11")]
    write_csv(tmp_path / "data.csv", left)
    third = run_night(tmp_path, job)

    assert third.data["mirror"]["deletions"] == 2
    assert target.store() == holding(left)
    verified(tmp_path, job)


PACED = {**DELTA, "execution": {**DELTA["execution"], "rate_limit": {"requests_per_second": 10}}}


def _night_1_stopped(cwd: Path, target: TargetProcess, a: list[dict[str, str]]) -> Path:
    """Night 1 on `old.csv`, stopped by its time limit with rows unsent (10 rows/s, 1 s): its run."""
    write_csv(cwd / "old.csv", a)
    job = write_job(cwd, target.url, rows=a, **PACED)
    stopped = run_cli("run", job, "--input", "old.csv", "--budget", "0", "--timeout", "1s", cwd=cwd)
    assert stopped.exit_code == ExitCode.TIMEOUT, stopped.envelope
    assert stopped.data["state"] == "stopped"
    assert stopped.data["progress"]["done"] < ROWS
    return Path(stopped.data["run_dir"])


def test_an_older_night_resumed_after_a_newer_one_is_refused_and_never_writes_old_over_new(
    tmp_path: Path, target: TargetProcess
) -> None:
    a = make_rows(ROWS)
    r1 = _night_1_stopped(tmp_path, target, a)
    job = tmp_path / "job.yaml"
    b = make_rows(ROWS, tag="-b")
    write_csv(tmp_path / "data.csv", b)
    r2 = run_night(tmp_path, job)  # night 2, on new input, delivers B
    assert target.store() == holding(b)

    refused = run_cli("resume", r1, "--budget", "0", cwd=tmp_path)

    assert refused.exit_code == ExitCode.PRECONDITION, refused.envelope
    assert refused.error_code == "RUN_SUPERSEDED"
    assert refused.envelope["error"]["context"]["newer_run"] == r2.data["run_id"]
    assert r2.data["run_id"] in refused.envelope["error"]["message"]
    assert target.store() == holding(b)  # nothing of night 1 went over night 2
    verified(tmp_path, job)
    assert run_night(tmp_path, job).data["progress"]["total"] == 0  # and the state says what the target holds

    # Night 1's very command again: not a continuation of the overtaken run, a new run of old.csv.
    again = run_night(tmp_path, job, "--input", "old.csv")
    assert again.data["run_id"] != r1.name
    [discarded] = [w for w in again.envelope["warnings"] if w["code"] == "CHECKPOINT_DISCARDED"]
    assert discarded["context"] == {"previous_run": r1.name, "reason": "RUN_SUPERSEDED"}
    assert target.store() == holding(a)
    verified(tmp_path, job)


def test_an_older_night_resumed_before_the_newer_one_is_followed_by_it(
    tmp_path: Path, target: TargetProcess
) -> None:
    a = make_rows(ROWS)
    r1 = _night_1_stopped(tmp_path, target, a)
    job = tmp_path / "job.yaml"
    resumed = run_cli("resume", r1, "--budget", "0", cwd=tmp_path)
    assert resumed.exit_code == ExitCode.SUCCESS, resumed.envelope
    assert target.store() == holding(a)

    b = changed(a, (2, 9, 17), "-b")
    write_csv(tmp_path / "data.csv", b)
    second = run_night(tmp_path, job)

    assert second.data["progress"]["total"] == 3
    assert target.store() == holding(b)
    verified(tmp_path, job)
