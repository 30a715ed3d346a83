"""A result set served as a gzip'd tar of JSON files (`results[].archive: tar.gz`, as Mailchimp's batches'
`response_body_url`), read as a stream with bounds, never extracted to disk.

The answer's bytes are gunzipped as they are read (an answer the transport already decoded, a bare tar,
is read as it is) and counted: more than `max_unpacked_bytes` bytes of tar, or more than `max_members`
members, is a bomb and refused before more is unpacked. A first pass reads the gzip stream to its end,
counting and discarding, so a cut or corrupt archive (its CRC) or a bomb is refused before any member is
parsed; the second parses it. Member names are ignored (nothing is written
anywhere); each regular file is one JSON document; other members (directories, links) are skipped but
counted. A cut or corrupt archive, or a member that is not JSON, cannot be read (`AnswerUnreadable`: it
is asked again, nothing guessed); a bomb is refused (`StepRefused`: the job's rows fail as
`batch_answer_invalid`).
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterator
from functools import partial
from typing import Any

import orjson

from bulkrelay.relay.bulkjobs.steps import AnswerUnreadable, StepRefused

MAX_MEMBERS = 10_000
MAX_UNPACKED_BYTES = 1 << 30
_GZIP_MAGIC = b"\x1f\x8b"


class _TooLarge(Exception):
    pass


class _Bounded:
    """A stream read through, refusing (`_TooLarge`) once more than `most` bytes have come out of it."""

    def __init__(self, inner: io.BufferedIOBase, most: int) -> None:
        self._inner = inner
        self._most = most
        self.read_so_far = 0

    def read(self, size: int = -1) -> bytes:
        # never more than one byte past the bound at once: a bomb is not unpacked whole to be measured
        left = self._most + 1 - self.read_so_far
        data = self._inner.read(left if size < 0 else min(size, left))
        self.read_so_far += len(data)
        if self.read_so_far > self._most:
            raise _TooLarge
        return data


def _unpacked(body: bytes, most: int) -> _Bounded:
    source = io.BytesIO(body)
    return _Bounded(gzip.GzipFile(fileobj=source) if body[:2] == _GZIP_MAGIC else source, most)


def archive_documents(
    body: bytes, *, name: str, job: str, max_members: int | None, max_unpacked_bytes: int | None
) -> Iterator[tuple[Any, str]]:
    """Each JSON file of the archive, parsed, with where it is (`results, archive member 3`), in the
    archive's order; StepRefused for a bomb, a cut or corrupt archive or a member that is not JSON."""
    most_members = max_members or MAX_MEMBERS
    most_bytes = max_unpacked_bytes or MAX_UNPACKED_BYTES
    try:
        for _ in iter(partial(_unpacked(body, most_bytes).read, 1 << 16), b""):
            pass  # a first pass, to the gzip stream's end: whole (its CRC and length), and not a bomb
        stream = _unpacked(body, most_bytes)
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]  # a reader
            for count, member in enumerate(tar, start=1):
                if count > most_members:
                    many = f"more than max_members ({most_members}) members"
                    raise StepRefused(name, None, f"job {job}'s archive has {many}: refused as a bomb")
                if not member.isfile():
                    continue
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else b""
                where = f"{name}, archive member {count}"
                try:
                    document = orjson.loads(data)
                except orjson.JSONDecodeError:
                    raise AnswerUnreadable(where, None, f"job {job}'s archive member is not JSON") from None
                yield document, where
    except _TooLarge:
        limit = f"more than max_unpacked_bytes ({most_bytes}) bytes"
        raise StepRefused(name, None, f"job {job}'s archive unpacks to {limit}: refused as a bomb") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise AnswerUnreadable(name, None, f"job {job}'s archive is not a whole tar.gz ({exc})") from None
