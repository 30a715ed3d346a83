"""A whole run holds its threads to one CPU while relaying (execution.pin_cpu, relay/affinity.py),
and gives them back after; `pin_cpu: false` leaves them where the system put them. The results
sink's feeder keeps to the other CPUs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bulkrelay.errors import ExitCode
from bulkrelay.relay.progress import CallbackReporter, Snapshot
from tests.jobfiles import write_job
from tests.runsteps import run_here
from tests.sinkfeeders import feeders_of
from tests.targetproc import TargetProcess

pytestmark = pytest.mark.slow  # a target process

ROWS = 40


def _cpus_seen_while_relaying(tmp_path: Path, target: TargetProcess, **execution: object) -> list[set[int]]:
    job = write_job(tmp_path, target.url, rows=ROWS, execution=execution)
    seen: list[set[int]] = []

    def on_progress(snapshot: Snapshot) -> None:  # on the event loop's thread, inside the relay
        seen.append(os.sched_getaffinity(0))

    result = run_here(job, reporter=CallbackReporter(on_progress))
    assert result.exit_code == ExitCode.SUCCESS, result
    assert seen
    return seen


def test_the_relay_runs_on_one_cpu_and_gives_the_others_back(
    tmp_path: Path, target: TargetProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    before = os.sched_getaffinity(0)
    seen = _cpus_seen_while_relaying(tmp_path, target)
    if len(before) < 2:  # one CPU allowed: nothing to pin
        assert all(cpus == before for cpus in seen)
    else:
        assert len(seen[0]) == 1 and seen[0] <= before
        assert all(cpus == seen[0] for cpus in seen)
    assert os.sched_getaffinity(0) == before


def test_pin_cpu_false_leaves_every_cpu(
    tmp_path: Path, target: TargetProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    before = os.sched_getaffinity(0)
    seen = _cpus_seen_while_relaying(tmp_path, target, pin_cpu=False)
    assert all(cpus == before for cpus in seen)


def test_the_results_sinks_feeder_keeps_off_the_relays_cpu(
    tmp_path: Path, target: TargetProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sink's feeder (a process of the run's: store/sinkfeed.py) decodes the committed lines and
    upserts them beside the relay, never on its CPU (issue 39): pinned with it, that was the relay's time."""
    monkeypatch.chdir(tmp_path)
    before = os.sched_getaffinity(0)
    job = write_job(tmp_path, target.url, rows=ROWS, results={"to": "sqlite:///results.db"})
    seen: list[tuple[set[int], set[int]]] = []

    def on_progress(snapshot: Snapshot) -> None:
        (feeder,) = feeders_of(os.getpid())
        seen.append((os.sched_getaffinity(0), os.sched_getaffinity(feeder)))

    result = run_here(job, reporter=CallbackReporter(on_progress))
    assert result.exit_code == ExitCode.SUCCESS, result
    assert seen
    for relay, feeder in seen:
        if len(before) < 2:  # one CPU allowed: nothing to pin
            assert relay == feeder == before
        else:
            assert len(relay) == 1 and feeder == before - relay
    assert os.sched_getaffinity(0) == before
    assert feeders_of(os.getpid()) == []  # it ended with the run
