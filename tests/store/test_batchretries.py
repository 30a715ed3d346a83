"""batch-retries.jsonl: the numbers of a batch run's requests sent again, durable and read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from bulkrelay.errors import RunDirUnsafe
from bulkrelay.store.batchretries import BatchRetries
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.storage import Storage

pytestmark = pytest.mark.anyio


async def test_the_numbers_given_are_durable_and_an_earlier_processs_are_used_once(tmp_path: Path) -> None:
    path = tmp_path / "batch-retries.jsonl"
    first = BatchRetries(path, Storage())
    await first.record([7, 14], 1)
    await first.record([7, 14], 2)  # the same rows again: a new request, a new key
    await first.record([21], 1)
    assert first.earlier([7, 14]) is None  # a process's own requests are not "earlier"
    resumed = BatchRetries(path, Storage())
    assert resumed.earlier([7, 14]) == 2  # the latest request of those rows
    assert resumed.earlier([7, 14]) is None  # once: the next request of them is a new one
    assert resumed.earlier([14, 7]) is None and resumed.earlier([21]) == 1
    assert path.stat().st_mode & 0o777 == 0o600


async def test_a_line_cut_by_a_crash_is_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "batch-retries.jsonl"
    path.write_bytes(b'{"retry":1,"rows":[3]}\n{"retry":2,"rows":[5,')
    retries = BatchRetries(path, Storage())
    assert retries.earlier([3]) == 1 and retries.earlier([5]) is None
    await retries.record([5], 2)  # the cut request never left: its number is given again
    assert BatchRetries(path, Storage()).earlier([5]) == 2


async def test_a_number_is_fsynced_before_it_is_given(tmp_path: Path) -> None:
    storage = FaultyStorage()
    retries = BatchRetries(tmp_path / "batch-retries.jsonl", storage)
    await retries.record([1], 1)
    assert storage.calls == ["write", "fsync", "fsync_dir"]  # the new file's name too
    await retries.record([2], 1)
    assert storage.calls == ["write", "fsync", "fsync_dir", "write", "fsync"]


def test_a_link_in_its_place_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(b'{"retry":1,"rows":[3]}\n')
    (tmp_path / "batch-retries.jsonl").symlink_to(elsewhere)
    with pytest.raises(RunDirUnsafe):
        BatchRetries(tmp_path / "batch-retries.jsonl", Storage())
