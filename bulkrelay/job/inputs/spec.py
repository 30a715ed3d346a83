"""What an input is: its spec (path, format, gzip, delimiter), the fingerprint and identity of what was
read, the region digests the relay checks again, and the error of an input that changed."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from bulkrelay.errors import InputChanged, Problem, UsageError
from bulkrelay.job.inputs.rowstarts import RowStarts

InputFormat = Literal["csv", "jsonl", "parquet"]  # parquet: read through a JSON Lines snapshot
ProblemSink = Callable[[Problem], None]

STDIN_NAME = "<stdin>"  # what messages call records read from standard input (never the spool's path)

_DECLARED_FORMATS: dict[str, InputFormat] = {
    "csv": "csv",
    "jsonl": "jsonl",
    "ndjson": "jsonl",
    "parquet": "parquet",
}
_EXTENSIONS: dict[str, InputFormat] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
# The relay checks the raw input a region of this many bytes at a time against preflight's digest of
# it, before any byte of the region reaches a record: 32 bytes of digest a MiB, so memory stays flat.
REGION_SIZE = 1 << 20
RESTORE = "restore the input as preflight read it, or start a new run"


def detect_format(path_name: str, declared: str | None) -> tuple[InputFormat, bool]:
    """The format and gzip flag of an input: a declared format wins, else the file extension decides."""
    suffixes = [s.lower() for s in Path(path_name).suffixes]
    gzipped = bool(suffixes) and suffixes[-1] == ".gz"
    if declared is not None:
        fmt = _DECLARED_FORMATS.get(declared.lower())
        if fmt is None:
            raise UsageError(
                f"unknown input format {declared!r} for {path_name}",
                context={"file": path_name, "format": declared},
                suggestion="use one of: csv, jsonl, ndjson, parquet",
            )
        return fmt, gzipped
    data_suffix = suffixes[-2] if gzipped and len(suffixes) >= 2 else (suffixes[-1] if suffixes else "")
    fmt = _EXTENSIONS.get(data_suffix) if not gzipped or len(suffixes) >= 2 else None
    if fmt is None:
        raise UsageError(
            f"cannot tell the format of {path_name} from its name",
            context={"file": path_name},
            suggestion="name it .csv, .jsonl or .ndjson (optionally .gz) or .parquet, or set input.format",
        )
    return fmt, gzipped


PARQUET_SOURCE = "parquet "  # how a Parquet file's source begins (job/inputs/parquet.py)


@dataclass(frozen=True)
class InputSpec:
    """Where an input is and how to read it. `name` is what problems call the file (STDIN_NAME)."""

    path: Path
    format: InputFormat
    gzip: bool
    delimiter: str = ","
    name: str | None = None
    # A snapshot's source (a query's database, without credentials): its records all have the same
    # fields, as a CSV header's. None: the file is the input itself.
    source: str | None = None

    def __post_init__(self) -> None:
        if len(self.delimiter) != 1 or self.delimiter in '\r\n"':
            raise UsageError(
                f"the CSV delimiter must be one character other than a quote or newline, "
                f"got {self.delimiter!r}",
                context={"delimiter": self.delimiter},
            )

    @classmethod
    def detect(cls, path: Path, declared: str | None = None, delimiter: str = ",") -> InputSpec:
        """A spec whose format and gzip flag come from `detect_format`."""
        fmt, gzipped = detect_format(str(path), declared)
        return cls(path=path, format=fmt, gzip=gzipped, delimiter=delimiter)

    @property
    def query_answer(self) -> bool:
        """The snapshot of a query's answer (its source names a database, not a Parquet file's bytes)."""
        return self.source is not None and not self.source.startswith(PARQUET_SOURCE)

    @property
    def shown_format(self) -> str:
        """What the input is, as `validate` and the report name it (see `shown_format`)."""
        return shown_format(self.format, self.source)

    @property
    def display_name(self) -> str:
        return self.name if self.name is not None else str(self.path)


@dataclass(frozen=True)
class InputFingerprint:
    """What identifies an input: format, gzip flag, sha256 and size of the raw bytes, record count."""

    format: str
    gzip: bool
    sha256: str
    size: int
    record_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "gzip": self.gzip,
            "sha256": self.sha256,
            "size": self.size,
            "record_count": self.record_count,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputFingerprint:
        """Rebuild from `to_dict()` output; raises ValueError naming the first missing or mistyped key."""
        expected: dict[str, type] = {
            "format": str,
            "gzip": bool,
            "sha256": str,
            "size": int,
            "record_count": int,
        }
        for key, kind in expected.items():
            value = data.get(key)
            # bool is an int subclass: refuse it where a count is expected.
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"input fingerprint: {key!r} must be {kind.__name__}, got {value!r}")
        return cls(
            format=data["format"],
            gzip=data["gzip"],
            sha256=data["sha256"],
            size=data["size"],
            record_count=data["record_count"],
        )


@dataclass(frozen=True)
class InputIdentity:
    """Which file a reader read, and in which state: device and inode, size, modification time."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, fd: int) -> InputIdentity:
        return cls._of_stat(os.fstat(fd))

    @classmethod
    def of_path(cls, path: Path) -> InputIdentity:
        return cls._of_stat(os.stat(path))

    @classmethod
    def _of_stat(cls, st: os.stat_result) -> InputIdentity:
        return cls(device=st.st_dev, inode=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns)

    def differences(self, now: InputIdentity) -> dict[str, dict[str, int]]:
        """`{field: {"recorded": ..., "now": ...}}` for each field that differs, as resume names them."""
        return changed_values(asdict(self), asdict(now))


@dataclass(frozen=True)
class RegionDigests:
    """The SHA-256 of each REGION_SIZE-byte region of an input's raw bytes (the compressed bytes of a
    .gz), in file order; the last region may be shorter. SHA-256 because it is the cheapest sound hash
    here: the CPU computes it (SHA-NI), about twice as fast as blake2b on 1 MiB blocks."""

    digests: bytes

    def of(self, index: int) -> bytes | None:
        """The digest of region `index` (None: the file preflight read had no such region)."""
        return nth_digest(self.digests, index)


_REGION_DIGEST_SIZE = hashlib.sha256().digest_size


def nth_digest(digests: bytes | bytearray, index: int) -> bytes | None:
    """The `index`th SHA-256 digest in a run of them (None: past their end)."""
    return bytes(digests[index * _REGION_DIGEST_SIZE : (index + 1) * _REGION_DIGEST_SIZE]) or None


@dataclass(frozen=True)
class ExpectedInput:
    """What preflight read, which the relay must read again byte for byte; and where its rows start
    (job/inputs/rowstarts.py: a worker process parses its own rows only)."""

    fingerprint: InputFingerprint
    identity: InputIdentity
    regions: RegionDigests
    row_starts: RowStarts | None = None


def changed_values(was: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`{name: {"recorded": ..., "now": ...}}` for each of `was`'s values that `now` does not share."""
    return {name: {"recorded": value, "now": now[name]} for name, value in was.items() if value != now[name]}


def input_changed(file: str, when: str, changed: Mapping[str, Any]) -> InputChanged:
    what = ", ".join(f"{name} {v['recorded']!r} -> {v['now']!r}" for name, v in changed.items())
    return InputChanged(
        f"{file} changed {when}: {what}",
        context={"file": file, "changed": dict(changed)},
        suggestion=RESTORE,
    )


def no_records(file: str) -> Problem:
    """The problem of an input that holds no record at all."""
    return Problem("input has no records", file=file)


def shown_format(format: str, source: str | None) -> str:
    """What an input is, for people: `parquet` or `query` for a snapshot's rows (read as JSON Lines,
    which `format` says), else the file's own format."""
    if source is None:
        return format
    return "parquet" if source.startswith(PARQUET_SOURCE) else "query"
