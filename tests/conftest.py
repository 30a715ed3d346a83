"""Shared fixtures. Async tests run on asyncio through anyio's pytest plugin (`@pytest.mark.anyio`)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
