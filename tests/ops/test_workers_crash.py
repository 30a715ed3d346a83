"""Issue 44's crash test: 20 kill -9s spread over the parent and the workers of a 4-worker run against
a target that keeps idempotency keys. Every row is journaled once, none takes effect twice, nothing
committed is lost, and no worker outlives its parent."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.store.journal import scan_journal
from tests.clirun import run_cli
from tests.jobfiles import write_job
from tests.runsteps import KILL_LOOP_TARGET, assert_each_row_once, assert_each_row_took_effect_once
from tests.spawnedruns import committed_prefix, run_held_by, spawn_run, wait_for_frontier_past
from tests.targetproc import TargetProcess
from tests.workerprocs import kill_9, wait_for_workers, wait_until_gone

pytestmark = pytest.mark.slow  # real processes: outside the fast lane

ROWS = 6000
WORKERS = 4
KILLS = 20


def test_kill_9_of_the_parent_or_any_worker_keeps_every_row_once(tmp_path: Path) -> None:
    rng = random.Random(20261206)
    runs_root = tmp_path / ".bulkrelay" / "runs"
    prefixes: list[tuple[Path, bytes]] = []  # each kill's committed journal prefix
    frontier = 0
    with TargetProcess(KILL_LOOP_TARGET) as target:
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
            prefixes.append((run_dir, committed_prefix(run_dir)))
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
    assert_each_row_took_effect_once((requests, stats), journal, ROWS)
