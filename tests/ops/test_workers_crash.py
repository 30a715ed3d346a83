"""Issue 44's crash test: 20 kill -9s spread over the parent and the workers of a 4-worker run against
a target that keeps idempotency keys. Every row is journaled once, none takes effect twice, nothing
committed is lost, and no worker outlives its parent."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.journal import read_journal, scan_journal
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.runsteps import assert_each_row_once
from tests.spawnedruns import run_held_by, spawn_run, wait_for_frontier_past
from tests.targetproc import TargetProcess
from tests.workerprocs import kill_9, wait_for_workers, wait_until_gone

pytestmark = pytest.mark.slow  # real processes: outside the fast lane

ROWS = 6000
WORKERS = 4
KILLS = 20
# Answers take 1-6 ms depending on the row, so kills land with requests in flight at the target.
DEDUP_TARGET = {
    "dedup": True,
    "rules": [
        {"match": {"body_contains": "3@"}, "delay_ms": 6},
        {"match": {"body_contains": "7@"}, "delay_ms": 3},
        {"delay_ms": 1},
    ],
}


def test_kill_9_of_the_parent_or_any_worker_keeps_every_row_once(tmp_path: Path) -> None:
    rng = random.Random(20261206)
    runs_root = tmp_path / ".bulkrelay" / "runs"
    prefixes: list[tuple[Path, bytes]] = []  # each kill's committed journal prefix
    frontier = 0
    with TargetProcess(DEDUP_TARGET) as target:
        job = write_job(
            tmp_path,
            target.url,
            rows=ROWS,
            input={"key": "id"},
            request={"idempotency_key": {"header": "Idempotency-Key"}},
            execution={"concurrency": 8, "workers": WORKERS, "rate_limit": {"requests_per_second": 250}},
        )
        for kill in range(KILLS):
            proc = spawn_run(tmp_path, job)
            run_dir = run_held_by(runs_root, proc)
            if kill % 7 == 6:  # now and then, the parent dies before or while it starts its workers
                time.sleep(rng.uniform(0.0, 0.3))
                kill_9(proc.pid)
                proc.wait()
                continue
            workers = wait_for_workers(proc, WORKERS)
            wait_for_frontier_past(run_dir, frontier, proc)  # each kill tests a new frontier
            time.sleep(rng.uniform(0.0, 0.2))
            assert proc.poll() is None, f"kill {kill}: the run ended on its own (exit {proc.returncode})"
            if kill % 2 == 0:
                kill_9(proc.pid)
                proc.wait()
            else:
                kill_9(rng.choice(workers))
                assert proc.wait() == ExitCode.GENERAL_ERROR  # WORKER_LOST: the others stopped
            wait_until_gone(workers)  # a parent killed takes its workers with it
            prefixes.append((run_dir, _committed_prefix(run_dir)))
            frontier = len(prefixes[-1][1])

        final = run_cli("run", job, "--budget", "0", cwd=tmp_path, timeout=120)
        stats = target.stats()
        requests = target.requests()

    assert final.exit_code == ExitCode.SUCCESS, final.envelope
    run_dir = Path(final.data["run_dir"])
    journal = run_dir / "results.jsonl"
    scan = scan_journal(journal, committed_seq=0, committed_offset=0, row_count=ROWS)
    assert scan.torn_tail is None and scan.last_seq == ROWS
    assert_each_row_once(run_dir, ROWS)
    final_bytes = journal.read_bytes()
    assert all(final_bytes.startswith(prefix) for where, prefix in prefixes if where == run_dir)
    # Delivery: every row reached the target under one key, and each took effect once.
    keys_by_row: dict[str, set[str]] = defaultdict(set)
    for request in requests:
        keys_by_row[request["path"].rsplit("/", 1)[-1]].add(request["idempotency_key"])
    assert set(keys_by_row) == {str(n) for n in range(1, ROWS + 1)}
    assert all(len(keys) == 1 for keys in keys_by_row.values())
    journal_keys = {str(entry.row_number): entry.idempotency_key for entry in read_journal(journal)}
    assert journal_keys == {row: next(iter(keys)) for row, keys in keys_by_row.items()}
    assert stats["effects"] == ROWS
    assert stats["requests"] == ROWS + stats["duplicates"]


def _committed_prefix(run_dir: Path) -> bytes:
    """The journal up to the checkpoint's frontier."""
    checkpoint = read_checkpoint(run_dir)
    if checkpoint is None:
        return b""
    with (run_dir / "results.jsonl").open("rb") as journal:
        return journal.read(checkpoint.offset)
