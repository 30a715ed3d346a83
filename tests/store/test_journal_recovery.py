"""Journal replay and recovery: a torn last batch is moved aside, any other damage refuses the resume."""

from __future__ import annotations

import hashlib
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from bulkrelay.errors import JournalCorrupt, StorageFailed
from bulkrelay.store.checkpoint import CHECKPOINT_FILE, read_checkpoint
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.journal import (
    CommittedPrefix,
    JournalEntry,
    JournalScan,
    JournalWriter,
    decode_line,
    encode_line,
    encode_marker,
    read_commits,
    read_journal,
    read_journal_from,
    recover_torn_tail,
    scan_journal,
)
from bulkrelay.store.journal import rows as journal_module
from bulkrelay.store.rowset import RowSet
from bulkrelay.store.storage import Storage
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

ROWS = 20
BATCHES = (4, 4, 4, 4)  # checkpoint frontier after batch 3: lines 1-12 committed, 13-16 not yet


def line(seq: int, row: int | None = None, **change: Any) -> bytes:
    row = seq if row is None else row
    entry: dict[str, Any] = {
        "row_number": row,
        "success": row % 3 != 0,
        "classification": "ok" if row % 3 else "http_server_error",
        "status_code": 200 if row % 3 else 503,
        "attempts": 1 if row % 3 else 2,
        "retryable": row % 3 == 0,
        "error": None if row % 3 else "HTTP 503",
        "duration_ms": 10.25,
        "key": f"k{row}",
        **change,
    }
    return encode_line(seq, JournalEntry(**entry))


class Journal:
    """A journal of four batches with the checkpoint's frontier at the end of batch three."""

    def __init__(self, directory: Path, lines: list[bytes] | None = None) -> None:
        self.path = directory / "results.jsonl"
        self.lines = lines if lines is not None else [line(seq) for seq in range(1, sum(BATCHES) + 1)]
        self.committed_seq = sum(BATCHES[:-1])
        self.frontier = sum(len(item) for item in self.lines[: self.committed_seq])
        self.data = b"".join(self.lines)

    def write(self, data: bytes | None = None) -> Journal:
        self.path.write_bytes(self.data if data is None else data)
        return self

    def scan(self) -> JournalScan:
        return scan_journal(
            self.path, committed_seq=self.committed_seq, committed_offset=self.frontier, row_count=ROWS
        )

    def ends(self) -> list[int]:
        """Byte offsets where lines end."""
        ends, total = [0], 0
        for item in self.lines:
            total += len(item)
            ends.append(total)
        return ends


def refused(journal: Journal) -> JournalCorrupt:
    with pytest.raises(JournalCorrupt) as caught:
        journal.scan()
    error = caught.value
    assert set(error.context) >= {"offset", "line", "reason"}
    assert f"line {error.context['line']}" in error.message
    assert f"byte offset {error.context['offset']}" in error.message
    return error


# ---------------------------------------------------------------- clean journals


def test_a_clean_journal_rebuilds_done_rows_and_counts(tmp_path: Path) -> None:
    journal = Journal(tmp_path).write()
    scan = journal.scan()
    assert scan.torn_tail is None
    assert scan.last_seq == 16
    assert scan.valid_end == len(journal.data)
    assert list(scan.done.missing()) == [17, 18, 19, 20]
    assert (scan.ok, scan.failed) == (11, 5)
    assert recover_torn_tail(journal.path, scan, Storage()) is None


def test_valid_lines_after_the_frontier_are_kept(tmp_path: Path) -> None:
    """Fsynced before the checkpoint caught up: committed, and kept."""
    journal = Journal(tmp_path).write()
    assert journal.frontier < len(journal.data)
    scan = journal.scan()
    assert scan.torn_tail is None and scan.last_seq == 16 and 16 in scan.done


def test_no_journal_and_no_checkpoint_is_an_empty_run(tmp_path: Path) -> None:
    scan = scan_journal(tmp_path / "results.jsonl", committed_seq=0, committed_offset=0, row_count=5)
    assert scan.last_seq == scan.valid_end == scan.done.count == 0 and scan.torn_tail is None


def test_rows_can_be_in_any_order(tmp_path: Path) -> None:
    rows = [5, 1, 20, 2]
    journal = Journal(tmp_path, [line(seq, row) for seq, row in enumerate(rows, start=1)])
    journal.write()
    scan = scan_journal(journal.path, committed_seq=4, committed_offset=len(journal.data), row_count=ROWS)
    assert sorted(set(range(1, 21)) - set(scan.done.missing())) == sorted(rows)


# ---------------------------------------------------------------- torn tails


def test_truncation_at_every_byte_of_the_uncommitted_batch_is_a_torn_tail(tmp_path: Path) -> None:
    base = Journal(tmp_path)
    ends = base.ends()
    storage = Storage()
    for cut in range(base.frontier, len(base.data) + 1):
        case = tmp_path / f"cut{cut}"
        case.mkdir()
        journal = Journal(case).write(base.data[:cut])
        scan = journal.scan()
        valid_end = max(end for end in ends if end <= cut)
        assert scan.valid_end == valid_end, cut
        assert scan.last_seq == ends.index(valid_end)
        if cut == valid_end:
            assert scan.torn_tail is None
            continue
        assert scan.torn_tail is not None
        assert (scan.torn_tail.start, scan.torn_tail.end) == (valid_end, cut)
        assert scan.torn_tail.line == scan.last_seq + 1
        assert scan.torn_tail.reason == "truncated line (no newline at the end)"
        aside = recover_torn_tail(journal.path, scan, storage)
        assert aside is not None and aside.parent == case
        assert aside.read_bytes() == base.data[valid_end:cut]
        assert journal.path.read_bytes() == base.data[:valid_end]
        again = journal.scan()
        assert again.torn_tail is None and again.last_seq == scan.last_seq


def test_the_aside_file_is_named_with_a_utc_stamp_and_never_overwritten(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    storage = Storage()
    asides = []
    for _ in range(2):
        journal.write(journal.data + b'{"seq":17,"row_n')
        aside = recover_torn_tail(journal.path, journal.scan(), storage)
        assert aside is not None
        asides.append(aside)
    assert re.fullmatch(r"results\.jsonl\.torn-\d{8}T\d{6}Z(-\d+)?", asides[0].name)
    assert asides[0] != asides[1]
    assert all(aside.read_bytes() == b'{"seq":17,"row_n' for aside in asides)


@pytest.mark.parametrize("keep", [0, 1, 3])
def test_a_nul_filled_tail_is_torn(tmp_path: Path, keep: int) -> None:
    """Power loss can leave the file longer with zeroed blocks where the batch should be."""
    journal = Journal(tmp_path)
    kept = journal.ends()[journal.committed_seq + keep]
    journal.write(journal.data[:kept] + b"\0" * (len(journal.data) - kept))
    scan = journal.scan()
    assert scan.torn_tail is not None and scan.torn_tail.start == kept
    assert scan.torn_tail.reason in ("NUL bytes", "truncated line (no newline at the end)")
    assert scan.last_seq == journal.committed_seq + keep
    aside = recover_torn_tail(journal.path, scan, Storage())
    assert aside is not None and set(aside.read_bytes()) == {0}
    assert journal.path.stat().st_size == kept


def test_nuls_then_valid_looking_lines_are_all_torn(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    start = journal.ends()[13]
    damaged = journal.data[:start] + b"\0" * len(journal.lines[13]) + b"".join(journal.lines[14:])
    journal.write(damaged)
    scan = journal.scan()
    assert scan.torn_tail is not None
    assert (scan.torn_tail.start, scan.torn_tail.end) == (start, len(damaged))
    assert 15 not in scan.done and 16 not in scan.done


def test_garbage_appended_after_the_last_line_is_torn(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.write(journal.data + b"\x8f\xffgarbage\n{}\n")
    scan = journal.scan()
    assert scan.last_seq == 16 and scan.valid_end == len(journal.data)
    assert scan.torn_tail is not None and scan.torn_tail.line == 17
    assert recover_torn_tail(journal.path, scan, Storage()) is not None
    assert journal.path.read_bytes() == journal.data


@pytest.mark.parametrize(
    ("index", "bad", "reason"),
    [
        (13, line(14, 3), "duplicate row_number 3"),
        (13, line(15), "seq 15 does not follow seq 13"),
        (12, line(13, 21), "row_number 21 is outside the input's rows 1..20"),
        (12, b"\n", "blank line"),
    ],
)
def test_any_damage_after_the_frontier_is_torn_with_everything_after_it(
    tmp_path: Path, index: int, bad: bytes, reason: str
) -> None:
    journal = Journal(tmp_path)
    lines = [*journal.lines[:index], bad, *journal.lines[index + 1 :]]
    journal.write(b"".join(lines))
    scan = journal.scan()
    assert scan.torn_tail is not None
    assert scan.torn_tail.reason == reason
    assert scan.torn_tail.start == journal.ends()[index] == scan.valid_end
    assert scan.torn_tail.line == index + 1
    assert scan.last_seq == index


def test_a_flipped_byte_right_after_the_frontier_is_torn_and_later_valid_lines_go_too(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    damaged = bytearray(journal.data)
    damaged[journal.frontier + 5] ^= 0x20
    journal.write(bytes(damaged))
    scan = journal.scan()
    assert scan.torn_tail is not None and scan.torn_tail.start == journal.frontier
    assert scan.torn_tail.reason == "checksum mismatch"
    assert scan.last_seq == journal.committed_seq
    aside = recover_torn_tail(journal.path, scan, Storage())
    assert aside is not None and aside.read_bytes() == bytes(damaged[journal.frontier :])


def test_a_failed_recovery_leaves_the_journal_untouched(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    damaged = journal.data + b"torn"
    journal.write(damaged)
    with pytest.raises(StorageFailed):
        recover_torn_tail(journal.path, journal.scan(), FaultyStorage(fail_fsync_at=1))
    assert journal.path.read_bytes() == damaged


@pytest.mark.parametrize("storage", [FaultyStorage(fail_write_at=1), FaultyStorage(fail_fsync_at=1)])
def test_a_failed_copy_of_the_torn_tail_leaves_no_half_copy_beside_the_journal(
    tmp_path: Path, storage: FaultyStorage
) -> None:
    # A full disk fails the copy midway; the next resume makes a copy of its own, so a partial one
    # left behind would only pass for the torn tail without being it.
    journal = Journal(tmp_path)
    damaged = journal.data + b"torn" * 100
    journal.write(damaged)
    with pytest.raises(StorageFailed):
        recover_torn_tail(journal.path, journal.scan(), storage)
    assert journal.path.read_bytes() == damaged
    assert sorted(path.name for path in tmp_path.iterdir()) == [journal.path.name]


# ---------------------------------------------------------------- refused


def test_a_flipped_byte_anywhere_before_the_frontier_is_refused(tmp_path: Path) -> None:
    base = Journal(tmp_path)
    ends = base.ends()
    for index in range(base.frontier):
        damaged = bytearray(base.data)
        damaged[index] ^= 0x01
        journal = Journal(tmp_path, base.lines).write(bytes(damaged))
        error = refused(journal)
        line_index = max(number for number, end in enumerate(ends) if end <= index)
        assert error.context["offset"] == ends[line_index], index
        assert error.context["line"] == line_index + 1, index


def test_a_blank_line_before_the_frontier_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.write(b"".join([*journal.lines[:5], b"\n", *journal.lines[5:]]))
    error = refused(journal)
    assert error.context == {
        "file": str(journal.path),
        "offset": journal.ends()[5],
        "line": 6,
        "reason": "blank line",
    }


@pytest.mark.parametrize(
    ("index", "bad", "reason"),
    [
        (6, line(7, 2), "duplicate row_number 2"),
        (6, line(8), "seq 8 does not follow seq 6"),
        (0, line(2), "seq 2 does not follow seq 0"),
        (6, line(7, 21), "row_number 21 is outside"),
        (6, line(7, 0), "row_number 0 is outside"),
        (6, line(7, status_code="503"), "'status_code' must be int or null, got str"),
    ],
)
def test_damage_before_the_frontier_is_refused(tmp_path: Path, index: int, bad: bytes, reason: str) -> None:
    journal = Journal(tmp_path)
    lines = [*journal.lines[:index], bad, *journal.lines[index + 1 :]]
    journal.write(b"".join(lines))
    journal.frontier += len(bad) - len(journal.lines[index])  # the checkpoint was taken of this file
    error = refused(journal)
    assert reason in error.context["reason"]
    assert error.context["line"] == index + 1
    assert error.context["offset"] == journal.ends()[index]


def test_a_journal_shorter_than_the_checkpoint_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.write(journal.data[: journal.frontier - 1])
    error = refused(journal)
    assert error.context["offset"] == journal.frontier - 1
    assert error.context["line"] == 12  # 11 whole lines, then the cut one
    assert "checkpoint" in error.context["reason"]


def test_a_deleted_middle_line_is_refused_at_the_gap_not_at_the_end(tmp_path: Path) -> None:
    """A stopped run's checkpoint covers the whole journal, so the file is now shorter than it."""
    journal = Journal(tmp_path)
    journal.committed_seq, journal.frontier = len(journal.lines), len(journal.data)
    journal.write(b"".join([*journal.lines[:6], *journal.lines[7:]]))
    error = refused(journal)
    assert error.context["line"] == 7
    assert error.context["offset"] == journal.ends()[6]
    assert error.context["reason"] == "seq 8 does not follow seq 6"


def test_a_missing_journal_with_a_checkpoint_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    error = refused(journal)
    assert error.context["offset"] == 0


def test_a_checkpoint_offset_inside_a_line_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path).write()
    journal.frontier += 3
    assert "not at the end of a line" in refused(journal).context["reason"]


def test_a_checkpoint_seq_that_disagrees_with_the_journal_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path).write()
    journal.committed_seq += 1
    assert "the journal has seq 12 there" in refused(journal).context["reason"]


# ---------------------------------------------------------------- without a checkpoint


def scan_without_checkpoint(journal: Journal) -> JournalScan:
    return scan_journal(journal.path, committed_seq=0, committed_offset=0, row_count=ROWS)


@pytest.mark.parametrize("index", [0, 4, 14])
def test_without_a_checkpoint_damage_followed_by_good_lines_is_refused(tmp_path: Path, index: int) -> None:
    """No frontier says what was committed, so only the very end may be torn: a flipped byte with good
    lines after it is damage to committed rows, not a crash."""
    journal = Journal(tmp_path)
    ends = journal.ends()
    damaged = bytearray(journal.data)
    damaged[ends[index] + 10] ^= 0x01
    journal.write(bytes(damaged))
    with pytest.raises(JournalCorrupt) as caught:
        scan_without_checkpoint(journal)
    error = caught.value
    assert (error.context["line"], error.context["offset"]) == (index + 1, ends[index])
    assert f"line {index + 1} (byte offset {ends[index]})" in error.message
    assert "checksum mismatch" in error.context["reason"] and "checkpoint" in error.context["reason"]
    assert journal.path.read_bytes() == bytes(damaged)


@pytest.mark.parametrize(
    "tail",
    [b'{"seq":17,"row_n', b"\0" * 300, b"\x8f\xffgarbage\n{}\n", line(16)[:-1], line(18) + line(17)[:9]],
)
def test_without_a_checkpoint_damage_at_the_end_is_still_a_torn_tail(tmp_path: Path, tail: bytes) -> None:
    journal = Journal(tmp_path)
    journal.write(journal.data + tail)
    scan = scan_without_checkpoint(journal)
    assert scan.torn_tail is not None and scan.torn_tail.start == len(journal.data)
    assert scan.last_seq == 16 and scan.valid_end == len(journal.data)


# ---------------------------------------------------------------- a real kill -9

_WRITER = """
import sys, anyio
from pathlib import Path
from bulkrelay.store.checkpoint import Checkpoint, write_checkpoint
from bulkrelay.store.journal import JournalEntry, JournalWriter
from bulkrelay.store.storage import Storage

run_dir = Path(sys.argv[1])
storage = Storage()
seq = 0

def on_commit(entries, end_offset):
    global seq
    seq += len(entries)
    write_checkpoint(run_dir, Checkpoint(seq, end_offset, seq, seq, 0, "now"), storage)

async def main():
    writer = JournalWriter(run_dir / "results.jsonl", storage, next_seq=1, on_commit=on_commit,
                           max_rows=200, max_delay=0.001)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for row in range(1, 10_000_000):
            await writer.submit(JournalEntry(row_number=row, success=True, classification="ok",
                                 status_code=200, attempts=1, retryable=False, error=None,
                                 duration_ms=1.0, key="x" * (row % 300)))
            if row % 100 == 0:
                await anyio.sleep(0)

anyio.run(main)
"""


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15])
def test_kill_9_mid_write_leaves_every_checkpointed_row_intact(tmp_path: Path, delay: float) -> None:
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)])
    try:
        wait_for((tmp_path / CHECKPOINT_FILE).exists, "the first checkpoint", interval=0.01)
        time.sleep(delay)  # a kill this long after it: the point of the test, not a synchronisation
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    checkpoint = read_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.seq > 0
    path = tmp_path / "results.jsonl"
    scan = scan_journal(
        path, committed_seq=checkpoint.seq, committed_offset=checkpoint.offset, row_count=10_000_000
    )
    assert scan.last_seq >= checkpoint.seq
    recover_torn_tail(path, scan, Storage())
    again = scan_journal(
        path, committed_seq=scan.last_seq, committed_offset=scan.valid_end, row_count=10_000_000
    )
    assert again.torn_tail is None
    assert next(again.done.missing()) == again.last_seq + 1  # rows 1..last_seq, no gaps


# ---------------------------------------------------------------- with the checkpoint's prefix digest


def prefix_of(journal: Journal) -> CommittedPrefix:
    """What the writer would have recorded at the frontier: digest and rows of lines 1..committed_seq."""
    done = RowSet(ROWS)
    for row in range(1, journal.committed_seq + 1):
        done.add(row)
    ok = sum(1 for row in range(1, journal.committed_seq + 1) if row % 3)
    digest = hashlib.sha256(journal.data[: journal.frontier]).hexdigest()
    return CommittedPrefix(journal.committed_seq, journal.frontier, ok, digest, done.to_bytes())


def scan_with_prefix(journal: Journal, prefix: CommittedPrefix | None = None) -> JournalScan:
    return scan_journal(
        journal.path,
        committed_seq=journal.committed_seq,
        committed_offset=journal.frontier,
        row_count=ROWS,
        prefix=prefix or prefix_of(journal),
    )


def test_a_matching_prefix_decodes_only_the_lines_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path).write()
    full = journal.scan()
    decoded: list[bytes] = []
    verify = journal_module._verified_fields

    def counting(line: bytes) -> dict[str, Any]:
        decoded.append(line)
        return verify(line)

    monkeypatch.setattr(journal_module, "_verified_fields", counting)
    fast = scan_with_prefix(journal)
    assert decoded == journal.lines[journal.committed_seq :]  # lines 13-16 only
    assert (fast.last_seq, fast.valid_end, fast.ok, fast.torn_tail) == (16, len(journal.data), 11, None)
    assert fast.done.to_bytes() == full.done.to_bytes()
    assert fast.hasher.hexdigest() == full.hasher.hexdigest() == hashlib.sha256(journal.data).hexdigest()


@pytest.mark.parametrize("index", [0, 5, 11])
def test_with_a_prefix_damage_before_the_frontier_names_file_line_and_offset(
    tmp_path: Path, index: int
) -> None:
    journal = Journal(tmp_path)
    prefix = prefix_of(journal)
    ends = journal.ends()
    damaged = bytearray(journal.data)
    damaged[ends[index] + 10] ^= 0x01
    journal.write(bytes(damaged))
    with pytest.raises(JournalCorrupt) as caught:
        scan_with_prefix(journal, prefix)
    error = caught.value
    assert (error.context["line"], error.context["offset"]) == (index + 1, ends[index])
    assert error.context["file"] == str(journal.path)
    assert f"{journal.path.name} is corrupt at line {index + 1} (byte offset {ends[index]})" in error.message
    assert journal.path.read_bytes() == bytes(damaged)


def test_with_a_prefix_damage_after_the_frontier_is_a_torn_tail(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    ends = journal.ends()
    damaged = bytearray(journal.data)
    damaged[ends[13] + 10] ^= 0x01  # line 14, after the frontier (line 12)
    journal.write(bytes(damaged))
    scan = scan_with_prefix(journal)
    assert scan.torn_tail is not None
    assert (scan.torn_tail.line, scan.torn_tail.start, scan.valid_end) == (14, ends[13], ends[13])
    assert scan.last_seq == 13 and "checksum mismatch" in scan.torn_tail.reason
    assert scan.hasher.hexdigest() == hashlib.sha256(journal.data[: ends[13]]).hexdigest()


def test_a_committed_line_rewritten_with_a_valid_checksum_is_refused(tmp_path: Path) -> None:
    """Every line checks out on its own, but the committed bytes are not those the writer recorded."""
    journal = Journal(tmp_path)
    prefix = prefix_of(journal)
    journal.lines[2] = line(3, success=True, classification="ok", status_code=200, error=None)
    journal.data = b"".join(journal.lines)
    journal.frontier = journal.ends()[journal.committed_seq]
    journal.write()
    prefix = CommittedPrefix(prefix.seq, journal.frontier, prefix.ok, prefix.sha256, prefix.done_rows)
    journal.scan()  # each line is valid: without the digest this went unnoticed
    with pytest.raises(JournalCorrupt) as caught:
        scan_with_prefix(journal, prefix)
    assert caught.value.context["file"] == str(journal.path)
    assert "do not match the digest" in caught.value.context["reason"]
    assert "checkpoint.json" in caught.value.message


def test_a_prefix_whose_rows_do_not_fit_is_refused(tmp_path: Path) -> None:
    journal = Journal(tmp_path).write()
    good = prefix_of(journal)
    wrong_rows = CommittedPrefix(good.seq, good.offset, good.ok, good.sha256, RowSet(ROWS).to_bytes())
    with pytest.raises(JournalCorrupt, match="do not match the digest"):
        scan_with_prefix(journal, wrong_rows)


def test_a_prefix_of_another_frontier_is_not_used(tmp_path: Path) -> None:
    journal = Journal(tmp_path).write()
    stale = prefix_of(journal)
    journal.committed_seq, journal.frontier = 16, len(journal.data)  # a newer checkpoint's frontier
    scan = scan_with_prefix(journal, stale)
    assert scan.last_seq == 16 and scan.torn_tail is None


# ---------------------------------------------------------------- commit markers (issue 22 item 18)
# A writer ends each group with a commit marker (its last seq, rows, time and the CRC-32 of its
# bytes), so a group with its marker is whole: damage in it is corruption, wherever the checkpoint
# stands, and only the last group, whose marker never reached the disk, can be torn. The journals
# above have no markers (an older version's) and keep the older rule.

COMMITTED_AT = 1_764_630_000.5


class MarkedJournal(Journal):
    """Four groups of four lines, each followed by its commit marker; the frontier after group three."""

    def __init__(self, directory: Path, frontier_group: int = 3, legacy_lines: int = 0) -> None:
        """`legacy_lines`: the first lines were written by a version without markers (no marker after
        them; the first marker covers the group that follows them)."""
        lines: list[bytes] = []
        self.group_starts: list[int] = []  # line indexes where each group begins
        seq = 0
        for number, size in enumerate(BATCHES):
            self.group_starts.append(len(lines))
            group = [line(seq + n) for n in range(1, size + 1)]
            seq += size
            lines.extend(group)
            if seq > legacy_lines:
                rows = min(size, seq - legacy_lines)
                marker = encode_marker(seq, rows, COMMITTED_AT + number, zlib.crc32(b"".join(group[-rows:])))
                lines.append(marker)
        super().__init__(directory, lines)
        self.committed_seq = sum(BATCHES[:frontier_group])
        self.frontier = (
            self.ends()[self.group_starts[frontier_group]] if frontier_group < 4 else len(self.data)
        )

    def line_of(self, offset: int) -> tuple[int, int]:
        """(line number from 1, offset where it starts) of the line holding byte `offset`."""
        ends = self.ends()
        index = max(number for number, end in enumerate(ends) if end <= offset)
        return index + 1, ends[index]


def test_a_marked_journal_scans_clean_and_its_commit_times_can_be_read(tmp_path: Path) -> None:
    journal = MarkedJournal(tmp_path).write()
    scan = journal.scan()
    assert scan.torn_tail is None and scan.last_seq == 16 and scan.valid_end == len(journal.data)
    assert (scan.ok, scan.failed) == (11, 5)
    commits = list(read_commits(journal.path))
    assert [(commit.t, commit.rows, commit.seq) for commit in commits] == [
        (COMMITTED_AT + number, 4, 4 * (number + 1)) for number in range(4)
    ]
    assert [entry.row_number for entry in read_journal(journal.path)] == list(range(1, 17))
    assert [entry.row_number for _, _, entry in read_journal_from(journal.path, 0)] == list(range(1, 17))


@pytest.mark.parametrize("checkpointed", [True, False])
def test_truncation_at_every_byte_of_the_last_group_tears_the_whole_group(
    tmp_path: Path, checkpointed: bool
) -> None:
    base = MarkedJournal(tmp_path)
    start = base.frontier  # where group four begins, just past group three's marker
    storage = Storage()
    for cut in range(start, len(base.data) + 1):
        case = tmp_path / f"cut{cut}"
        case.mkdir()
        journal = MarkedJournal(case).write(base.data[:cut])
        scan = journal.scan() if checkpointed else scan_without_checkpoint(journal)
        if cut in (start, len(base.data)):  # at a marker: every group whole
            assert scan.torn_tail is None and scan.valid_end == cut, cut
            continue
        # Whole lines of group four without its marker were never committed: they go with the rest.
        assert scan.torn_tail is not None, cut
        assert (scan.torn_tail.start, scan.torn_tail.end, scan.torn_tail.line) == (start, cut, 16), cut
        assert (scan.last_seq, scan.valid_end, scan.ok) == (12, start, 8), cut
        assert not {13, 14, 15, 16} & set(range(1, 21)) - set(scan.done.missing()), cut
        assert scan.hasher.hexdigest() == hashlib.sha256(base.data[:start]).hexdigest()
        aside = recover_torn_tail(journal.path, scan, storage)
        assert aside is not None and aside.read_bytes() == base.data[start:cut]
        assert journal.path.read_bytes() == base.data[:start]
        assert journal.scan().torn_tail is None


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_flipped_byte_at_every_offset_of_the_last_group(tmp_path: Path, checkpointed: bool) -> None:
    # Its marker on disk, the last group is whole too: damage in its lines is corruption. Damage that
    # no marker follows (in the marker, or the newline before it) means the write never ended: the
    # whole group is torn.
    base = MarkedJournal(tmp_path)
    start = base.frontier
    marker_start = base.ends()[len(base.lines) - 1]
    for index in range(start, len(base.data)):
        damaged = bytearray(base.data)
        damaged[index] ^= 0x01
        journal = MarkedJournal(tmp_path).write(bytes(damaged))
        if index < marker_start - 1:
            with pytest.raises(JournalCorrupt) as caught:
                journal.scan() if checkpointed else scan_without_checkpoint(journal)
            line_number, line_start = base.line_of(index)
            assert (caught.value.context["line"], caught.value.context["offset"]) == (line_number, line_start)
            continue
        scan = journal.scan() if checkpointed else scan_without_checkpoint(journal)
        assert scan.torn_tail is not None, index
        assert (scan.torn_tail.start, scan.last_seq, scan.valid_end) == (start, 12, start), index


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_flipped_byte_at_every_offset_of_a_complete_group_after_the_frontier_is_corrupt(
    tmp_path: Path, checkpointed: bool
) -> None:
    # Before: damage after the checkpoint's frontier was a torn tail, so a flipped byte in group
    # three (committed, its marker on disk) discarded it and group four, and resent their rows.
    base = MarkedJournal(tmp_path, frontier_group=2)
    first, end = base.frontier, base.ends()[base.group_starts[3]]  # group three and its marker
    for index in range(first, end):
        damaged = bytearray(base.data)
        damaged[index] ^= 0x01
        journal = MarkedJournal(tmp_path, frontier_group=2).write(bytes(damaged))
        with pytest.raises(JournalCorrupt) as caught:
            journal.scan() if checkpointed else scan_without_checkpoint(journal)
        error = caught.value
        line_number, line_start = base.line_of(index)
        assert (error.context["line"], error.context["offset"]) == (line_number, line_start), index
        assert f"line {line_number} (byte offset {line_start})" in error.message, index
        assert "commit marker" in error.context["reason"], index
        assert journal.path.read_bytes() == bytes(damaged)  # refused, never cut


def test_a_line_rewritten_with_a_valid_checksum_breaks_its_groups_marker(tmp_path: Path) -> None:
    journal = MarkedJournal(tmp_path, frontier_group=1)
    index = journal.group_starts[1] + 1  # row 6 (a 503), in group two, after the frontier
    journal.lines[index] = line(
        6, success=True, classification="ok", status_code=200, error=None, attempts=1, retryable=False
    )
    journal.data = b"".join(journal.lines)
    journal.write()
    error = refused(journal)
    marker_line = journal.group_starts[2]  # group two's marker: the line before group three
    assert (error.context["line"], error.context["offset"]) == (marker_line, journal.ends()[marker_line - 1])
    assert "commit marker checksum" in error.context["reason"]


def test_a_journal_begun_without_markers_and_continued_with_them_reads_both_ways(tmp_path: Path) -> None:
    # Lines 1-6 by a version without markers; the first marker (after line 8) vouches for 7-8 alone.
    journal = MarkedJournal(tmp_path, frontier_group=3, legacy_lines=6).write()
    scan = journal.scan()
    assert scan.torn_tail is None and scan.last_seq == 16
    assert [commit.rows for commit in read_commits(journal.path)] == [2, 4, 4]
    damaged = bytearray(journal.data)
    damaged[journal.ends()[2] + 5] ^= 0x01  # line 3, an old line: a marker follows it
    journal.write(bytes(damaged))
    with pytest.raises(JournalCorrupt):
        scan_without_checkpoint(journal)
    journal.write(journal.data[:-30])  # group four's marker cut: the group goes whole
    torn = journal.scan().torn_tail
    assert torn is not None and torn.start == journal.frontier


def test_a_writer_marks_each_group_with_its_commit_time(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    before = time.time()

    async def write() -> None:
        writer = JournalWriter(path, Storage(), next_seq=1, on_commit=lambda entries, end: None, max_rows=3)
        async with anyio.create_task_group() as group:
            group.start_soon(writer.run)
            for row in range(1, 8):
                await writer.submit(decode_line(line(row))[1])
            await writer.close()

    anyio.run(write)
    commits = list(read_commits(path))
    assert sum(commit.rows for commit in commits) == 7 and commits[-1].seq == 7
    assert all(before - 1 <= commit.t <= time.time() + 1 for commit in commits)
    scan = scan_journal(path, committed_seq=0, committed_offset=0, row_count=ROWS)
    assert scan.torn_tail is None and scan.last_seq == 7
