"""Atomic replace and the storage seam under it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from bulkrelay.errors import JournalCorrupt, NotFound, RunNotResumable, StorageFailed, UsageError
from bulkrelay.store.atomic import (
    file_to_replace,
    move_file,
    read_json,
    replacing,
    write_atomic,
    write_json_atomic,
)
from bulkrelay.store.faultystorage import FaultyStorage
from bulkrelay.store.storage import Storage


def test_write_atomic_replaces_in_order_and_fsyncs_the_directory(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    spy = FaultyStorage()
    write_atomic(target, b"new content", spy)
    assert target.read_bytes() == b"new content"
    assert spy.calls == ["write", "fsync", "replace", "fsync_dir"]
    assert spy.dir_fsyncs == [tmp_path]
    assert sorted(os.listdir(tmp_path)) == ["state.json"]  # no temp file left behind


def test_write_atomic_creates_a_missing_file_readable_by_its_owner_only(tmp_path: Path) -> None:
    target = tmp_path / "fresh.bin"
    write_atomic(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert target.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("spy", [FaultyStorage(fail_fsync_at=1), FaultyStorage(fail_replace=True)])
def test_a_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path: Path, spy: FaultyStorage) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    with pytest.raises(StorageFailed, match="injected"):
        write_atomic(target, b"new", spy)
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["state.json"]
    assert "fsync_dir" not in spy.calls


def test_replacing_streams_into_a_temp_file_then_replaces_in_order(tmp_path: Path) -> None:
    target = tmp_path / "export.csv"
    target.write_bytes(b"old")
    spy = FaultyStorage()
    with replacing(target, spy) as out:
        for n in range(3):
            out.write(b"row %d\n" % n)
        assert target.read_bytes() == b"old"  # nothing shows until the end
    assert target.read_bytes() == b"row 0\nrow 1\nrow 2\n"
    assert spy.calls == ["write", "fsync", "replace", "fsync_dir"]  # buffered: one write here
    assert sorted(os.listdir(tmp_path)) == ["export.csv"]
    assert target.stat().st_mode & 0o777 == 0o600


def test_replacing_writes_a_stream_larger_than_its_buffer_through_the_seam(tmp_path: Path) -> None:
    target = tmp_path / "big.bin"
    spy = FaultyStorage()
    with replacing(target, spy, mode=0o644) as out:
        for _ in range(5):
            out.write(b"x" * (700 << 10))
    assert target.stat().st_size == 5 * (700 << 10)
    assert spy.calls.count("write") >= 2 and spy.calls[-3:] == ["fsync", "replace", "fsync_dir"]


@pytest.mark.parametrize("fault", ["raised", "fsync", "write"])
def test_replacing_that_fails_keeps_the_old_file_and_removes_the_temp(tmp_path: Path, fault: str) -> None:
    target = tmp_path / "export.csv"
    target.write_bytes(b"old")
    spy = FaultyStorage(
        fail_fsync_at=1 if fault == "fsync" else None, fail_write_at=1 if fault == "write" else None
    )
    error = ValueError if fault == "raised" else StorageFailed
    with pytest.raises(error), replacing(target, spy) as out:
        out.write(b"half an export")
        if fault == "raised":
            raise ValueError("refused midway")
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["export.csv"]
    assert "replace" not in spy.calls


def test_write_json_atomic_writes_sorted_indented_json(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_json_atomic(target, {"b": 1, "a": {"y": [1, 2], "x": None}})
    text = target.read_text()
    assert text == '{\n  "a": {\n    "x": null,\n    "y": [\n      1,\n      2\n    ]\n  },\n  "b": 1\n}\n'
    assert read_json(target) == {"a": {"x": None, "y": [1, 2]}, "b": 1}


def test_read_json_missing_file_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as caught:
        read_json(tmp_path / "nope.json")
    assert caught.value.context["path"] == str(tmp_path / "nope.json")


def test_read_json_malformed_names_the_file(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_bytes(b'{"state": "runn')
    with pytest.raises(JournalCorrupt, match=r"run\.json is not valid JSON") as caught:
        read_json(target)
    assert caught.value.context["path"] == str(target)
    with pytest.raises(RunNotResumable):
        read_json(target, invalid=RunNotResumable)


def test_read_json_of_a_directory_is_invalid_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(JournalCorrupt, match="cannot read"):
        read_json(tmp_path)


def test_storage_wraps_os_errors_naming_the_file(tmp_path: Path) -> None:
    storage = Storage()
    path = tmp_path / "journal"
    fd = storage.open_append(path)
    os.close(fd)  # behind the storage's back: the next write gets EBADF
    with pytest.raises(StorageFailed) as caught:
        storage.write(fd, b"data")
    error = caught.value
    assert str(path) in error.message and "Bad file descriptor" in error.message
    assert error.context["file"] == str(path) and error.context["operation"] == "write"
    with pytest.raises(StorageFailed, match="fsync failed"):
        storage.fsync(fd)


def test_storage_open_new_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "exists"
    path.write_bytes(b"")
    with pytest.raises(StorageFailed, match="open failed"):
        Storage().open_new(path)


def test_storage_write_appends_everything(tmp_path: Path) -> None:
    storage = Storage()
    path = tmp_path / "log"
    data = orjson.dumps(list(range(100_000)))
    for _ in range(2):
        fd = storage.open_append(path)
        storage.write(fd, data)
        storage.fsync(fd)
        storage.close(fd)
    assert path.read_bytes() == data + data


def test_move_file_renames_within_a_file_system(tmp_path: Path) -> None:
    spy = FaultyStorage()
    source, target = tmp_path / "spool", tmp_path / "kept"
    source.write_bytes(b"records")
    inode = source.stat().st_ino

    move_file(source, target, spy)

    assert not source.exists()
    assert target.read_bytes() == b"records"
    assert target.stat().st_ino == inode  # renamed, not copied
    assert spy.calls == ["replace", "fsync_dir"]


def test_move_file_across_file_systems_copies_durably_then_removes_the_source(
    tmp_path: Path, other_file_system: Path
) -> None:
    spy = FaultyStorage()
    source, target = other_file_system / "spool", tmp_path / "kept"
    data = os.urandom(3 << 20)  # more than one copy chunk
    source.write_bytes(data)
    target.write_bytes(b"the previous copy")

    move_file(source, target, spy)

    assert target.read_bytes() == data
    assert not source.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # no temp file left
    assert spy.calls[0] == "replace"  # the rename was tried first, and failed with EXDEV
    assert spy.calls[-4:] == ["write", "fsync", "replace", "fsync_dir"]  # then an atomic copy
    assert spy.dir_fsyncs == [tmp_path]


def test_a_failed_move_across_file_systems_names_the_file_and_loses_nothing(
    tmp_path: Path, other_file_system: Path
) -> None:
    source, target = other_file_system / "spool", tmp_path / "kept"
    source.write_bytes(b"records")
    target.write_bytes(b"the previous copy")

    with pytest.raises(StorageFailed) as raised:
        move_file(source, target, FaultyStorage(fail_fsync_at=1))

    assert f"{tmp_path}/.kept." in raised.value.message  # the copy being made beside the target
    assert source.read_bytes() == b"records"  # the spool is still there
    assert target.read_bytes() == b"the previous copy"  # and the target untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


def _bound_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))  # the socket file stays once the socket is closed


_NOT_FILES: dict[str, Callable[[Path], None]] = {
    "directory": Path.mkdir,
    "FIFO": os.mkfifo,
    "socket": _bound_socket,
}


@pytest.mark.parametrize("kind", sorted(_NOT_FILES))
def test_a_path_that_is_no_regular_file_is_refused_and_kept(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "out"
    _NOT_FILES[kind](path)
    before = os.stat(path)
    with pytest.raises(UsageError) as caught:
        file_to_replace(path, named="-o", suggestion="use -o -")
    assert kind in caught.value.message and str(path) in caught.value.message
    assert caught.value.exit_code == 2 and caught.value.suggestion == "use -o -"
    assert os.stat(path).st_ino == before.st_ino


def test_a_link_is_followed_to_the_file_it_names(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "target.html").write_text("old")
    (tmp_path / "link").symlink_to(tmp_path / "sub" / "target.html")
    assert file_to_replace(tmp_path / "link", named="-o", suggestion="") == (tmp_path / "sub" / "target.html")
    (tmp_path / "dangling").symlink_to(tmp_path / "new.html")
    assert file_to_replace(tmp_path / "dangling", named="-o", suggestion="") == tmp_path / "new.html"
    assert file_to_replace(tmp_path / "fresh", named="-o", suggestion="") == tmp_path / "fresh"


def test_a_link_to_a_fifo_and_a_loop_of_links_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to_fifo").symlink_to(tmp_path / "fifo")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for path in (tmp_path / "to_fifo", tmp_path / "a"):
        with pytest.raises(UsageError):
            file_to_replace(path, named="-o", suggestion="")
