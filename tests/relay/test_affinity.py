"""The relay's threads on one CPU (relay/affinity.py): pinned while relaying, as before afterwards;
a CPU another relay of the machine holds is never taken."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from bulkrelay.job.config import JobConfig, config_semantic_dict
from bulkrelay.relay.affinity import CLAIMS_DIR_ENV, relay_cpu
from tests.waiting import wait_for


@pytest.fixture(autouse=True)
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own directory of CPU claims."""
    monkeypatch.setenv(CLAIMS_DIR_ENV, str(tmp_path / "cpus"))
    return tmp_path / "cpus"


def _in_thread(action: Callable[[], set[int]]) -> set[int]:
    """What `action` returns in a thread of its own (started now, ended before this returns)."""
    seen: list[set[int]] = []
    thread = threading.Thread(target=lambda: seen.append(action()))
    thread.start()
    thread.join()
    return seen[0]


def _own_cpus() -> set[int]:
    return os.sched_getaffinity(0)


def test_while_relaying_every_thread_shares_the_cpu_the_relay_started_on() -> None:
    before = _own_cpus()
    held = threading.Event()
    looked = threading.Event()
    done = threading.Event()
    older: list[set[int]] = []

    def running_before() -> None:  # a thread that was there before the relay began
        held.wait()
        older.append(_own_cpus())
        looked.set()
        done.wait()
        older.append(_own_cpus())

    thread = threading.Thread(target=running_before)
    thread.start()
    try:
        with relay_cpu(True) as cpu:
            held.set()
            if len(before) < 2:  # a machine (or a cgroup) of one CPU: nothing to pin
                assert cpu is None
                assert _own_cpus() == before
            else:
                assert cpu in before
                assert _own_cpus() == {cpu}
                assert _in_thread(_own_cpus) == {cpu}  # started while relaying: inherited
                looked.wait()
                assert older[0] == {cpu}
    finally:
        done.set()
        thread.join()
    assert _own_cpus() == before
    assert older[1] == before
    assert _in_thread(_own_cpus) == before


def test_a_spared_thread_keeps_off_the_relays_cpu_and_gets_its_cpus_back() -> None:
    """A thread that works beside the relay without waiting on it (the results sink's, issue 39) runs
    on the CPUs the relay does not hold: pinned with it, its work was the relay's CPU time lost."""
    before = _own_cpus()
    held = threading.Event()
    done = threading.Event()
    seen: list[set[int]] = []

    def beside() -> None:
        held.wait()
        seen.append(_own_cpus())
        done.wait()
        seen.append(_own_cpus())

    thread = threading.Thread(target=beside)
    thread.start()
    assert thread.native_id is not None
    try:
        with relay_cpu(True, spared=[thread.native_id]) as cpu:
            held.set()
            wait_for(lambda: len(seen) == 1, what="the spared thread's CPUs")
            if cpu is None:  # one CPU allowed: nothing pinned, nothing spared
                assert seen[0] == before
            else:
                assert _own_cpus() == {cpu}
                assert seen[0] == before - {cpu}
    finally:
        held.set()
        done.set()
        thread.join()
    assert seen[1] == before


def test_pin_cpu_false_leaves_the_threads_where_they_were() -> None:
    before = _own_cpus()
    with relay_cpu(False) as cpu:
        assert cpu is None
        assert _own_cpus() == before


def test_the_cpus_come_back_when_the_relay_raises() -> None:
    before = _own_cpus()
    with pytest.raises(RuntimeError), relay_cpu(True):
        raise RuntimeError("the relay failed")
    assert _own_cpus() == before


def test_a_system_that_refuses_part_way_gets_every_thread_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container may refuse sched_setaffinity; refused after some threads were pinned, the relay
    runs unpinned and the pinned ones get their CPUs back."""
    before = _own_cpus()
    if len(before) < 2:  # the refusal happens only where there is something to pin
        with relay_cpu(True) as cpu:
            assert cpu is None
        return
    real = os.sched_setaffinity
    calls: list[set[int]] = []
    held = threading.Event()
    other = threading.Thread(target=held.wait)  # a second thread: the second call is refused
    other.start()

    def refusing(tid: int, cpus: set[int]) -> None:
        calls.append(set(cpus))
        if len(calls) == 2:
            raise PermissionError(1, "Operation not permitted")
        real(tid, cpus)

    monkeypatch.setattr(os, "sched_setaffinity", refusing)
    try:
        with relay_cpu(True) as cpu:
            assert cpu is None
            assert _own_cpus() == before
    finally:
        held.set()
        other.join()
    assert len(calls) > 2  # pinning began, then everything was set back


def test_pin_cpu_is_on_by_default_and_out_of_the_fingerprint() -> None:
    """How the rows travel, not what they say: switching it never blocks a resume."""
    base = {
        "version": 1,
        "input": {"file": "in.csv"},
        "request": {"method": "POST", "url": "http://127.0.0.1/x"},
    }
    pinned = JobConfig.model_validate(base)
    unpinned = JobConfig.model_validate({**base, "execution": {"pin_cpu": False}})
    assert pinned.execution.pin_cpu is True
    assert unpinned.execution.pin_cpu is False
    assert config_semantic_dict(pinned) == config_semantic_dict(unpinned)


def _hold(stack: ExitStack, claims: Path, cpu: int) -> None:
    """CPU `cpu` held as another relay holds it (its own open file, so its own lock) until `stack` ends."""
    claims.mkdir(mode=0o700, exist_ok=True)
    held = stack.enter_context((claims / f"cpu{cpu}").open("a"))
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _start_on(cpu: int, allowed: set[int]) -> None:
    """This thread on `cpu`, then free to run on `allowed` (it stays where it is until moved)."""
    os.sched_setaffinity(0, {cpu})
    os.sched_setaffinity(0, allowed)


def test_a_cpu_another_relay_holds_is_not_taken(claims: Path) -> None:
    before = _own_cpus()
    with ExitStack() as stack:
        if len(before) < 2:
            with relay_cpu(True) as cpu:
                assert cpu is None
            return
        free = max(before)
        for each in before - {free}:
            _hold(stack, claims, each)
        _start_on(min(before), before)  # on a held CPU when the relay starts
        with relay_cpu(True) as cpu:
            assert cpu == free
            assert _own_cpus() == {free}
    assert _own_cpus() == before


def test_with_every_cpu_held_the_relay_is_not_pinned(claims: Path) -> None:
    before = _own_cpus()
    with ExitStack() as stack:
        for each in before:
            _hold(stack, claims, each)
        with relay_cpu(True) as cpu:
            assert cpu is None
            assert _own_cpus() == before


def test_the_claim_is_given_back_when_the_relay_ends(claims: Path) -> None:
    with relay_cpu(True) as cpu:
        pass
    if cpu is None:  # one CPU allowed: nothing was claimed
        assert not claims.exists() or not list(claims.iterdir())
        return
    with ExitStack() as stack:
        _hold(stack, claims, cpu)  # would raise BlockingIOError if it were still held


def test_a_claims_dir_that_others_may_write_is_not_used(claims: Path) -> None:
    """A directory made by someone else (in /tmp, anyone can) is not trusted: the relay pins to its
    CPU unclaimed, as before claims, and creates nothing there."""
    before = _own_cpus()
    claims.mkdir()
    claims.chmod(0o777)
    with relay_cpu(True) as cpu:
        if len(before) >= 2:
            assert cpu in before and _own_cpus() == {cpu}
    assert list(claims.iterdir()) == []


def _claimer(start: int, allowed: set[int]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.relay.cpuclaimer", str(start), ",".join(map(str, sorted(allowed)))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _claimed(proc: subprocess.Popen[str]) -> tuple[int | None, set[int]]:
    """What the process holds and the CPUs it may use, from its line (it prints it once it holds)."""
    assert proc.stdout is not None
    said = json.loads(proc.stdout.readline())
    return said["cpu"], set(said["cpus"])


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.communicate()  # waits, and closes its pipes


@pytest.mark.slow  # real processes
def test_processes_started_on_one_cpu_hold_distinct_ones_and_kill_9_frees_them(
    processes: list[subprocess.Popen[str]],
) -> None:
    """Two relays placed on the same CPU (two `--shard` runs started together) end up on two; a third
    finds both held and is not pinned; a relay killed by -9 gives its CPU back."""
    allowed = set(sorted(_own_cpus())[:2])
    if len(allowed) < 2:
        processes.append(_claimer(min(allowed), allowed))
        assert _claimed(processes[0]) == (None, allowed)
        return
    first, second = _claimer(min(allowed), allowed), _claimer(min(allowed), allowed)
    processes.extend([first, second])
    one, two = _claimed(first), _claimed(second)
    assert {one[0], two[0]} == allowed
    assert one[1] == {one[0]} and two[1] == {two[0]}
    third = _claimer(min(allowed), allowed)  # started after the first two hold theirs
    processes.append(third)
    assert _claimed(third) == (None, allowed)
    first.send_signal(signal.SIGKILL)
    first.wait()
    processes.append(_claimer(min(allowed), allowed))
    assert _claimed(processes[-1]) == (one[0], {one[0]})
