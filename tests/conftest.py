"""Shared fixtures. Async tests run on asyncio through anyio's pytest plugin (`@pytest.mark.anyio`)."""

from __future__ import annotations

import os
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
