"""Shared fixtures. Async tests run on asyncio through anyio's pytest plugin (`@pytest.mark.anyio`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


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


@pytest.fixture
def other_file_system(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on another file system than `tmp_path` (tmpfs /dev/shm), where a rename from
    one to the other fails with EXDEV; skipped on a machine without one."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second file system (/dev/shm) beside the test's temporary directory")
    directory = Path(tempfile.mkdtemp(prefix="bulkrelay-test-", dir=shm))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
