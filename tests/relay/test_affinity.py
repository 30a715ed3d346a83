"""The relay's threads on one CPU (relay/affinity.py): pinned while relaying, as before afterwards."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from bulkrelay.job.config import JobConfig, config_semantic_dict
from bulkrelay.relay.affinity import relay_cpu


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
