"""Crashes and storage failures with real processes: a kill -9 loop against a deduplicating target,
and a failed fsync injected through the storage seam (and, where strace exists, into the real syscall)."""

from __future__ import annotations

import errno
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bulkrelay.errors import ExitCode, StorageFailed
from bulkrelay.job.config import load_job
from bulkrelay.job.preflight import run_preflight
from bulkrelay.ops.lifecycle import RunOptions, plan_for, relay_locked
from bulkrelay.relay.engine import StartPoint
from bulkrelay.relay.progress import NullReporter
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.journal import decode_line, is_commit_marker, scan_journal
from bulkrelay.store.rundir import RunDir
from tests.clirun import cli_env, run_cli
from tests.jobfiles import write_job
from tests.runsteps import (
    KILL_LOOP_TARGET,
    assert_each_row_once,
    assert_each_row_took_effect_once,
    resume,
    sent_ids,
    stop_midway,
)
from tests.spawnedruns import committed_prefix, run_held_by, spawn_run, wait_for_frontier_past
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

CRASH_ROWS = 3000
KILLS = 24
CRASH_JOB: dict[str, Any] = {
    "input": {"key": "id"},
    "request": {"idempotency_key": {"header": "Idempotency-Key"}},
    "execution": {"concurrency": 8, "rate_limit": {"requests_per_second": 250}},
}


def _valid_prefix(run_dir: Path) -> bytes:
    """The journal up to its last commit marker before any damage: the whole groups a kill -9 left
    written (the lines of a group without its marker were never committed, and resume cuts them)."""
    journal = run_dir / "results.jsonl"
    if not journal.exists():
        return b""
    kept, whole = [], 0
    for line in journal.read_bytes().splitlines(keepends=True):
        if is_commit_marker(line):
            kept.append(line)
            whole = len(kept)
            continue
        try:
            decode_line(line)
        except ValueError:
            break
        kept.append(line)
    return b"".join(kept[:whole])


def test_kill_9_loop_loses_nothing_committed_and_every_row_takes_effect_once(tmp_path: Path) -> None:
    rng = random.Random(20261002)
    runs_root = tmp_path / ".bulkrelay" / "runs"
    snapshots: list[tuple[Path, bytes]] = []  # each kill's committed journal prefix
    frontier = 0  # the checkpoint's offset at the last kill
    with TargetProcess(KILL_LOOP_TARGET) as target:
        job = write_job(tmp_path, target.url, rows=CRASH_ROWS, **CRASH_JOB)
        for kill in range(KILLS):
            proc = spawn_run(tmp_path, job)
            if kill % 6 == 5:  # now and then, die during start-up (preflight, recovery) instead
                time.sleep(rng.uniform(0.05, 0.4))
                run_dir = None
            else:
                run_dir = run_held_by(runs_root, proc)
                # Kill only once this process has moved the checkpoint on, so that every such kill
                # tests a new frontier whatever the machine's load (a time alone did not ensure it).
                wait_for_frontier_past(run_dir, frontier, proc)
                time.sleep(rng.uniform(0.0, 0.2))
            assert proc.poll() is None, f"kill {kill}: the run ended on its own (exit {proc.returncode})"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if run_dir is not None:
                snapshots.append((run_dir, committed_prefix(run_dir)))
                snapshots.append((run_dir, _valid_prefix(run_dir)))
                frontier = len(snapshots[-2][1])

        final = run_cli("run", job, "--budget", "0", cwd=tmp_path, timeout=60)

        stats = target.stats()
        requests = target.requests()
    assert final.exit_code == ExitCode.SUCCESS, final.envelope
    run_dir = Path(final.data["run_dir"])
    _assert_journal_whole(run_dir)
    _assert_committed_prefixes_kept(run_dir, snapshots)
    for other in runs_root.glob("*/run.json"):  # a kill between creating a run and indexing it
        journal = other.parent / "results.jsonl"
        assert other.parent == run_dir or journal.stat().st_size == 0  # leaves its journal empty
    # Delivery: every row reached the target; each row's key never changed; each took effect once.
    assert_each_row_took_effect_once((requests, stats), run_dir / "results.jsonl", CRASH_ROWS)


def _assert_journal_whole(run_dir: Path) -> None:
    journal = run_dir / "results.jsonl"
    assert read_checkpoint(run_dir) is None  # completed: it keeps none; every group has its marker
    assert is_commit_marker(journal.read_bytes().splitlines(keepends=True)[-1])
    scan = scan_journal(journal, committed_seq=0, committed_offset=0, row_count=CRASH_ROWS)
    assert scan.torn_tail is None and scan.last_seq == CRASH_ROWS and scan.valid_end == journal.stat().st_size
    assert_each_row_once(run_dir, CRASH_ROWS)


def _assert_committed_prefixes_kept(run_dir: Path, snapshots: list[tuple[Path, bytes]]) -> None:
    final = (run_dir / "results.jsonl").read_bytes()
    ours = [prefix for where, prefix in snapshots if where == run_dir]
    assert len(ours) >= 2 * (KILLS - KILLS // 6 - 1)  # nearly every kill hit the one run
    checkpointed = [len(prefix) for prefix in ours[::2]]
    assert checkpointed == sorted(set(checkpointed))  # the frontier moved on between every two kills
    for prefix in ours:
        assert final.startswith(prefix)


# ---------------------------------------------------------------- a failed fsync


FSYNC_ROWS = 800
SLOW_TARGET = {"rules": [{"delay_ms": 10}]}  # ~400 rows/s: 2 s for all rows


@pytest.mark.target_plan(SLOW_TARGET)
def test_a_failed_fsync_through_the_storage_seam_stops_without_advancing_the_checkpoint(
    tmp_path: Path, target: TargetProcess
) -> None:
    job = write_job(tmp_path, target.url, rows=FSYNC_ROWS)
    preflight = run_preflight(load_job(job))
    # The journal's 60th fsync fails: batches commit about every 10 ms, so that is past a checkpoint.
    storage = FaultyStorage(only="results.jsonl", fail_fsync_at=60)
    run = RunDir.create(tmp_path / "runs", plan_for(preflight), storage)

    with run.locked(), pytest.raises(StorageFailed, match=r"fsync failed on .*results\.jsonl") as failed:
        relay_locked(
            preflight, run, StartPoint(), options=RunOptions(handle_signals=False), reporter=NullReporter()
        )

    assert failed.value.exit_code == ExitCode.GENERAL_ERROR and failed.value.code == "STORAGE_FAILED"
    assert failed.value.context["errno"] == errno.EIO
    checkpoint = read_checkpoint(run.path)
    assert checkpoint is not None, "a checkpoint was written before the failure"
    assert checkpoint.offset in storage.synced_sizes  # never past what was fsynced
    assert RunDir.open(run.path).state == "running"  # left as a crash leaves it: resumable

    result = resume(tmp_path, run.path)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(run.path, FSYNC_ROWS)
    assert len(sent_ids(target)) == FSYNC_ROWS


_STRACE_LINE = re.compile(r"^\d+\s+(write|fsync)\(\d+.*\)\s+=\s+(-?\d+)")


def _fsynced_bytes(trace: Path) -> int:
    """Bytes written to the journal before its last successful fsync, from an strace log."""
    written = synced = 0
    for line in trace.read_text().splitlines():
        match = _STRACE_LINE.match(line)
        if match is None:
            continue
        call, value = match.group(1), int(match.group(2))
        if call == "write" and value > 0:
            written += value
        elif call == "fsync" and value == 0:
            synced = written
    return synced


@pytest.mark.target_plan(SLOW_TARGET)
def _strace_fsync_failure(tmp_path: Path, target: TargetProcess) -> None:
    """The real syscall fails (strace injects EIO into the resume's 3rd journal fsync)."""
    job = write_job(tmp_path, target.url, rows=FSYNC_ROWS)
    run_dir = Path(stop_midway(tmp_path, job).data["run_dir"])
    journal = run_dir / "results.jsonl"
    size_before = journal.stat().st_size
    trace = tmp_path / "strace.log"
    command = [
        *("strace", "-f", "-qq", "-o", str(trace), "-P", str(journal)),
        *("-e", "trace=write,fsync", "-e", "inject=fsync:error=EIO:when=3"),
        *(sys.executable, "-m", "bulkrelay", "resume", str(run_dir), "--budget", "0"),
    ]
    proc = subprocess.run(command, cwd=tmp_path, env=cli_env(), capture_output=True, timeout=60, check=False)

    assert proc.returncode == ExitCode.GENERAL_ERROR, proc.stdout
    assert b'"code":"STORAGE_FAILED"' in proc.stdout and b"Input/output error" in proc.stdout
    checkpoint = read_checkpoint(run_dir)
    assert checkpoint is not None
    assert checkpoint.offset <= size_before + _fsynced_bytes(trace)

    result = resume(tmp_path, run_dir)

    assert result.exit_code == ExitCode.SUCCESS, result.envelope
    assert_each_row_once(run_dir, FSYNC_ROWS)


# The storage-seam test above holds everywhere; this one runs the real CLI and needs strace.
if shutil.which("strace") is not None:
    test_a_failed_fsync_injected_by_strace_ends_with_storage_failed = _strace_fsync_failure
