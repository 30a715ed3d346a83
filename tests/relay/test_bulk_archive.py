"""relay/bulkjobs/archive.py alone: a result archive read as a bounded stream, nothing written to disk."""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from bulkrelay.relay.bulkjobs.archive import archive_documents
from bulkrelay.relay.bulkjobs.steps import StepRefused


def _tar(members: list[tuple[str, bytes | None]], **options: object) -> bytes:
    """A tar of these members (None: a directory), as bytes."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", **options) as tar:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _read(body: bytes, **bounds: int) -> list[object]:
    limits = {"max_members": None, "max_unpacked_bytes": None, **bounds}
    return [document for document, _ in archive_documents(body, name="results", job="j1", **limits)]


def test_json_files_are_read_in_order_names_ignored_and_nothing_written(tmp_path: Path) -> None:
    members = [("./", None), ("../../escape.json", b"[1]"), ("/abs/two.json", b'{"a": 2}')]
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert _read(_gz(_tar(members))) == [[1], {"a": 2}]
        assert _read(_tar(members)) == [[1], {"a": 2}]  # a bare tar (the transport decoded the gzip)
    finally:
        os.chdir(before)
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent.parent / "escape.json").exists()


def test_an_empty_archive_has_no_documents() -> None:
    assert _read(_gz(_tar([]))) == []


@pytest.mark.parametrize(
    ("body", "bounds", "message"),
    [
        (_gz(_tar([("big.json", b" " * 200_000 + b"[]")])), {"max_unpacked_bytes": 65536}, "65536"),
        (  # a pax header too large: refused before tarfile reads it whole
            _gz(_tar([("a.json", b"[]")], format=tarfile.PAX_FORMAT, pax_headers={"c": "x" * 300_000})),
            {"max_unpacked_bytes": 65536},
            "refused as a bomb",
        ),
        (
            _gz(_tar([(f"{n}.json", b"[]") for n in range(5)])),
            {"max_members": 4},
            "max_members (4)",
        ),
        (_gz(_tar([("a.json", b"[]")]))[:-9], {}, "not a whole tar.gz"),
        (b"\x1f\x8b" + b"\x00" * 40, {}, "not a whole tar.gz"),
        (b"", {}, "not a whole tar.gz"),
    ],
    ids=["bytes", "pax_header", "members", "cut", "not_gzip", "empty"],
)
def test_bombs_and_broken_archives_are_refused_naming_the_job(
    body: bytes, bounds: dict[str, int], message: str
) -> None:
    with pytest.raises(StepRefused, match=re.escape(message)) as refused:
        _read(body, **bounds)
    assert "job j1's archive" in str(refused.value)
