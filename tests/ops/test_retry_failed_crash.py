"""The identical `retry-failed` after its process was killed continues the unfinished child, as the
identical `run` continues its run: a second child would send again what the first delivered (issue 38
item 2). And `runs` lists the killed child as `interrupted`, never `running` for ever.

Real processes and kill -9 against the loopback target.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import BulkRelayError, ExitCode
from bulkrelay.store.checkpoint import read_checkpoint
from bulkrelay.store.rundir import is_locked
from tests.background.jobcli import cli
from tests.clirun import run_cli, start_cli
from tests.taggedjobs import journal, run_job, tag_rule, write_job
from tests.targetproc import TargetProcess
from tests.waiting import HANG_BUDGET, HANG_S, wait_for

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

_ROWS, _FIRST_BAD = 50, 11  # rows 11-50 fail in the parent
_DELIVERED = 10  # the child's rows answered before its process is killed (the next one is held)


def _ids(requests: list[dict[str, object]]) -> list[int]:
    return [int(orjson.loads(str(r["body"]))["id"]) for r in requests]


def test_the_identical_retry_failed_after_a_kill_continues_its_child(tmp_path: Path) -> None:
    tags = {n: "bad" for n in range(_FIRST_BAD, _ROWS + 1)}
    with TargetProcess({"rules": [tag_rule("bad", status=422)]}) as target:
        job = write_job(tmp_path, target.url, rows=_ROWS, tags=tags, execution={"concurrency": 1})
        parent = run_job(job)
        assert parent.exit_code == ExitCode.PARTIAL_FAILURE, parent.envelope
        parent_dir = parent.data["run_dir"]

        target.set_plan({"rules": [{"after": _DELIVERED, "delay_ms": int(HANG_S * 1000)}]})
        target.reset()
        killed = start_cli("retry-failed", parent_dir, "--budget", "0", cwd=tmp_path, output="discarded")
        runs = Path(parent_dir).parent
        child_dir = wait_for(lambda: _child_with(runs, parent_dir, _DELIVERED), "the child's checkpoint")
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        wait_for(lambda: not is_locked(child_dir), "the killed child's lock to go")
        delivered = {e["row_number"] for e in journal(child_dir) if e["success"]}
        assert len(delivered) >= _DELIVERED

        listed = run_cli("runs", "--runs-dir", runs, cwd=tmp_path)
        [row] = [r for r in listed.data["runs"] if r["run_dir"] == str(child_dir)]
        assert row["state"] == "interrupted", row

        target.set_plan({})
        sent_before = len(target.requests())
        # Under a short budget: handed off at once (the worker's start-up outlasts it), naming the child
        # and its committed progress; its job then continues that child to its end.
        again = cli(tmp_path, "retry-failed", parent_dir, "--budget", "100ms")
        assert again.data["run_dir"] == str(child_dir), again.envelope  # the same child, continued
        if again.exit_code == ExitCode.INCOMPLETE:
            assert again.data["progress"]["done"] >= len(delivered), again.envelope
            again = cli(tmp_path, "job", "wait", again.data["job_id"], "--budget", HANG_BUDGET)
        assert again.exit_code == ExitCode.SUCCESS, again.envelope
        assert again.data["run_dir"] == str(child_dir), again.envelope
        assert again.data["parent_run"] == parent.data["run_id"]
        resent = set(_ids(target.requests()[sent_before:])) & delivered
        assert not resent, f"rows the killed child delivered were sent again: {sorted(resent)}"
        rows = journal(child_dir)
        assert {e["row_number"] for e in rows if e["success"]} == set(range(_FIRST_BAD, _ROWS + 1))
        assert len([d for d in runs.iterdir() if (d / "run.json").is_file()]) == 2  # parent and one child


def _child_with(runs: Path, parent_dir: str, rows: int) -> Path | None:
    """The parent's child run once its checkpoint holds `rows` successes."""
    for run_dir in runs.iterdir():
        if str(run_dir) == parent_dir or not (run_dir / "run.json").is_file():
            continue
        with suppress(BulkRelayError, OSError):  # a checkpoint being replaced
            checkpoint = read_checkpoint(run_dir)
            if checkpoint is not None and checkpoint.ok >= rows:
                return run_dir
    return None
