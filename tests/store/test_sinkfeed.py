"""The results sink's live feed (store/sinkfeed.py), a process of its own: it upserts the groups the run
says are committed, read back from the journal (never a group past them), records its progress, says
why a sink it cannot write was not written, and ends with its run, a run killed with SIGKILL included."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bulkrelay.store.results import fed_offset
from bulkrelay.store.sinkfeed import SinkFeeder
from tests.runplans import delivered_entry
from tests.sinkfeeders import ended
from tests.store.sinkjournals import append_group, failed_entry, new_run, sqlite_sink, table_of
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # a process a test


def test_the_feeder_upserts_what_it_is_told_is_committed_and_records_its_progress(tmp_path: Path) -> None:
    run = new_run(tmp_path / "runs")
    sink = sqlite_sink(tmp_path)
    first = append_group(run, [delivered_entry(1, key="a"), failed_entry(2, key="b")], 1, 1_000.0)
    second = append_group(run, [delivered_entry(3, key="c")], 3, 1_001.0)
    append_group(run, [delivered_entry(4, key="d")], 4, 1_002.0)  # on disk, but not yet committed
    feeder = SinkFeeder(sink, run, 0)
    feeder.on_commit([], first)
    wait_for(lambda: set(table_of(sink)) == {"a", "b"}, what="the first group in the sink")
    feeder.on_commit([], second)
    feeder.close()
    assert feeder.problem is None
    assert set(table_of(sink)) == {"a", "b", "c"}  # never a group it was not told of
    table = table_of(sink)
    assert table["b"]["success"] == 0 and table["c"]["updated_at"] == "1970-01-01T00:16:41.000000Z"
    assert fed_offset(run, sink) == second
    assert ended(feeder.pid)


def test_a_locked_sink_is_the_feeders_problem_and_claims_nothing(tmp_path: Path) -> None:
    run = new_run(tmp_path / "runs")
    sink = sqlite_sink(tmp_path)
    end = append_group(run, [delivered_entry(1)], 1, 1_000.0)
    assert sink.path is not None
    sqlite3.connect(sink.path).execute("CREATE TABLE held (x)").connection.close()
    other = sqlite3.connect(sink.path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    try:
        feeder = SinkFeeder(sink, run, 0)
        feeder.on_commit([], end)
        feeder.close()
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert feeder.problem is not None and feeder.problem.identity == sink.identity
    assert "locked" in feeder.problem.reason
    assert fed_offset(run, sink) == 0


_RUN = """
import sys, time
from pathlib import Path
from bulkrelay.store.results import SinkTarget
from bulkrelay.store.rundir import RunDir
from bulkrelay.store.sinkfeed import SinkFeeder
path = Path(sys.argv[1])
sink = SinkTarget("sqlite", "sink", "sink", "bulkrelay_results", path.parent / "results.db")
feeder = SinkFeeder(sink, RunDir.open(path), 0)
print(feeder.pid, flush=True)
time.sleep(600)
"""


def test_the_feeder_ends_when_its_run_is_killed(tmp_path: Path) -> None:
    run = new_run(tmp_path / "runs")
    relay = subprocess.Popen([sys.executable, "-c", _RUN, str(run.path)], stdout=subprocess.PIPE)
    try:
        assert relay.stdout is not None
        pid = int(relay.stdout.readline())
        assert not ended(pid)
    finally:
        relay.send_signal(signal.SIGKILL)
        relay.communicate()
    try:
        wait_for(lambda: ended(pid), what=f"the feeder {pid} to end with its run")
    finally:
        if not ended(pid):
            os.kill(pid, signal.SIGKILL)
