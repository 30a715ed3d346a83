"""A keyed batch run killed with SIGKILL again and again, against a target that dedups by
Idempotency-Key: every row is journaled exactly once and no item is applied twice, also when items
answered retryably (an Elasticsearch item 429) go again between the kills."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.journal import read_journal, scan_journal
from tests.clirun import run_cli, start_cli
from tests.relay.batchrun import write_batch_job
from tests.spawnedruns import run_held_by, spawn_run, wait_for_frontier_past
from tests.targetproc import TargetProcess
from tests.waiting import wait_for

ROWS = 1200
KILLS = 5


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "busy_every"), [("hubspot", 0), ("elasticsearch", 7)])
def test_kill_9_loop_over_a_keyed_batch_run_applies_no_item_twice(
    tmp_path: Path, shape: str, busy_every: int
) -> None:
    rng = random.Random(24)
    runs_root = tmp_path / ".bulkrelay" / "runs"
    frontier = 0
    # A name holding "busy" is answered 429 twice as an item: its batch's rows still pending go again.
    names = [("busy" if busy_every and n % busy_every == 0 else "user") + str(n) for n in range(1, ROWS + 1)]
    # Each batch is applied at once and answered 30 ms later: kills land between the two.
    plan = {"dedup": True, "batch": {"delay_ms": 30, "retry_times": 2}}
    with TargetProcess(plan) as target:
        job = write_batch_job(
            tmp_path,
            target.url,
            shape,
            names,
            max_items=20,
            execution={"concurrency": 4, "rate_limit": {"requests_per_second": 30}},
            retry={"max_attempts": 5, "initial_backoff_seconds": 0.05},
        )
        for kill in range(KILLS):
            proc = spawn_run(tmp_path, job)
            run_dir = run_held_by(runs_root, proc)
            wait_for_frontier_past(run_dir, frontier, proc)
            time.sleep(rng.uniform(0.0, 0.15))
            assert proc.poll() is None, f"kill {kill}: the run ended on its own (exit {proc.returncode})"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            checkpoint = read_checkpoint(run_dir)
            frontier = checkpoint.offset if checkpoint is not None else 0
        final = run_cli("run", job, "--budget", "0", cwd=tmp_path, timeout=120)
        stats = target.stats()
        requests = target.requests()
    assert final.exit_code == ExitCode.SUCCESS, final.envelope
    run_dir = Path(final.data["run_dir"])
    journal = run_dir / "results.jsonl"
    scan = scan_journal(journal, committed_seq=0, committed_offset=0, row_count=ROWS)
    assert scan.torn_tail is None and scan.last_seq == ROWS and len(scan.done) == ROWS
    entries = list(read_journal(journal))
    assert Counter(e.row_number for e in entries) == Counter(range(1, ROWS + 1))  # each row once
    assert all(e.success and e.batch is not None for e in entries)
    # A batch's lines are whole: as many lines carry its seq as its size says (fewer where an item
    # answered retryably went again in a later request).
    batches = [e.batch for e in entries if e.batch is not None]
    by_seq = Counter(batch["seq"] for batch in batches)
    lines = [(by_seq[batch["seq"]], batch["size"]) for batch in batches]
    assert all(count == size if shape == "hubspot" else count <= size for count, size in lines)
    # No item applied twice; every item applied.
    assert stats["items_applied_twice"] == [] and stats["distinct_items_applied"] == ROWS
    # A key resent after a kill carried the same items: one body per key.
    bodies: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        bodies[request["idempotency_key"]].add(request["body"])
    assert all(len(sent) == 1 for sent in bodies.values())
    assert stats["duplicates"] >= 1  # some batch was resent after a kill and answered from the store
    if shape == "hubspot":
        journal_ids = {e.idempotency_key for e in entries}
        sent_ids = {i["objectWriteTraceId"] for r in requests for i in orjson.loads(r["body"])["inputs"]}
        assert journal_ids == sent_ids
    else:
        assert any(e.attempts > 1 for e in entries)  # items answered 429 went again


@pytest.mark.slow
def test_the_rerun_of_a_finished_batch_job_resends_its_retries_under_the_same_keys(tmp_path: Path) -> None:
    """A full job's keys are its content's, so the identical re-run after a completed run is answered by
    a target that keeps keys: the requests of rows sent again too (numbered by their rows, not by the
    run; numbered by the run, the re-run's came out under new keys and 40 of 3,000 items went twice)."""
    names = [("busy" if n % 5 == 0 else "user") + str(n) for n in range(1, 601)]
    with TargetProcess({"dedup": True, "batch": {"retry_times": 1}}) as target:
        job = write_batch_job(
            tmp_path,
            target.url,
            "elasticsearch",
            names,
            max_items=20,
            execution={"concurrency": 8},  # retries end in an order of their own: numbered by the run,
            retry={"max_attempts": 5, "initial_backoff_seconds": 0.01},  # they came out differently
        )
        runs = [run_cli("run", job, "--budget", "0", cwd=tmp_path, timeout=120) for _ in range(2)]
        stats = target.stats()
    assert [run.exit_code for run in runs] == [ExitCode.SUCCESS, ExitCode.SUCCESS], runs[-1].envelope
    assert runs[0].data["run_dir"] != runs[1].data["run_dir"]  # a new run: the first one completed
    assert stats["items_applied_twice"] == [] and stats["distinct_items_applied"] == len(names)


@pytest.mark.slow
@pytest.mark.parametrize("shards", [1, 2])
def test_a_crash_during_an_item_429_backoff_then_the_next_night_applies_no_item_twice(
    tmp_path: Path, shards: int
) -> None:
    """kill -9 while 28 items of each 40-item batch wait out their item 429: the identical re-run sends
    them, and the next night's run, answered the first request's stored 429s, sends them again under
    the very key the re-run used. (Keyed by the process's history, the re-run sent them under their
    ids alone and the next night numbered them as a retry: a new key, all 28 applied again.)"""
    rows = 40 * shards
    names = [("busy" if n % 10 < 7 else "user") + str(n) for n in range(1, rows + 1)]
    runs_root = tmp_path / ".bulkrelay" / "runs"
    split = [[] if shards == 1 else ["--shard", f"{k}/{shards}"] for k in range(shards)]
    with TargetProcess({"dedup": True, "batch": {"retry_times": 1}}) as target:
        job = write_batch_job(
            tmp_path,
            target.url,
            "elasticsearch",
            names,
            max_items=40,
            execution={"concurrency": 1},
            retry={
                "max_attempts": 3,
                "initial_backoff_seconds": 4,
                "max_backoff_seconds": 4,
                "jitter_ratio": 0,
            },
        )
        procs = [
            start_cli("run", job, "--budget", "0", *args, cwd=tmp_path, output="discarded") for args in split
        ]
        wait_for(lambda: len(_sent_ids(target)) >= rows or None, "every row's first send")
        for proc in procs:
            wait_for_frontier_past(run_held_by(runs_root, proc), 0, proc)  # its applied rows, committed
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        sent = _sent_ids(target)
        assert len(sent) == len(set(sent)) == rows  # killed during the busy items' backoff: none resent
        nights = [
            run_cli("run", job, "--budget", "0", *args, cwd=tmp_path, timeout=120)
            for _ in range(2)
            for args in split
        ]
        stats = target.stats()
    assert [night.exit_code for night in nights] == [ExitCode.SUCCESS] * 2 * shards, nights[-1].envelope
    assert len({night.data["run_dir"] for night in nights}) == 2 * shards  # the next night: new runs
    assert stats["items_applied_twice"] == [] and stats["distinct_items_applied"] == rows


def _sent_ids(target: TargetProcess) -> list[str]:
    """The ids of the items of every request the target received (Elasticsearch: action lines)."""
    return [
        orjson.loads(line)["index"]["_id"] for r in target.requests() for line in r["body"].splitlines()[::2]
    ]
