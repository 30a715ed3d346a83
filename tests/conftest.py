"""Shared fixtures, one per concept. Async tests run on asyncio through anyio's pytest plugin
(`@pytest.mark.anyio`). Helpers live in helper modules (tests/*.py, tests/<room>/*.py), never in a test
module (CONTRIBUTING.md, "How the tests are organised")."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.pgserver import PostgresServer
from tests.pgserver import missing as postgres_missing
from tests.targetproc import TargetProcess


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of real-process (`slow`) tests first, each kept whole and in its order: xdist hands
    the tests out in this order, so the quick in-process ones fill the end on both cores, where a kill
    loop that started last used to leave one core idle for its last minute."""
    heavy = {_module_of(item) for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: _module_of(item) not in heavy)


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Background jobs started by tests keep their state here, never in the user's own state dir."""
    state = tmp_path_factory.mktemp("bulkrelay-state")
    previous = os.environ.get("BULKRELAY_STATE_DIR")
    os.environ["BULKRELAY_STATE_DIR"] = str(state)
    yield state
    if previous is None:
        del os.environ["BULKRELAY_STATE_DIR"]
    else:
        os.environ["BULKRELAY_STATE_DIR"] = previous


@pytest.fixture(autouse=True, scope="session")
def _private_cpu_claims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The relays of a test session claim CPUs among themselves (relay/affinity.py), not against the
    relays, benchmarks and test sessions of other people on the machine."""
    previous = os.environ.get("BULKRELAY_CPU_DIR")
    os.environ["BULKRELAY_CPU_DIR"] = str(tmp_path_factory.mktemp("bulkrelay-cpus"))
    yield
    if previous is None:
        del os.environ["BULKRELAY_CPU_DIR"]
    else:
        os.environ["BULKRELAY_CPU_DIR"] = previous


@pytest.fixture
def target(request: pytest.FixtureRequest, _module_target: TargetProcess | None) -> Iterator[TargetProcess]:
    """The loopback target in its own process (tests/targetproc.py, `bulkrelay/demo/target.py`), fresh
    for each test. Its fault plan is the nearest `@pytest.mark.target_plan(plan)`: the test's, its
    class's or its module's (`pytestmark`); without one, every request gets 200 and is recorded.

        pytestmark = [pytest.mark.slow, pytest.mark.target_plan({"rules": [{"delay_ms": 10}]})]

    In a module marked `shared_target`, its tests share one (each sets the plan it needs first, with
    `set_plan` or `reset`): a start costs a second or two on a busy machine.
    """
    if _module_target is not None:
        yield _module_target
        return
    with TargetProcess(_plan(request.node)) as running:
        yield running


@pytest.fixture(scope="module")
def _module_target(request: pytest.FixtureRequest) -> Iterator[TargetProcess | None]:
    """The target a `shared_target` module's tests share (with the module's plan), else None."""
    if request.node.get_closest_marker("shared_target") is None:
        yield None
        return
    with TargetProcess(_plan(request.node)) as running:
        yield running


def _plan(node: pytest.Item | pytest.Collector) -> dict[str, Any] | None:
    marker = node.get_closest_marker("target_plan")
    return None if marker is None else cast(dict[str, Any], marker.args[0])


# Where a directory on another file system than the test's temporary one may be made, in order of
# preference: tmpfs first (Linux always has /dev/shm), then the disk under the checkout.
_OTHER_FILE_SYSTEM_CANDIDATES = (
    Path("/dev/shm"),
    Path("/var/tmp"),
    Path(__file__).resolve().parent.parent,
    Path.home(),
)


@pytest.fixture
def other_file_system(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on another file system than `tmp_path`, where a rename from one to the other
    fails with EXDEV. Fails, never skips, on a machine where none of the candidates is one: the tests
    that use it would prove nothing there."""
    here = tmp_path.stat().st_dev
    for candidate in _OTHER_FILE_SYSTEM_CANDIDATES:
        if candidate.is_dir() and os.access(candidate, os.W_OK) and candidate.stat().st_dev != here:
            directory = Path(tempfile.mkdtemp(prefix=".bulkrelay-test-", dir=candidate))
            yield directory
            shutil.rmtree(directory, ignore_errors=True)
            return
    listed = ", ".join(str(candidate) for candidate in _OTHER_FILE_SYSTEM_CANDIDATES)
    pytest.fail(f"no writable directory on another file system than {tmp_path} among {listed}")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL cluster on a loopback port, one per test session (per xdist worker)."""
    why = postgres_missing()
    if why is not None:
        pytest.skip(why)
    with PostgresServer.start() as server:
        yield server
