"""The line scan process itself (sync/linescan.py): the real `LineScan` against files written here and a
real sync state filled here. A line is *known* only when the state holds its digest under its key."""

from __future__ import annotations

import gzip
import sqlite3
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import orjson
import pytest

from bulkrelay.job.inputs import InputFingerprint, InputSpec, open_records
from bulkrelay.sync import linescan
from bulkrelay.sync.linescan import (
    FRAME_LINES,
    LINE_DIGEST_SIZE,
    NO_DIGEST,
    LineScan,
    LineScanFailed,
    header_salt,
    line_digest,
)
from bulkrelay.sync.state import SyncState

pytestmark = pytest.mark.slow  # real processes: outside the fast lane (`-m "not slow"`)

SALT = bytes(range(LINE_DIGEST_SIZE))
REQUEST = b"r" * 16  # the delivered request's digest: the scan never looks at it


class Scanned:
    """What one scan said: a verdict and a digest per line, and how it ended."""

    def __init__(self, known: list[bool], digests: list[bytes], end: tuple[int, int, str]) -> None:
        self.known = known
        self.digests = digests
        self.size, self.lines, self.sha256 = end


def _state(tmp_path: Path, lines: Iterable[tuple[str, bytes]] = ()) -> Path:
    """A real sync state whose delivered keys hold these line digests."""
    path = tmp_path / "state.db"
    with SyncState(path, "job") as state:
        state._db.executemany(
            "INSERT INTO delivered (key, digest, run, at, line) VALUES (?, ?, 1, 1, ?)",
            [(key, REQUEST, line) for key, line in lines],
        )
    return path


def _spec(path: Path, delimiter: str = ",") -> InputSpec:
    return InputSpec.detect(path, delimiter=delimiter)


def _scan(spec: InputSpec, state: Path, key: str = "id", *, lines: int) -> Scanned:
    """Run the scan to its end, reading a verdict for each of `lines` lines as preflight would."""
    scan = LineScan(spec, key, salt=SALT, state=state)
    try:
        known, digests = [], []
        for line in range(1, lines + 1):
            scan.advance(line)
            at = line - scan.start
            known.append(scan.marks[at] == 1)
            digests.append(scan.digests[at * LINE_DIGEST_SIZE : (at + 1) * LINE_DIGEST_SIZE])
        return Scanned(known, digests, scan.finish())
    finally:
        scan.close()


def _csv_line(header: bytes, line: bytes) -> bytes:
    return line_digest(header_salt(SALT, header), line)


def _scan_csv(
    tmp_path: Path, body: bytes, delivered: list[tuple[str, bytes]], header: bytes = b"id,email"
) -> Scanned:
    """Scan `body` as data.csv, the state holding each (key, line) delivered under `header`."""
    data = tmp_path / "data.csv"
    data.write_bytes(body)
    state = _state(tmp_path, [(key, _csv_line(header, line)) for key, line in delivered])
    return _scan(_spec(data), state, lines=body.count(b"\n") + (not body.endswith(b"\n")))


def _fingerprint(spec: InputSpec) -> InputFingerprint:
    """What preflight's reader makes of the same file."""
    with open_records(spec, lambda problem: None) as stream:
        for _ in stream:
            pass
        return stream.fingerprint()


# ---------------------------------------------------------------------------------------------------
# CSV


def test_a_csv_line_is_known_only_by_its_digest_under_its_own_key(tmp_path: Path) -> None:
    delivered = [
        ("1", b"1,a@x"),
        ("2", b"2,OLD@x"),  # delivered from other bytes
        ("4", b"3,c@x"),  # the line's digest, under another key
    ]
    scanned = _scan_csv(tmp_path, b"id,email\n1,a@x\n2,b@x\n3,c@x\n", delivered)
    assert scanned.known == [False, True, False, False]
    assert scanned.digests[0] == NO_DIGEST  # the header is no record
    assert scanned.digests[2] == _csv_line(b"id,email", b"2,b@x")  # what preflight learns for the next night
    assert scanned.lines == 4


def test_a_csv_line_known_under_another_header_or_salt_is_not_known(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"id,name\n1,a@x\n")  # the same data line, its column now called name
    state = _state(tmp_path, [("1", _csv_line(b"id,email", b"1,a@x")), ("1x", line_digest(SALT, b"1,a@x"))])
    assert _scan(_spec(data), state, lines=2).known == [False, False]


def test_csv_lines_with_a_quote_are_never_known_nor_digested(tmp_path: Path) -> None:
    delivered = [("1", b'1,"a@x"'), ("2", b'2,"multi'), ("3", b'3,c"d')]
    scanned = _scan_csv(tmp_path, b'id,email\n1,"a@x"\n2,"multi\nline",\n3,c"d\n', delivered)
    assert scanned.known == [False] * 5
    assert [scanned.digests[n] for n in (1, 2, 4)] == [NO_DIGEST] * 3


def test_the_csv_header_is_the_first_line_not_blank_and_loses_its_bom(tmp_path: Path) -> None:
    scanned = _scan_csv(tmp_path, b"\xef\xbb\xbf\n\r\nid,email\n\n1,a@x\n", [("1", b"1,a@x")])
    assert scanned.known == [False, False, False, False, True]


def test_a_bom_on_the_header_line_is_not_part_of_its_salt(tmp_path: Path) -> None:
    assert _scan_csv(tmp_path, b"\xef\xbb\xbfid,email\n1,a@x\n", [("1", b"1,a@x")]).known == [False, True]


def test_crlf_lines_are_hashed_with_their_cr_and_their_key_read_without_it(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"email,id\r\na@x,1\r\nb@x,2\r\n")  # the key is the last field: "1", never "1\r"
    header = b"email,id\r"
    state = _state(
        tmp_path,
        [("1", _csv_line(header, b"a@x,1\r")), ("2", _csv_line(b"email,id", b"b@x,2"))],  # 2: as LF
    )
    scanned = _scan(_spec(data), state, lines=3)
    assert scanned.known == [False, True, False]


def test_a_last_line_without_a_newline_is_a_line(tmp_path: Path) -> None:
    scanned = _scan_csv(tmp_path, b"id,email\n1,a@x\n2,b@x", [("2", b"2,b@x")])
    assert scanned.known == [False, False, True]
    assert scanned.lines == 3


def test_ragged_csv_lines_are_never_known(tmp_path: Path) -> None:
    scanned = _scan_csv(tmp_path, b"id,email\n1,a@x,extra\n2\n", [("1", b"1,a@x,extra"), ("2", b"2")])
    assert scanned.known == [False, False, False]
    assert scanned.digests[1:] == [NO_DIGEST, NO_DIGEST]


def test_the_scan_splits_on_the_job_s_delimiter(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"email;id\na@x;1\n")
    state = _state(tmp_path, [("1", _csv_line(b"email;id", b"a@x;1"))])
    assert _scan(_spec(data, ";"), state, lines=2).known == [False, True]
    assert _scan(_spec(data, ","), state, lines=2).known == [False, False]  # no field called id


def test_a_header_with_duplicate_names_reads_the_key_from_the_last_one(tmp_path: Path) -> None:
    """Preflight refuses such a header; the scan must still say nothing wrong about it."""
    data = tmp_path / "data.csv"
    data.write_bytes(b"id,email,id\n1,a@x,9\n")
    line = _csv_line(b"id,email,id", b"1,a@x,9")
    assert _scan(_spec(data), _state(tmp_path, [("1", line)]), lines=2).known == [False, False]
    assert _scan(_spec(data), _state(tmp_path / "s", [("9", line)]), lines=2).known == [False, True]


def test_a_header_without_the_key_or_with_a_quote_makes_every_line_unknown(tmp_path: Path) -> None:
    for n, header in enumerate((b"ident,email", b'"id",email')):
        data = tmp_path / f"data{n}.csv"
        data.write_bytes(header + b"\n1,a@x\n")
        state = _state(tmp_path / str(n), [("1", _csv_line(header, b"1,a@x"))])
        scanned = _scan(_spec(data), state, lines=2)
        assert scanned.known == [False, False]
        assert scanned.digests == [NO_DIGEST, NO_DIGEST]


# ---------------------------------------------------------------------------------------------------
# JSON Lines


def test_json_lines_keys_are_spelled_as_key_text_spells_them(tmp_path: Path) -> None:
    lines = [
        b'{"id": 7, "v": 1}',
        b'{"id": "7x", "v": 1}',
        b'{"id": 1.5}',
        b'{"id": true}',
        b'{"id": "\\u00e9"}',
    ]
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    keys = ["7", "7x", "1.5", "true", "\u00e9"]
    state = _state(tmp_path, [(key, line_digest(SALT, line)) for key, line in zip(keys, lines, strict=True)])
    assert _scan(_spec(data), state, lines=5).known == [True] * 5


def test_json_lines_that_are_no_object_with_a_key_are_never_known(tmp_path: Path) -> None:
    lines = [b"[1, 2]", b'"id"', b"not json", b"", b'{"other": 1}', b'{"id": null}', b'{"id": "a\\u0000b"}']
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    keys = ["[1,2]", "id", "not json", "", "missing", "null", "a\0b"]
    state = _state(tmp_path, [(key, line_digest(SALT, line)) for key, line in zip(keys, lines, strict=True)])
    scanned = _scan(_spec(data), state, lines=len(lines))
    assert scanned.known == [False] * len(lines)
    assert scanned.digests == [NO_DIGEST] * len(lines)


def test_the_same_key_in_other_bytes_is_not_known(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"id": "7", "v": 1}\n{"v": 2, "id": "8"}\n')
    state = _state(
        tmp_path,
        [("7", line_digest(SALT, b'{"id":"7","v":1}')), ("8", line_digest(SALT, b'{"id": "8", "v": 2}'))],
    )
    assert _scan(_spec(data), state, lines=2).known == [False, False]


# ---------------------------------------------------------------------------------------------------
# Bytes, frames and the fingerprint


def test_a_gzip_input_is_scanned_decompressed_and_fingerprinted_compressed(tmp_path: Path) -> None:
    data = tmp_path / "data.csv.gz"
    data.write_bytes(gzip.compress(b"\xef\xbb\xbfid,email\n1,a@x\n2,b@x\n"))
    state = _state(tmp_path, [("2", _csv_line(b"id,email", b"2,b@x"))])
    spec = _spec(data)
    scanned = _scan(spec, state, lines=3)
    assert scanned.known == [False, False, True]
    fingerprint = _fingerprint(spec)
    assert (scanned.size, scanned.sha256) == (fingerprint.size, fingerprint.sha256)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("data.csv", b'id,email\r\n1,a@x\r\n\r\n2,"b\nc"\r\n3,z'),
        ("data.jsonl", b'\xef\xbb\xbf{"id": 1}\n{"id": 2}\n'),
        ("data.jsonl.gz", gzip.compress(b'{"id": 1}\n', mtime=0) + gzip.compress(b'{"id": 2}\n', mtime=0)),
    ],
    ids=["csv", "jsonl_bom", "gzip_two_members"],  # the same on every worker
)
def test_the_size_and_sha256_reported_are_preflight_s(tmp_path: Path, name: str, body: bytes) -> None:
    data = tmp_path / name
    data.write_bytes(body)
    spec = _spec(data)
    scan = LineScan(spec, "id", salt=SALT, state=_state(tmp_path))
    try:
        size, _, sha256 = scan.finish()
    finally:
        scan.close()
    fingerprint = _fingerprint(spec)
    assert (size, sha256) == (fingerprint.size, fingerprint.sha256) == (len(body), fingerprint.sha256)


def test_a_line_longer_than_a_mebibyte_is_one_line_and_the_next_stay_in_place(tmp_path: Path) -> None:
    long = orjson.dumps({"id": "long", "v": "x" * (3 << 19)})  # 1.5 MiB
    after = b'{"id": "after"}'
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"id": "first"}\n' + long + b"\n" + after + b"\n")
    state = _state(tmp_path, [("long", line_digest(SALT, long)), ("after", line_digest(SALT, after))])
    scanned = _scan(_spec(data), state, lines=3)
    assert scanned.known == [False, True, True]
    assert scanned.lines == 3


def test_verdicts_stay_on_their_lines_across_frames(tmp_path: Path) -> None:
    count = FRAME_LINES * 2 + 10
    lines = [b"id,v"] + [f"{n},{n * 3}".encode() for n in range(1, count)]
    data = tmp_path / "data.csv"
    data.write_bytes(b"\n".join(lines) + b"\n")
    known_lines = {2, FRAME_LINES, FRAME_LINES + 1, 2 * FRAME_LINES + 1, count}
    state = _state(tmp_path, [(str(at - 1), _csv_line(b"id,v", lines[at - 1])) for at in sorted(known_lines)])
    scanned = _scan(_spec(data), state, lines=count)
    assert [at for at, known in enumerate(scanned.known, 1) if known] == sorted(known_lines)
    assert scanned.lines == count


# ---------------------------------------------------------------------------------------------------
# A scan that fails


def test_a_scan_that_dies_before_its_verdicts_makes_every_line_unknown_and_fails_at_finish(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"id,email\n1,a@x\n")
    scan = LineScan(_spec(data), "id", salt=SALT, state=tmp_path / "no-such-state.db")
    try:
        scan.advance(2)
        assert scan.marks[2 - scan.start] == 0
        assert scan.marked == 0
        with pytest.raises(LineScanFailed, match="the line scan failed"):
            scan.finish()
    finally:
        scan.close()


def _garbling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, garble: str) -> None:
    """Make `LineScan` start the real scan behind a pipe that garbles its output: `garble` is Python
    turning `out` (every byte the scan wrote) into what preflight reads, and may set `status`."""
    script = tmp_path / "garble"
    script.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        f"scan = [{sys.executable!r}, '-m', 'bulkrelay.sync.linescan', *sys.argv[1:]]\n"
        "out = subprocess.run(scan, stdout=subprocess.PIPE, check=True).stdout\n"
        "status = 0\n"
        f"{garble}\n"
        "sys.stdout.buffer.write(out)\n"
        "sys.exit(status)\n"
    )
    script.chmod(0o755)
    monkeypatch.setattr(linescan, "_COMMAND", (str(script),))


_FRAME_HEAD = 1 + 8 + 4  # a verdicts frame's kind, first line and count
_END_FRAME = 1 + 8 + 8 + 32  # the end frame: kind, size, lines, SHA-256


@pytest.mark.parametrize(
    ("garble", "failure"),
    [
        ("out = out[: len(out) // 2]", "cut short"),
        (f"out = out[:-{_END_FRAME}]", "ended before its verdicts"),  # the end frame gone
        ("out = b'X' + out[1:]", "an unknown frame"),
        ("out = out[:1] + (5).to_bytes(8, 'little') + out[9:]", "out of order"),
        ("status = 3", "exit status 3"),
    ],
    ids=["cut", "no_end", "kind", "order", "status"],
)
def test_a_scan_whose_output_is_not_its_frames_fails_at_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, garble: str, failure: str
) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"id,email\n1,a@x\n2,b@x\n")
    state = _state(tmp_path, [("1", _csv_line(b"id,email", b"1,a@x"))])
    _garbling(tmp_path, monkeypatch, garble)
    scan = LineScan(_spec(data), "id", salt=SALT, state=state)
    try:
        for line in (1, 2, 3):
            scan.advance(line)
        with pytest.raises(LineScanFailed, match=failure):
            scan.finish()
    finally:
        scan.close()


def test_marked_counts_the_known_lines_read_before_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delta run trusts `marked` to tell whether preflight took any row on the failed scan's word."""
    count = FRAME_LINES + 5
    lines = [b"id,v"] + [f"{n},x".encode() for n in range(1, count)]
    data = tmp_path / "data.csv"
    data.write_bytes(b"\n".join(lines) + b"\n")
    state = _state(
        tmp_path, [("1", _csv_line(b"id,v", lines[1])), (str(count - 1), _csv_line(b"id,v", lines[-1]))]
    )
    frame = _FRAME_HEAD + FRAME_LINES * (1 + LINE_DIGEST_SIZE)
    _garbling(tmp_path, monkeypatch, f"out = out[:{frame}]")  # the first frame only
    scan = LineScan(_spec(data), "id", salt=SALT, state=state)
    try:
        scan.advance(2)
        assert scan.marks[2 - scan.start] == 1
        scan.advance(count)
        assert scan.marks[count - scan.start] == 0  # the second frame never came: unknown
        assert scan.marked == 1
        with pytest.raises(LineScanFailed):
            scan.finish()
    finally:
        scan.close()


def test_a_state_written_without_line_digests_knows_no_line(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_bytes(b"id,email\n1,a@x\n")
    path = _state(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO delivered (key, digest, run, at) VALUES ('1', ?, 1, 1)", (REQUEST,))
    assert _scan(_spec(data), path, lines=2).known == [False, False]


def test_the_scan_process_starts_on_the_standard_library_and_orjson() -> None:
    """`python -m bulkrelay.sync.linescan` imports the sync room's face first: the face must not load the
    delta run's modules (the job's pydantic schema, the journal) into every night's scan process."""
    shown = "import sys; print(' '.join(sorted(sys.modules)))"
    started = subprocess.run(
        [sys.executable, "-c", f"import {linescan.__name__}\n{shown}"],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = set(started.stdout.split())
    assert linescan.__name__ in loaded
    assert {"pydantic", "bulkrelay.job.config", "bulkrelay.sync.delta", "asyncio"} & loaded == set()
