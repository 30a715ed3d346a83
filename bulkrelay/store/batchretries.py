"""`batch-retries.jsonl`: the requests a batch run sent again, so a resumed run sends them under the
same Idempotency-Key.

A request's key is derived from its items' ids, so a request of other rows has another key whatever
process sends it. Only the very rows of a request sent again (every row an answer left retryable: an
Elasticsearch item 429 for each) need a number in their key: under the first request's key, a target
that keeps keys would replay its old answer, the same 429, for ever. The number counts the requests of
exactly those rows sent before, which the journal (final results only) cannot tell, so each is written
here (and fsynced) before its request leaves:

    {"retry": 3, "rows": [7, 14]}

`rows` are the rows the request carries, in order. A resumed run whose pending rows of a batch are
exactly the rows of such a line sends them under that line's key (the latest line for those rows), so a
target that dedups by key replays what it answered, and applies nothing twice; pending rows of no line
go under their ids alone, as the crashed process sent them, or would have (a crash during an item 429's
backoff: issue 38). So a key depends on the rows and the answers they got, never on the process: the
identical re-run of the job (a new run, a full job's keys being its content's, docs/resume.md) gets its
predecessor's answers replayed and sends the same requests under the same keys. A line cut by a crash
is passed over: its request never left.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import orjson

from bulkrelay.private import open_private
from bulkrelay.store.storage import Storage

RETRIES_FILE = "batch-retries.jsonl"


class BatchRetries:
    """The run's requests of the same rows sent again: earlier processes' to reuse, and this one's."""

    def __init__(self, path: Path, storage: Storage) -> None:
        self._path = path
        self._storage = storage
        self._earlier: dict[tuple[int, ...], int] = {}  # rows -> the latest number an earlier process gave
        found, self._cut = _read(path)  # _cut: the file ends inside a line a crash cut
        for number, rows in found:
            self._earlier[rows] = number

    def earlier(self, rows: Sequence[int]) -> int | None:
        """The number an earlier process sent these rows under, once: this process's next request of the
        same rows is a new one (its answer is not that request's)."""
        return self._earlier.pop(tuple(rows), None)

    async def record(self, rows: Sequence[int], number: int) -> None:
        """`number` for a request of `rows`, durable before this returns (before it leaves)."""
        line = orjson.dumps({"retry": number, "rows": list(rows)}) + b"\n"
        if self._cut:  # end the cut line first, or the first new line would join it and be lost
            line, self._cut = b"\n" + line, False
        await anyio.to_thread.run_sync(self._append, line)

    def _append(self, line: bytes) -> None:
        storage, created = self._storage, not self._path.exists()
        fd = storage.open_append(self._path)
        try:
            storage.write(fd, line)
            storage.fsync(fd)
        finally:
            storage.close(fd)
        if created:
            storage.fsync_dir(self._path.parent)  # the new file's name survives a power loss too


def _read(path: Path) -> tuple[list[tuple[int, tuple[int, ...]]], bool]:
    """The whole lines of the file, in order ((number, rows)), none when it does not exist; and whether
    it ends inside a line."""
    try:
        with open(path, "rb", opener=open_private) as stream:  # a link there is refused: RUN_DIR_UNSAFE
            data = stream.read()
    except FileNotFoundError:
        return [], False
    found = []
    for line in data.split(b"\n"):
        try:
            entry = orjson.loads(line)
            number, rows = entry["retry"], tuple(entry["rows"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # the end of a line a crash cut (or an empty line): that request never left
        if isinstance(number, int) and all(isinstance(row, int) for row in rows):
            found.append((number, rows))
    return found, not data.endswith(b"\n") and bool(data)
