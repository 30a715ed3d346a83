"""checkpoint.json: atomic replace, strict reading."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import JournalCorrupt
from bulkrelay.store.checkpoint import CHECKPOINT_FILE, Checkpoint, read_checkpoint, write_checkpoint
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.journal import CommittedPrefix
from bulkrelay.store.rowset import RowSet

CP = Checkpoint(seq=12, offset=3456, rows_done=12, ok=10, failed=2, updated_at="2026-11-29T14:15:00.000000Z")


def test_round_trip(tmp_path: Path) -> None:
    spy = FaultyStorage()
    write_checkpoint(tmp_path, CP, spy)
    assert read_checkpoint(tmp_path) == CP
    assert len(spy.dir_fsyncs) == 1
    assert os.listdir(tmp_path) == [CHECKPOINT_FILE]


def test_replacing_keeps_only_the_newest(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CP)
    newer = Checkpoint(seq=20, offset=5000, rows_done=20, ok=18, failed=2, updated_at="later")
    write_checkpoint(tmp_path, newer)
    assert read_checkpoint(tmp_path) == newer


def test_missing_checkpoint_is_none(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path) is None


def test_file_holds_counters_not_row_lists(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, CP)
    raw = orjson.loads((tmp_path / CHECKPOINT_FILE).read_bytes())
    assert raw == {
        "seq": 12,
        "offset": 3456,
        "rows_done": 12,
        "ok": 10,
        "failed": 2,
        "updated_at": "2026-11-29T14:15:00.000000Z",
        "version": 1,
    }


def test_malformed_json_names_checkpoint_json(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_FILE).write_bytes(b'{"seq": 1, "off')
    with pytest.raises(JournalCorrupt, match=CHECKPOINT_FILE):
        read_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"seq": "12"}, "'seq' must be a non-negative integer"),
        ({"offset": -1}, "'offset' must be a non-negative integer"),
        ({"ok": True}, "'ok' must be a non-negative integer"),
        ({"failed": None}, "'failed' must be a non-negative integer"),
        ({"updated_at": 5}, "'updated_at' must be a string"),
        ({"version": 99}, "unsupported version 99"),
        ({"ok": 11}, "ok \\+ failed does not equal rows_done"),
    ],
)
def test_wrong_fields_are_refused(tmp_path: Path, change: dict[str, object], reason: str) -> None:
    raw = {"seq": 12, "offset": 3456, "rows_done": 12, "ok": 10, "failed": 2, "updated_at": "x", "version": 1}
    (tmp_path / CHECKPOINT_FILE).write_bytes(orjson.dumps({**raw, **change}))
    with pytest.raises(JournalCorrupt, match=reason) as caught:
        read_checkpoint(tmp_path)
    assert CHECKPOINT_FILE in caught.value.message
    assert caught.value.context["file"] == str(tmp_path / CHECKPOINT_FILE)


def test_a_json_array_is_refused(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"[1, 2]")
    with pytest.raises(JournalCorrupt, match="not a JSON object"):
        read_checkpoint(tmp_path)


def test_the_journal_prefix_round_trips_packed(tmp_path: Path) -> None:
    done = RowSet(100_000)
    for row in range(1, 60_001):
        done.add(row)
    prefix = CommittedPrefix(
        seq=60_000, offset=9_000_000, ok=59_000, sha256="ab" * 32, done_rows=done.to_bytes()
    )
    cp = Checkpoint(
        seq=60_000, offset=9_000_000, rows_done=60_000, ok=59_000, failed=1_000, updated_at="t", prefix=prefix
    )
    write_checkpoint(tmp_path, cp)
    assert read_checkpoint(tmp_path) == cp
    raw = orjson.loads((tmp_path / CHECKPOINT_FILE).read_bytes())
    assert set(raw["journal_prefix"]) == {"sha256", "done_rows"}
    assert len(raw["journal_prefix"]["done_rows"]) < 1_000  # 12.5 KB of bits, mostly runs of ones


@pytest.mark.parametrize(
    "prefix",
    [
        {"sha256": "ab"},
        {"sha256": 5, "done_rows": ""},
        {"sha256": "ab", "done_rows": "not base64!"},
        {"sha256": "ab", "done_rows": base64.b64encode(b"not zlib").decode()},
        "ab",
    ],
)
def test_a_damaged_journal_prefix_is_malformed(tmp_path: Path, prefix: object) -> None:
    write_checkpoint(tmp_path, CP)
    raw = orjson.loads((tmp_path / CHECKPOINT_FILE).read_bytes())
    (tmp_path / CHECKPOINT_FILE).write_bytes(orjson.dumps({**raw, "journal_prefix": prefix}))
    with pytest.raises(JournalCorrupt) as caught:
        read_checkpoint(tmp_path)
    assert "journal_prefix" in caught.value.message
    assert caught.value.context["file"] == str(tmp_path / CHECKPOINT_FILE)
